package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/volume"
	"github.com/lizard-build/lizard/internal/volume/content"
)

func TestBearerToken(t *testing.T) {
	tok := bearerToken("prj_ab.c", volume.Volume{Token: "s3cret"})
	p, secret, ok := parseBearer(tok)
	if !ok || p != "prj_ab.c" || secret != "s3cret" {
		t.Fatalf("parseBearer(%q) = %q %q %v", tok, p, secret, ok)
	}
	for _, bad := range []string{"", "s3cret", "lzvol.", "lzvol.cHJq", "lzvol..s3cret", "lzvol.!!!.s3cret", "Bearer " + tok} {
		if _, _, ok := parseBearer(bad); ok {
			t.Errorf("parseBearer(%q) accepted", bad)
		}
	}
}

// contentSend sends a volume content request with token tok.
func contentSend(h http.Handler, tok, method, target, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestVolumeContent: E2B's volume API over a real volume no sandbox holds:
// create, the token that admits its files and only them, each file
// operation with E2B's statuses, errors in the content API's shape
// (a string code), get, list and delete.
func TestVolumeContent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: volumes are loop-mounted ext4 images")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed")
	}
	h := newTestHandler(t)
	create := func(name string) volumeInfo {
		t.Helper()
		w := send(h, testKey, "POST", "/volumes", `{"name":"`+name+`"}`)
		var v volumeInfo
		if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &v) != nil || v.Name != name || v.Token == "" || v.VolumeID == "" {
			t.Fatalf("create %s: %d %s", name, w.Code, w.Body)
		}
		t.Cleanup(func() { send(h, testKey, "DELETE", "/volumes/"+v.VolumeID, "") })
		return v
	}
	a, b := create("vol-a"), create("vol-b")
	if w := send(h, testKey, "POST", "/volumes", `{"name":"vol-a"}`); w.Code != 409 {
		t.Fatalf("a second vol-a: %d %s", w.Code, w.Body)
	}
	base := "/volumecontent/" + a.VolumeID
	type step struct {
		tok, method, target, body string
		status                    int
		mention                   string
	}
	for _, s := range []step{
		{"", "GET", base + "/path?path=/", "", 401, "volume token"},
		{b.Token, "GET", base + "/path?path=/", "", 401, "volume token"},
		{"lzvol.x.y", "GET", base + "/path?path=/", "", 401, "volume token"},
		{testKey, "GET", base + "/path?path=/", "", 401, "volume token"},
		{a.Token, "GET", base + "/path?path=/", "", 200, `"type":"directory"`},
		{a.Token, "GET", base + "/path", "", 400, "path: required"},
		{a.Token, "PUT", base + "/file?path=/d/f.txt", "x", 404, `"code":"404"`},
		{a.Token, "POST", base + "/dir?path=/d/e&force=true&mode=448", "", 201, `"mode":448`},
		{a.Token, "POST", base + "/dir?path=/d/e", "", 409, "exists"},
		{a.Token, "POST", base + "/dir?path=/d/e&mode=x", "", 400, "mode"},
		{a.Token, "PUT", base + "/file?path=/d/f.txt", "hello", 201, `"size":5`},
		{a.Token, "PUT", base + "/file?path=/d/f.txt", "again", 409, "exists"},
		{a.Token, "PUT", base + "/file?path=/d/f.txt&force=true&uid=1001&gid=1002", "hello!", 201, `"uid":1001,"gid":1002`},
		{a.Token, "PUT", base + "/file?path=/d/f.txt&force=maybe", "x", 400, "force"},
		{a.Token, "PUT", base + "/file?path=/d/e&force=true", "x", 409, "directory"},
		{a.Token, "GET", base + "/file?path=d/f.txt", "", 200, "hello!"},
		{a.Token, "GET", base + "/file?path=/d", "", 404, "not a file"},
		{a.Token, "GET", base + "/dir?path=/&depth=2", "", 200, `"path":"/d/f.txt"`},
		{a.Token, "GET", base + "/dir?path=/&depth=0", "", 400, "depth"},
		{a.Token, "GET", base + "/dir?path=/nope", "", 404, "not found"},
		{a.Token, "PATCH", base + "/path?path=/d/f.txt", `{"mode":384}`, 200, `"mode":384`},
		{a.Token, "PATCH", base + "/path?path=/nope", `{"mode":384}`, 404, "not found"},
		{a.Token, "PATCH", base + "/path?path=/d/f.txt", `{"mode":"rw"}`, 400, "mode"},
		{a.Token, "DELETE", base + "/path?path=/", "", 400, "root"},
		{a.Token, "DELETE", base + "/path?path=/d", "", 204, ""},
		{a.Token, "GET", base + "/path?path=/d", "", 404, "not found"},
		{a.Token, "DELETE", base + "/path?path=/d", "", 404, "not found"},
		// The other volume is untouched by all this.
		{b.Token, "GET", "/volumecontent/" + b.VolumeID + "/dir?path=/", "", 200, "[]"},
	} {
		w := contentSend(h, s.tok, s.method, s.target, s.body)
		if w.Code != s.status || !strings.Contains(w.Body.String(), s.mention) {
			t.Errorf("%s %s: %d %s, want %d mentioning %q", s.method, s.target, w.Code, w.Body, s.status, s.mention)
		}
		if w.Code >= 400 {
			var e contentError
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code == "" {
				t.Errorf("%s %s: error %s is not the content API's shape", s.method, s.target, w.Body)
			}
		}
	}
	// GET /volumes/{id} gives the same token; the list has no tokens.
	w := send(h, testKey, "GET", "/volumes/"+a.VolumeID, "")
	var got volumeInfo
	if json.Unmarshal(w.Body.Bytes(), &got); w.Code != 200 || got.Token != a.Token || got.Name != "vol-a" {
		t.Fatalf("get: %d %s", w.Code, w.Body)
	}
	w = send(h, testKey, "GET", "/volumes", "")
	var list []volumeInfo
	if json.Unmarshal(w.Body.Bytes(), &list); w.Code != 200 || len(list) != 2 || list[0].Token != "" || strings.Contains(w.Body.String(), "token") {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	if w := send(h, testKey, "DELETE", "/volumes/"+b.VolumeID, ""); w.Code != 204 {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	if w := contentSend(h, b.Token, "GET", "/volumecontent/"+b.VolumeID+"/path?path=/", ""); w.Code != 401 {
		t.Fatalf("the token of a deleted volume: %d %s", w.Code, w.Body)
	}
	if w := send(h, testKey, "DELETE", "/volumes/"+b.VolumeID, ""); w.Code != 404 {
		t.Fatalf("delete again: %d %s", w.Code, w.Body)
	}
	// An entry's mode, owner and times are there, as the SDK reads them.
	w = contentSend(h, a.Token, "PUT", base+"/file?path=/m.txt", "m")
	var e content.Entry
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Mode != content.DefaultFileMode || e.UID != content.DefaultUID || e.Mtime.IsZero() {
		t.Fatalf("entry %s", w.Body)
	}
}
