package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// testTemplateVersions: published template versions, per project and name;
// a put replaces the record, another handle sees it, a delete removes it.
func testTemplateVersions(t *testing.T, ctx context.Context, open func() store.Store) {
	st, ok := open().(store.TemplateVersions)
	if !ok {
		t.Fatalf("the backend does not implement store.TemplateVersions")
	}
	other := open().(store.TemplateVersions)
	if _, err := st.TemplateVersion(ctx, "prj_a", "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("TemplateVersion of nothing: %v, want ErrNotFound", err)
	}
	if l, err := st.TemplateVersions(ctx, "prj_a"); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("TemplateVersions of nothing: %v %v, want []", l, err)
	}
	d1 := "sha256:" + hex64('1')
	d2 := "sha256:" + hex64('2')
	web := store.TemplateVersion{ProjectID: "prj_a", Name: "web", Digest: d1, Info: json.RawMessage(`{"name":"web","sizeBytes":12}`), Node: "a", UpdatedAt: ts(1)}
	for _, v := range []store.TemplateVersion{
		web,
		{ProjectID: "prj_a", Name: "api", Digest: d2, Node: "b", UpdatedAt: ts(2)},
		{ProjectID: "prj_b", Name: "web", Digest: d2, Node: "b", UpdatedAt: ts(3)},
		{ProjectID: "", Name: "base", Digest: d1, Node: "c", UpdatedAt: ts(4)},
	} {
		if err := st.PutTemplateVersion(ctx, v); err != nil {
			t.Fatalf("PutTemplateVersion %s/%s: %v", v.ProjectID, v.Name, err)
		}
	}
	got, err := other.TemplateVersion(ctx, "prj_a", "web")
	if err != nil {
		t.Fatal(err)
	}
	if !sameTemplateVersion(got, web) {
		t.Fatalf("TemplateVersion through another handle: %+v, want %+v", got, web)
	}
	l, err := other.TemplateVersions(ctx, "prj_a")
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 2 || l[0].Name != "api" || l[1].Name != "web" || string(l[0].Info) != "{}" {
		t.Fatalf("TemplateVersions of prj_a: %+v, want api (info {}) then web", l)
	}
	if b, err := other.TemplateVersion(ctx, "", "base"); err != nil || b.Digest != d1 || b.Node != "c" {
		t.Fatalf("built-in record: %+v %v", b, err)
	}
	// A new build of web on another node replaces the record.
	web2 := store.TemplateVersion{ProjectID: "prj_a", Name: "web", Digest: d2, Info: json.RawMessage(`{"name":"web","sizeBytes":13}`), Node: "c", UpdatedAt: ts(5)}
	if err := other.PutTemplateVersion(ctx, web2); err != nil {
		t.Fatal(err)
	}
	if got, err := st.TemplateVersion(ctx, "prj_a", "web"); err != nil || !sameTemplateVersion(got, web2) {
		t.Fatalf("after a second put: %+v %v, want %+v", got, err, web2)
	}
	if err := st.DeleteTemplateVersion(ctx, "prj_a", "web"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteTemplateVersion(ctx, "prj_a", "web"); err != nil {
		t.Fatalf("delete of a missing record: %v", err)
	}
	if _, err := other.TemplateVersion(ctx, "prj_a", "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v, want ErrNotFound", err)
	}
	if got, err := other.TemplateVersion(ctx, "prj_b", "web"); err != nil || got.Digest != d2 {
		t.Fatalf("another project's template of the same name after the delete: %+v %v", got, err)
	}
}

func hex64(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

func sameTemplateVersion(a, b store.TemplateVersion) bool {
	var ia, ib any
	if json.Unmarshal(a.Info, &ia) != nil || json.Unmarshal(b.Info, &ib) != nil {
		return false
	}
	a.Info, b.Info = nil, nil
	return reflect.DeepEqual(ia, ib) && a.UpdatedAt.Equal(b.UpdatedAt) && a.ProjectID == b.ProjectID && a.Name == b.Name && a.Digest == b.Digest && a.Node == b.Node
}

// testTemplateTags: tags name builds per project and template; a new
// assignment moves a tag, another handle sees it, deletes remove some or
// all.
func testTemplateTags(t *testing.T, ctx context.Context, open func() store.Store) {
	st, ok := open().(store.TemplateTags)
	if !ok {
		t.Fatalf("the backend does not implement store.TemplateTags")
	}
	other := open().(store.TemplateTags)
	if l, err := st.TemplateTags(ctx, "prj_a", "web"); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("TemplateTags of nothing: %v %v, want []", l, err)
	}
	tagsOf := func(s store.TemplateTags, project, tpl string) map[string]string {
		t.Helper()
		l, err := s.TemplateTags(ctx, project, tpl)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for i, tg := range l {
			if tg.ProjectID != project || tg.Template != tpl || tg.CreatedAt.IsZero() {
				t.Fatalf("tag %+v of %s/%s", tg, project, tpl)
			}
			if i > 0 && l[i-1].Tag >= tg.Tag {
				t.Fatalf("tags not by tag: %+v", l)
			}
			out[tg.Tag] = tg.BuildID
		}
		return out
	}
	if err := st.AssignTemplateTags(ctx, "prj_a", "web", "b1", []string{"default", "v1", "v1.0-rc_1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.AssignTemplateTags(ctx, "prj_b", "web", "b9", []string{"default"}); err != nil {
		t.Fatal(err)
	}
	if err := st.AssignTemplateTags(ctx, "prj_a", "api", "b5", []string{"default"}); err != nil {
		t.Fatal(err)
	}
	if got, want := tagsOf(other, "prj_a", "web"), map[string]string{"default": "b1", "v1": "b1", "v1.0-rc_1": "b1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("tags: %v, want %v", got, want)
	}
	// A second build takes the default tag; v1 stays where it was.
	if err := other.AssignTemplateTags(ctx, "prj_a", "web", "b2", []string{"default", "prod"}); err != nil {
		t.Fatal(err)
	}
	if got, want := tagsOf(st, "prj_a", "web"), map[string]string{"default": "b2", "v1": "b1", "v1.0-rc_1": "b1", "prod": "b2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("tags after a second assignment: %v, want %v", got, want)
	}
	if err := st.DeleteTemplateTags(ctx, "prj_a", "web", []string{"v1", "missing"}); err != nil {
		t.Fatal(err)
	}
	if got, want := tagsOf(other, "prj_a", "web"), map[string]string{"default": "b2", "v1.0-rc_1": "b1", "prod": "b2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("tags after a delete: %v, want %v", got, want)
	}
	if err := st.DeleteTemplateTags(ctx, "prj_a", "web", nil); err != nil {
		t.Fatal(err)
	}
	if got := tagsOf(other, "prj_a", "web"); len(got) != 0 {
		t.Fatalf("tags after deleting all: %v", got)
	}
	if got, want := tagsOf(other, "prj_b", "web"), map[string]string{"default": "b9"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("another project's tags: %v, want %v", got, want)
	}
	if got, want := tagsOf(other, "prj_a", "api"), map[string]string{"default": "b5"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("another template's tags: %v, want %v", got, want)
	}
}
