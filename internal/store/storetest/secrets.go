package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// testSecrets: a project's secrets by id and name, pages by name, updates
// at the next version (metadata kept unless given), deletes, and another
// project's secret never found; the rotation's compare-and-swap.
func testSecrets(t *testing.T, ctx context.Context, open func() store.Store) {
	st, ok := open().(store.Secrets)
	if !ok {
		t.Fatalf("the backend does not implement store.Secrets")
	}
	other := open().(store.Secrets)
	projects := open()
	p, err := projects.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	q, err := projects.CreateProject(ctx, "q", "")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := st.SecretsAfter(ctx, p.ID, "", 10); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("SecretsAfter of nothing: %v %v, want []", l, err)
	}
	before := time.Now().Add(-time.Minute)
	tok, err := st.InsertSecret(ctx, store.Secret{ID: "sec_1", ProjectID: p.ID, Name: "tok", Value: []byte("sealed-1"), Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Version != 1 || tok.CreatedAt.Before(before) || !tok.UpdatedAt.Equal(tok.CreatedAt) || tok.Metadata["team"] != "a" {
		t.Fatalf("inserted: %+v", tok)
	}
	if _, err := st.InsertSecret(ctx, store.Secret{ID: "sec_2", ProjectID: p.ID, Name: "tok", Value: []byte("x")}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a name the project has: %v, want ErrConflict", err)
	}
	if _, err := st.InsertSecret(ctx, store.Secret{ID: "sec_3", ProjectID: "prj_none", Name: "a", Value: []byte("x")}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown project: %v, want ErrNotFound", err)
	}
	// The same name in another project is another secret.
	if _, err := st.InsertSecret(ctx, store.Secret{ID: "sec_q", ProjectID: q.ID, Name: "tok", Value: []byte("sealed-q")}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b", "a", "c"} {
		if _, err := st.InsertSecret(ctx, store.Secret{ID: "sec_" + name, ProjectID: p.ID, Name: name, Value: []byte("v" + name)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := other.SecretByName(ctx, p.ID, "tok")
	if err != nil || got.ID != "sec_1" || !bytes.Equal(got.Value, []byte("sealed-1")) || !maps.Equal(got.Metadata, tok.Metadata) || !got.CreatedAt.Equal(tok.CreatedAt) {
		t.Fatalf("SecretByName through another handle: %+v %v", got, err)
	}
	if got, err := other.SecretByID(ctx, p.ID, "sec_a"); err != nil || got.Name != "a" || got.Metadata == nil || len(got.Metadata) != 0 {
		t.Fatalf("SecretByID: %+v %v (metadata must be empty, not nil)", got, err)
	}
	for _, c := range []struct{ project, id, name string }{{q.ID, "sec_1", ""}, {p.ID, "sec_q", ""}, {p.ID, "", "nope"}} {
		var err error
		if c.id != "" {
			_, err = st.SecretByID(ctx, c.project, c.id)
		} else {
			_, err = st.SecretByName(ctx, c.project, c.name)
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("%+v: %v, want ErrNotFound", c, err)
		}
	}
	var names []string
	for after := ""; ; {
		page, err := other.SecretsAfter(ctx, p.ID, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			names = append(names, s.Name)
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].Name
	}
	if fmt.Sprint(names) != "[a b c tok]" {
		t.Fatalf("pages of p's secrets: %v, want [a b c tok]", names)
	}

	// An update: the next version, metadata kept when not given.
	up, err := other.UpdateSecret(ctx, p.ID, "sec_1", []byte("sealed-2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if up.Version != 2 || !bytes.Equal(up.Value, []byte("sealed-2")) || up.Metadata["team"] != "a" || up.UpdatedAt.Before(up.CreatedAt) || !up.CreatedAt.Equal(tok.CreatedAt) {
		t.Fatalf("after an update: %+v", up)
	}
	up, err = st.UpdateSecret(ctx, p.ID, "sec_1", []byte("sealed-3"), map[string]string{})
	if err != nil || up.Version != 3 || len(up.Metadata) != 0 {
		t.Fatalf("an update clearing metadata: %+v %v", up, err)
	}
	if _, err := st.UpdateSecret(ctx, q.ID, "sec_1", []byte("x"), nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an update through another project: %v, want ErrNotFound", err)
	}
	if got, _ := st.SecretByID(ctx, q.ID, "sec_q"); got.Version != 1 || !bytes.Equal(got.Value, []byte("sealed-q")) {
		t.Fatalf("q's secret of the same name changed: %+v", got)
	}

	// Rotation: a swap takes only the value it expects.
	if ok, err := st.ResealSecret(ctx, "sec_1", []byte("sealed-2"), []byte("new")); err != nil || ok {
		t.Fatalf("a reseal of a value that changed since: %v %v, want false", ok, err)
	}
	if ok, err := st.ResealSecret(ctx, "sec_1", []byte("sealed-3"), []byte("resealed-3")); err != nil || !ok {
		t.Fatalf("reseal: %v %v", ok, err)
	}
	if got, _ := other.SecretByID(ctx, p.ID, "sec_1"); got.Version != 3 || !bytes.Equal(got.Value, []byte("resealed-3")) {
		t.Fatalf("after a reseal: %+v, want version 3 with the new bytes", got)
	}
	all, err := st.AllSecrets(ctx)
	if err != nil || len(all) != 5 {
		t.Fatalf("AllSecrets: %d %v, want 5", len(all), err)
	}

	if err := st.DeleteSecret(ctx, q.ID, "sec_1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a delete through another project: %v, want ErrNotFound", err)
	}
	if err := st.DeleteSecret(ctx, p.ID, "sec_1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSecret(ctx, p.ID, "sec_1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a second delete: %v, want ErrNotFound", err)
	}
	if _, err := other.SecretByName(ctx, p.ID, "tok"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if ok, err := st.ResealSecret(ctx, "sec_1", []byte("resealed-3"), []byte("x")); err != nil || ok {
		t.Fatalf("a reseal of a deleted secret: %v %v", ok, err)
	}
	// The name is free again.
	if n, err := other.InsertSecret(ctx, store.Secret{ID: "sec_4", ProjectID: p.ID, Name: "tok", Value: []byte("v")}); err != nil || n.Version != 1 {
		t.Fatalf("a new secret of a deleted one's name: %+v %v", n, err)
	}

	// Concurrent updates from two handles: every one is a version.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := st
			if i%2 == 1 {
				h = other
			}
			_, err := h.UpdateSecret(ctx, p.ID, "sec_4", []byte{byte(i)}, nil)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent update: %v", err)
		}
	}
	if got, _ := st.SecretByID(ctx, p.ID, "sec_4"); got.Version != 21 {
		t.Fatalf("after 20 concurrent updates: version %d, want 21", got.Version)
	}
}

// testIdentity: signing keys by generation (a generation is made once),
// their reseal, and sandboxes' tokens, which go with the sandbox's record.
func testIdentity(t *testing.T, ctx context.Context, open func() store.Store) {
	base := open()
	st, ok := base.(store.Identity)
	if !ok {
		t.Fatalf("the backend does not implement store.Identity")
	}
	other := open().(store.Identity)
	if ks, err := st.SigningKeys(ctx); err != nil || ks == nil || len(ks) != 0 {
		t.Fatalf("SigningKeys of nothing: %v %v", ks, err)
	}
	k1 := store.SigningKey{ID: "k1", Generation: 1, Algorithm: "RS256", Public: []byte{1, 2}, Private: []byte("sealed"), CreatedAt: ts(1), ActivateAt: ts(1)}
	k2 := store.SigningKey{ID: "k2", Generation: 2, Algorithm: "RS256", Public: []byte{3}, Private: []byte("sealed2"), CreatedAt: ts(2), ActivateAt: ts(9)}
	if err := st.InsertSigningKey(ctx, k2); err != nil {
		t.Fatal(err)
	}
	if err := other.InsertSigningKey(ctx, k1); err != nil {
		t.Fatal(err)
	}
	dup := k2
	dup.ID = "k2b"
	if err := other.InsertSigningKey(ctx, dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a generation made twice: %v, want ErrConflict", err)
	}
	ks, err := other.SigningKeys(ctx)
	if err != nil || len(ks) != 2 || ks[0].ID != "k1" || ks[1].ID != "k2" || !ks[1].ActivateAt.Equal(k2.ActivateAt) ||
		!bytes.Equal(ks[1].Public, k2.Public) || !bytes.Equal(ks[1].Private, k2.Private) || ks[1].Algorithm != "RS256" || !ks[0].CreatedAt.Equal(k1.CreatedAt) {
		t.Fatalf("SigningKeys: %+v %v", ks, err)
	}
	if ok, err := st.ResealSigningKey(ctx, "k1", []byte("other"), []byte("x")); err != nil || ok {
		t.Fatalf("a reseal of a changed key: %v %v", ok, err)
	}
	if ok, err := st.ResealSigningKey(ctx, "k1", []byte("sealed"), []byte("resealed")); err != nil || !ok {
		t.Fatalf("reseal: %v %v", ok, err)
	}
	if err := st.DeleteSigningKey(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSigningKey(ctx, "k1"); err != nil {
		t.Fatalf("a second delete: %v", err)
	}
	if ks, _ := other.SigningKeys(ctx); len(ks) != 1 || ks[0].ID != "k2" {
		t.Fatalf("after delete: %+v", ks)
	}

	p, err := base.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	q, err := base.CreateProject(ctx, "q", "")
	if err != nil {
		t.Fatal(err)
	}
	tokens := []store.SandboxToken{
		{Name: "gcp", Audience: "//iam.googleapis.com/x", TokenType: "JWT-SVID", Lifetime: 10 * time.Minute},
		{Name: "aws", Audience: "sts.amazonaws.com", TokenType: "JWT-SVID", Lifetime: 300 * time.Second},
	}
	if err := st.PutSandboxTokens(ctx, p.ID, "sb1", tokens); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("tokens of a sandbox without a record: %v, want ErrNotFound", err)
	}
	if err := base.PutSandbox(ctx, store.Sandbox{ID: "sb1", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: []byte(`{}`), StartedAt: ts(1)}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSandboxTokens(ctx, q.ID, "sb1", tokens); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("tokens of another project's sandbox: %v, want ErrNotFound", err)
	}
	if err := st.PutSandboxTokens(ctx, p.ID, "sb1", tokens); err != nil {
		t.Fatal(err)
	}
	got, err := other.SandboxTokens(ctx, p.ID, "sb1")
	if err != nil || len(got) != 2 || got[0].Name != "aws" || got[0].Audience != "sts.amazonaws.com" || got[0].Lifetime != 300*time.Second ||
		got[0].TokenType != "JWT-SVID" || got[0].ProjectID != p.ID || got[0].SandboxID != "sb1" || got[1].Name != "gcp" {
		t.Fatalf("SandboxTokens: %+v %v", got, err)
	}
	if l, err := other.SandboxTokens(ctx, q.ID, "sb1"); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("another project's view of the sandbox's tokens: %+v %v, want []", l, err)
	}
	if err := other.PutSandboxTokens(ctx, p.ID, "sb1", tokens[:1]); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.SandboxTokens(ctx, p.ID, "sb1"); len(got) != 1 || got[0].Name != "gcp" {
		t.Fatalf("after a second put: %+v, want gcp alone", got)
	}
	if err := base.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if got, err := st.SandboxTokens(ctx, p.ID, "sb1"); err != nil || len(got) != 0 {
		t.Fatalf("tokens after the sandbox's record went: %+v %v", got, err)
	}
	// A sandbox of the same id later starts without them.
	if err := base.PutSandbox(ctx, store.Sandbox{ID: "sb1", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: []byte(`{}`), StartedAt: ts(2)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := other.SandboxTokens(ctx, p.ID, "sb1"); len(got) != 0 {
		t.Fatalf("a new record of the id inherited tokens: %+v", got)
	}
}
