package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// post sends body to path with the fuzz handler's key.
func post(t *testing.T, h http.Handler, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("X-API-Key", fuzzKey)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func manyKeys(n int) string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestCreateValidation: a create's fields are checked before anything is
// looked up, each refusal a 400 naming the field.
func TestCreateValidation(t *testing.T) {
	h := newFuzzHandler(t)
	tests := []struct {
		body    string
		status  int
		mention string
	}{
		{`{"template":"base","metadata":` + manyKeys(10000) + `}`, 400, "metadata: 10000 keys, at most 64"},
		{`{"template":"base","metadata":{"` + strings.Repeat("k", 300) + `":"v"}}`, 400, "300 bytes, at most 256"},
		{`{"template":"base","metadata":{"k":"` + strings.Repeat("v", 3000) + `"}}`, 400, `metadata[\"k\"]: the value is 3000 bytes, at most 2048`},
		{`{"snapshotId":"snap_x","metadata":` + manyKeys(65) + `}`, 400, "metadata: 65 keys"},
		{`{"template":"base","envs":{"A=B":"x"}}`, 400, "envs"},
		{`{"template":"base","envs":{"A":"` + strings.Repeat("v", 70000) + `"}}`, 400, "at most 65536"},
		{`{"template":"base","metadata":` + manyKeys(64) + `}`, 404, "base"},
		{`{"template":"base","region":"us-east-1"}`, 404, "base"},
		{`{"template":"base","environment":"staging"}`, 400, `environment \"staging\": unknown`},
		{`{"template":"base","environment":"staging"}`, 400, `"code":"unknown_environment"`},
		{`{"snapshotId":"snap_x","environment":"prod"}`, 400, "environment"},
		{`{"template":"base","environment":7}`, 400, "environment"},
		{`{"template":"base","environment":"default"}`, 404, "base"},
		{`{"template":"base","environment":""}`, 404, "base"},
	}
	for _, tt := range tests {
		w := post(t, h, "/api/sandboxes", tt.body)
		if w.Code != tt.status || !strings.Contains(w.Body.String(), tt.mention) {
			t.Errorf("POST /api/sandboxes %.80s: %d %.300s, want %d mentioning %q", tt.body, w.Code, w.Body, tt.status, tt.mention)
		}
	}
}
