package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

type oneKey struct{}

func (oneKey) Lookup(secret string) (apikey.Key, error) {
	if secret != "good" {
		return apikey.Key{}, fmt.Errorf("no such key: %w", errdefs.ErrUnauthenticated)
	}
	return apikey.Key{ID: "key_1", Project: store.Project{ID: "p1", Slug: "default", Name: "default"}}, nil
}

type fakeTemplates []template.Template

func (f fakeTemplates) ListFor(project string) ([]template.Template, error) {
	if project != "p1" {
		return nil, fmt.Errorf("listed for project %q, want the caller's", project)
	}
	return f, nil
}
func (fakeTemplates) Builtins() []string { return []string{"base", "node", "python"} }
func (fakeTemplates) Delete(context.Context, string, string) error {
	return fmt.Errorf("not in this test: %w", errdefs.ErrInvalid)
}

func TestListTemplates(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := Handler(Config{Keys: oneKey{}, Templates: fakeTemplates{
		{Name: "base", Version: "bookworm-1", SizeBytes: 10, BuiltAt: at},
		{Name: "python", Version: "bookworm-2", SizeBytes: 20, BuiltAt: at, Aliases: []string{"python312"},
			Versions: map[string]string{"python": "3.11.2"}},
	}})

	get := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/api/templates", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := get(""); w.Code != http.StatusUnauthorized {
		t.Errorf("without a key: %d %s", w.Code, w.Body)
	}
	w := get("good")
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var got []map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"name": "base", "aliases": []any{}, "version": "bookworm-1", "versions": map[string]any{},
			"sizeBytes": 10.0, "builtAt": "2026-01-02T03:04:05Z", "status": "ready"},
		{"name": "node", "aliases": []any{"node22"}, "version": "", "versions": map[string]any{},
			"sizeBytes": 0.0, "builtAt": nil, "status": "not_built"},
		{"name": "python", "aliases": []any{"python312"}, "version": "bookworm-2", "versions": map[string]any{"python": "3.11.2"},
			"sizeBytes": 20.0, "builtAt": "2026-01-02T03:04:05Z", "status": "ready"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}
