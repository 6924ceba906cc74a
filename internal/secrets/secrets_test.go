package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// env is a SQLite store with two projects.
type env struct {
	st   *sqlite.Store
	p, q string
}

func newEnv(t *testing.T) env {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	q, err := st.CreateProject(ctx, "q", "")
	if err != nil {
		t.Fatal(err)
	}
	return env{st: st, p: p.ID, q: q.ID}
}

func mustNew(t *testing.T, body string) NewSecret {
	t.Helper()
	req, err := ParseNew([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestLifecycle: create, get by id or name, update (a new version, the new
// value resolves), delete (nothing resolves); another project never sees
// the secret; the store holds only the sealed value.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	svc := New(e.st, seal.NewKeyring(seal.NewKey()))
	const v1, v2 = "sk-first-value-0001", "sk-second-value-0002"
	info, err := svc.Create(ctx, e.p, mustNew(t, `{"name":"OpenAI_Key","value":"`+v1+`","metadata":{"owner":"ops"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "openai_key" || info.Version != 1 || !strings.HasPrefix(info.ID, IDPrefix) || info.Metadata["owner"] != "ops" {
		t.Fatalf("created: %+v", info)
	}
	if _, err := svc.Create(ctx, e.p, mustNew(t, `{"name":"openai_key","value":"x"}`)); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the same name again: %v, want ErrConflict", err)
	}
	for _, ref := range []string{info.ID, strings.ToUpper(info.ID), "openai_key", " OpenAI_Key "} {
		if got, err := svc.Get(ctx, e.p, ref); err != nil || got.ID != info.ID {
			t.Fatalf("Get(%q): %+v %v", ref, got, err)
		}
	}
	if v, err := svc.SecretValue(ctx, e.p, "OPENAI_KEY"); err != nil || v != v1 {
		t.Fatalf("SecretValue: %q %v", v, err)
	}
	if ok, err := svc.SecretExists(ctx, e.p, "OpenAI_Key"); err != nil || !ok {
		t.Fatalf("SecretExists: %v %v", ok, err)
	}
	row, err := e.st.SecretByID(ctx, e.p, info.ID)
	if err != nil || bytes.Contains(row.Value, []byte(v1)) || seal.SealedWith(row.Value) == "" {
		t.Fatalf("the stored value is not sealed: %v", err)
	}

	// Another project: nothing, by id or name, for every verb.
	if _, err := svc.Get(ctx, e.q, info.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's Get: %v", err)
	}
	if _, err := svc.SecretValue(ctx, e.q, "openai_key"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's SecretValue: %v", err)
	}
	if _, err := svc.Update(ctx, e.q, "openai_key", SecretUpdate{Value: "x"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's Update: %v", err)
	}
	if err := svc.Delete(ctx, e.q, info.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's Delete: %v", err)
	}
	if l, _, err := svc.List(ctx, e.q, Page{limit: 10}); err != nil || len(l) != 0 {
		t.Fatalf("another project's List: %+v %v", l, err)
	}

	up, err := ParseUpdate([]byte(`{"value":"` + v2 + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := svc.Update(ctx, e.p, "openai_key", up)
	if err != nil || got.Version != 2 || got.Metadata["owner"] != "ops" {
		t.Fatalf("Update: %+v %v", got, err)
	}
	if v, err := svc.SecretValue(ctx, e.p, "openai_key"); err != nil || v != v2 {
		t.Fatalf("the value after an update: %q %v", v, err)
	}
	if err := svc.Delete(ctx, e.p, "openai_key"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.SecretValue(ctx, e.p, "openai_key"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("SecretValue after delete: %v, want ErrNotFound", err)
	}
	if ok, err := svc.SecretExists(ctx, e.p, "openai_key"); err != nil || ok {
		t.Fatalf("SecretExists after delete: %v %v", ok, err)
	}
	if err := svc.Delete(ctx, e.p, info.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a second delete: %v", err)
	}
	// A reference that is neither an id nor a name is a 400; a placeholder
	// name that cannot be one resolves to nothing.
	if _, err := svc.Get(ctx, e.p, "bad name!"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Get of a bad reference: %v", err)
	}
	if _, err := svc.SecretValue(ctx, e.p, "bad name!"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("SecretValue of a bad name: %v", err)
	}
}

// TestList: pages by name with nextToken, the last page without one.
func TestList(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	svc := New(e.st, seal.NewKeyring(seal.NewKey()))
	for i := range 7 {
		if _, err := svc.Create(ctx, e.p, mustNew(t, fmt.Sprintf(`{"name":"s%d","value":"v"}`, 6-i))); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	q := url.Values{"limit": {"3"}}
	pages := 0
	for {
		page, err := ParsePage(q)
		if err != nil {
			t.Fatal(err)
		}
		l, next, err := svc.List(ctx, e.p, page)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, s := range l {
			names = append(names, s.Name)
		}
		if next == "" {
			break
		}
		q.Set("nextToken", next)
	}
	if fmt.Sprint(names) != "[s0 s1 s2 s3 s4 s5 s6]" || pages != 3 {
		t.Fatalf("%d pages: %v", pages, names)
	}
	for _, bad := range []url.Values{{"limit": {"0"}}, {"limit": {"101"}}, {"limit": {"x"}}, {"nextToken": {"!!"}}, {"nextToken": {"c2VjX3g"}}} {
		_, err := ParsePage(bad)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("ParsePage(%v): %v, want ErrInvalid", bad, err)
		}
		for field := range bad {
			if !strings.HasPrefix(err.Error(), field+":") {
				t.Fatalf("ParsePage(%v): %q does not name %s", bad, err, field)
			}
		}
	}
}

// TestWrongKey: a server given another key than the one that sealed a
// value says which key it needs; the error holds no value.
func TestWrongKey(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	a, b := seal.NewKey(), seal.NewKey()
	const value = "value-that-must-stay-secret"
	if _, err := New(e.st, seal.NewKeyring(a)).Create(ctx, e.p, mustNew(t, `{"name":"tok","value":"`+value+`"}`)); err != nil {
		t.Fatal(err)
	}
	_, err := New(e.st, seal.NewKeyring(b)).SecretValue(ctx, e.p, "tok")
	if !errors.Is(err, seal.ErrWrongKey) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("SecretValue under another key: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, a.Fingerprint()) || !strings.Contains(msg, `"tok"`) || strings.Contains(msg, value) {
		t.Fatalf("error %q: want the secret's name and the key that sealed it, never the value", msg)
	}
	// A value moved onto another secret's row does not open.
	other, err := New(e.st, seal.NewKeyring(a)).Create(ctx, e.p, mustNew(t, `{"name":"other","value":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := e.st.SecretByName(ctx, e.p, "tok")
	if _, err := e.st.UpdateSecret(ctx, e.p, other.ID, tok.Value, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := New(e.st, seal.NewKeyring(a)).SecretValue(ctx, e.p, "other"); !errors.Is(err, seal.ErrCorrupt) {
		t.Fatalf("a value copied from another secret: %v, want ErrCorrupt", err)
	}
}

// TestRotation: with the new key current and the old one previous, every
// value resolves; Reseal moves them all to the new key, after which the old
// key is not needed; a second Reseal has nothing to do.
func TestRotation(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	old, cur := seal.NewKey(), seal.NewKey()
	before := New(e.st, seal.NewKeyring(old))
	for i := range 3 {
		if _, err := before.Create(ctx, e.p, mustNew(t, fmt.Sprintf(`{"name":"s%d","value":"value-%d"}`, i, i))); err != nil {
			t.Fatal(err)
		}
	}
	both := New(e.st, seal.NewKeyring(cur, old))
	// A value written during the overlap is sealed with the new key.
	if _, err := both.Create(ctx, e.q, mustNew(t, `{"name":"s9","value":"value-9"}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := both.SecretValue(ctx, e.p, "s1"); err != nil || v != "value-1" {
		t.Fatalf("an old value during the overlap: %q %v", v, err)
	}
	counts, err := both.Sealed(ctx)
	if err != nil || counts[old.Fingerprint()] != 3 || counts[cur.Fingerprint()] != 1 {
		t.Fatalf("Sealed before the rotation: %v %v", counts, err)
	}
	n, err := both.Reseal(ctx)
	if err != nil || n != 3 {
		t.Fatalf("Reseal: %d %v, want 3", n, err)
	}
	after := New(e.st, seal.NewKeyring(cur))
	for i := range 3 {
		if v, err := after.SecretValue(ctx, e.p, fmt.Sprintf("s%d", i)); err != nil || v != fmt.Sprintf("value-%d", i) {
			t.Fatalf("s%d with the new key alone: %q %v", i, v, err)
		}
	}
	if _, err := New(e.st, seal.NewKeyring(old)).SecretValue(ctx, e.p, "s0"); !errors.Is(err, seal.ErrWrongKey) {
		t.Fatalf("the old key after the rotation: %v", err)
	}
	if n, err := both.Reseal(ctx); err != nil || n != 0 {
		t.Fatalf("a second Reseal: %d %v", n, err)
	}
	// A rotation that lacks the key of a value stops and names it (the
	// first it meets: rows come in no set order).
	if _, err := New(e.st, seal.NewKeyring(seal.NewKey())).Reseal(ctx); !errors.Is(err, seal.ErrWrongKey) || !regexp.MustCompile(`secret sec_\w+ \("s\d"`).MatchString(err.Error()) {
		t.Fatalf("Reseal without the old key: %v", err)
	}
}

// TestNoKey: without a key, creates and updates are 403 secrets_disabled
// and nothing resolves; lists, reads and deletes work.
func TestNoKey(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	if _, err := New(e.st, seal.NewKeyring(seal.NewKey())).Create(ctx, e.p, mustNew(t, `{"name":"tok","value":"v"}`)); err != nil {
		t.Fatal(err)
	}
	svc := New(e.st, nil)
	_, err := svc.Create(ctx, e.p, mustNew(t, `{"name":"b","value":"v"}`))
	if !errors.Is(err, errdefs.ErrPermission) || errdefs.Code(err) != "secrets_disabled" || !strings.Contains(err.Error(), "--secrets-key-file") {
		t.Fatalf("Create without a key: %v", err)
	}
	if _, err := svc.Update(ctx, e.p, "tok", SecretUpdate{Value: "v"}); errdefs.Code(err) != "secrets_disabled" {
		t.Fatalf("Update without a key: %v", err)
	}
	if _, err := svc.SecretValue(ctx, e.p, "tok"); errdefs.Code(err) != "secrets_disabled" {
		t.Fatalf("SecretValue without a key: %v", err)
	}
	if l, _, err := svc.List(ctx, e.p, Page{limit: 5}); err != nil || len(l) != 1 {
		t.Fatalf("List without a key: %v %v", l, err)
	}
	if err := svc.Delete(ctx, e.p, "tok"); err != nil {
		t.Fatalf("Delete without a key: %v", err)
	}
}

// TestParse: bad bodies are 400s naming the field, and no error repeats
// the value (nor any byte of the body around a syntax error).
func TestParse(t *testing.T) {
	const v = "SeCrEtVaLuE"
	long := strings.Repeat("x", MaxValueBytes+1)
	bigMeta := "{"
	for i := range MaxMetadata + 1 {
		bigMeta += fmt.Sprintf(`"k%d":"v",`, i)
	}
	bigMeta = strings.TrimSuffix(bigMeta, ",") + "}"
	for _, c := range []struct{ body, field string }{
		{``, "body"},
		{`[]`, "body"},
		{`{"name":"a","value":"` + v + `"`, "body"},
		{`{"name":"a","value":"` + v + `" x}`, "body"},
		{`{"name":"a","value":` + v + `}`, "body"},
		{`{"value":"` + v + `"}`, "name"},
		{`{"name":"","value":"` + v + `"}`, "name"},
		{`{"name":"a b","value":"` + v + `"}`, "name"},
		{`{"name":"a{b}","value":"` + v + `"}`, "name"},
		{`{"name":"sec_x","value":"` + v + `"}`, "name"},
		{`{"name":"` + strings.Repeat("n", MaxNameBytes+1) + `","value":"` + v + `"}`, "name"},
		{`{"name":7,"value":"` + v + `"}`, "name"},
		{`{"name":"a"}`, "value"},
		{`{"name":"a","value":""}`, "value"},
		{`{"name":"a","value":12}`, "value"},
		{`{"name":"a","value":"` + v + `\r\nX-Evil: 1"}`, "value"},
		{`{"name":"a","value":"` + v + `\u0000"}`, "value"},
		{`{"name":"a","value":"` + long + `"}`, "value"},
		{`{"name":"a","value":"` + v + `","metadata":[]}`, "metadata"},
		{`{"name":"a","value":"` + v + `","metadata":{"k":1}}`, "metadata"},
		{`{"name":"a","value":"` + v + `","metadata":{"":"v"}}`, "metadata"},
		{`{"name":"a","value":"` + v + `","metadata":{"k":"` + strings.Repeat("m", MaxMetaValueBytes+1) + `"}}`, "metadata.k"},
		{`{"name":"a","value":"` + v + `","metadata":` + bigMeta + `}`, "metadata"},
	} {
		_, err := ParseNew([]byte(c.body))
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("ParseNew(%.60s): %v, want ErrInvalid", c.body, err)
		}
		if !strings.HasPrefix(err.Error(), c.field+":") {
			t.Fatalf("ParseNew(%.60s): %q does not start with the field %q", c.body, err, c.field)
		}
		if strings.Contains(strings.ToLower(err.Error()), strings.ToLower(v)) || strings.Contains(err.Error(), "xxxxxxxx") {
			t.Fatalf("ParseNew(%.60s): the error %q repeats the value", c.body, err)
		}
	}
	if _, err := ParseUpdate([]byte(`{"name":"b","value":"v"}`)); err == nil || !strings.HasPrefix(err.Error(), "name:") {
		t.Fatalf("an update naming a name: %v", err)
	}
	up, err := ParseUpdate([]byte(`{"value":"v","metadata":null}`))
	if err != nil || up.Metadata != nil {
		t.Fatalf("an update with metadata null keeps it: %+v %v", up, err)
	}
	up, err = ParseUpdate([]byte(`{"value":"v","metadata":{}}`))
	if err != nil || up.Metadata == nil {
		t.Fatalf("an update with metadata {} clears it: %+v %v", up, err)
	}
	ok, err := ParseNew([]byte(`{"name":" My-Key_1 ","value":"tab\tok é"}`))
	if err != nil || ok.Name != "my-key_1" || ok.Value != "tab\tok é" {
		t.Fatalf("a good body: %+v %v", ok, err)
	}
}

var _ store.Secrets = (*sqlite.Store)(nil)
