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
