package e2b

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestSecrets: E2B's /secrets and the Lizard API's
// /api/projects/{pid}/secrets over one service: create, pages by
// X-Next-Token, get by id or name, update to the next version, delete; no
// answer and no log line (debug level, refusals included) ever holds a
// value; another project sees nothing.
func TestSecrets(t *testing.T) {
	var logs bytes.Buffer
	h := newTestHandlerLog(t, nil, &logs)
	const v1, v2 = "sk-live-AAAA1111", "sk-live-BBBB2222"
	values := []string{v1, v2}
	w := send(h, testKey, "POST", "/secrets", `{"name":"OpenAI","value":"`+v1+`","metadata":{"team":"ml"}}`)
	var created secret
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &created) != nil {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	if created.Name != "openai" || created.CurrentVersion != 1 || !strings.HasPrefix(created.SecretID, "sec_") || created.Metadata["team"] != "ml" || created.CreatedAt == "" {
		t.Fatalf("created: %+v", created)
	}
	if w := send(h, testKey, "POST", "/secrets", `{"name":"openai","value":"x"}`); w.Code != http.StatusConflict {
		t.Fatalf("the same name again: %d %s", w.Code, w.Body)
	}
	for i := range 4 {
		v := fmt.Sprintf("value-%d-secret", i)
		values = append(values, v)
		if w := send(h, testKey, "POST", "/api/projects/default/secrets", fmt.Sprintf(`{"name":"s%d","value":"%s"}`, i, v)); w.Code != http.StatusCreated {
			t.Fatalf("Lizard create: %d %s", w.Code, w.Body)
		}
	}
	// Pages of 2: s0 s1 | s2 s3 | openai.
	var names []string
	next := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("the pages do not end")
		}
		w := send(h, testKey, "GET", "/secrets?limit=2&nextToken="+next, "")
		var page []secret
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &page) != nil {
			t.Fatalf("list: %d %s", w.Code, w.Body)
		}
		for _, s := range page {
			names = append(names, s.Name)
		}
		next = w.Header().Get("X-Next-Token")
		if next == "" {
			break
		}
	}
	if fmt.Sprint(names) != "[openai s0 s1 s2 s3]" {
		t.Fatalf("listed %v", names)
	}
	for _, ref := range []string{created.SecretID, "openai", "OPENAI"} {
		w := send(h, testKey, "GET", "/secrets/"+ref, "")
		if w.Code != 200 || !strings.Contains(w.Body.String(), created.SecretID) {
			t.Fatalf("get %s: %d %s", ref, w.Code, w.Body)
		}
	}
	w = send(h, testKey, "POST", "/secrets/openai", `{"value":"`+v2+`"}`)
	var updated secret
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &updated) != nil || updated.CurrentVersion != 2 || updated.Metadata["team"] != "ml" {
		t.Fatalf("update: %d %s", w.Code, w.Body)
	}
	w = send(h, testKey, "PATCH", "/api/projects/default/secrets/"+created.SecretID, `{"value":"`+v1+`","metadata":{}}`)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"version":3`) || !strings.Contains(w.Body.String(), `"metadata":{}`) {
		t.Fatalf("Lizard update: %d %s", w.Code, w.Body)
	}
	// Another project: nothing, on either API.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/secrets/" + created.SecretID, ""}, {"GET", "/secrets/openai", ""}, {"POST", "/secrets/openai", `{"value":"x"}`},
		{"DELETE", "/secrets/openai", ""}, {"GET", "/api/projects/other/secrets/openai", ""}, {"GET", "/api/projects/default/secrets", ""},
	} {
		if w := send(h, otherKey, c.method, c.path, c.body); w.Code != http.StatusNotFound {
			t.Fatalf("another project's %s %s: %d %s", c.method, c.path, w.Code, w.Body)
		}
	}
	if w := send(h, otherKey, "GET", "/secrets", ""); w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" {
		t.Fatalf("another project's list: %d %s", w.Code, w.Body)
	}
	// Refusals that carry a value.
	for _, body := range []string{`{"name":"bad name","value":"` + v2 + `"}`, `{"name":"x","value":"` + v2 + `\n"}`, `{"name":"x","value":"` + v2 + `"`, `{"name":"x","value":"` + v2 + `" garbage}`} {
		if w := send(h, testKey, "POST", "/secrets", body); w.Code != http.StatusBadRequest || strings.Contains(w.Body.String(), v2) {
			t.Fatalf("a bad create: %d %s", w.Code, w.Body)
		}
	}
	if w := send(h, testKey, "DELETE", "/secrets/openai", ""); w.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	if w := send(h, testKey, "DELETE", "/api/projects/default/secrets/openai", ""); w.Code != http.StatusNotFound {
		t.Fatalf("a second delete: %d %s", w.Code, w.Body)
	}
	if !strings.Contains(logs.String(), "route=\"POST /secrets\"") {
		t.Fatalf("the request log did not log the requests:\n%s", logs.String())
	}
	for _, v := range values {
		if strings.Contains(logs.String(), v) {
			t.Fatalf("the log holds a secret value %q:\n%s", v, logs.String())
		}
	}
}
