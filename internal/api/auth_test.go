package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/ratelimit"
)

// TestRateLimit: over its key's limit a request is a 429 rate_limited with
// Retry-After, naming the limit; a bad key is refused before the limit.
func TestRateLimit(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim := ratelimit.New(0.5, 2, 0, func() time.Time { return now })
	h := Handler(Config{Keys: oneKey{}, Limiter: lim, Templates: fakeTemplates{}})
	get := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/api/templates", nil)
		req.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	for i := range 2 {
		if w := get("good"); w.Code != 200 {
			t.Fatalf("request %d of the burst: %d %s", i, w.Code, w.Body)
		}
	}
	if w := get("bad-key-0123456789"); w.Code != 401 {
		t.Fatalf("bad key: %d", w.Code)
	}
	w := get("good")
	var body errorBody
	json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != http.StatusTooManyRequests || body.Code != "rate_limited" || w.Header().Get("Retry-After") != "2" ||
		!strings.Contains(body.Message, "0.5 requests/s per API key with bursts of 2") {
		t.Fatalf("over the limit: %d %v %s", w.Code, w.Header(), w.Body)
	}
	now = now.Add(2 * time.Second)
	if w := get("good"); w.Code != 200 {
		t.Fatalf("after Retry-After: %d %s", w.Code, w.Body)
	}
}
