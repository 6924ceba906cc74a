package content

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func open(t *testing.T) (*FS, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, dir
}

func u32(v uint32) *uint32 { return &v }

func TestClean(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "/", want: "/"},
		{in: "a/b/", want: "/a/b"},
		{in: "//a//b", want: "/a/b"},
		{in: "/a/../../../etc", want: "/etc"},
		{in: "..", want: "/"},
		{in: "", bad: true},
		{in: "a\x00b", bad: true},
	} {
		got, err := Clean(tc.in)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "path") {
				t.Errorf("Clean(%q): %v, want an invalid path", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Clean(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestWriteReadStat(t *testing.T) {
	needRoot(t)
	f, dir := open(t)
	e, err := f.Write("/hello.txt", strings.NewReader("hi"), Attrs{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "hello.txt" || e.Path != "/hello.txt" || e.Type != "file" || e.Size != 2 || e.Mode != DefaultFileMode {
		t.Fatalf("entry %+v", e)
	}
	if os.Geteuid() == 0 && (e.UID != DefaultUID || e.GID != DefaultGID) {
		t.Fatalf("owner %d:%d, want %d:%d", e.UID, e.GID, DefaultUID, DefaultGID)
	}
	if e.Mtime.IsZero() || e.Atime.IsZero() || e.Ctime.IsZero() {
		t.Fatalf("times %+v", e)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "hello.txt"))
	if string(b) != "hi" {
		t.Fatalf("on disk: %q", b)
	}
	// Without force an existing file stays; with it, it is replaced.
	if _, err := f.Write("hello.txt", strings.NewReader("other"), Attrs{}, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("overwrite without force: %v", err)
	}
	if _, err := f.Write("hello.txt", strings.NewReader("bye!"), Attrs{Mode: u32(0o600)}, true); err != nil {
		t.Fatal(err)
	}
	file, e, err := f.OpenRead("/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(file)
	file.Close()
	if string(b) != "bye!" || e.Mode != 0o600 {
		t.Fatalf("read %q, mode %o", b, e.Mode)
	}
	// No upload file is left beside it.
	names, _ := os.ReadDir(dir)
	if len(names) != 1 {
		t.Fatalf("left in the root: %v", names)
	}
	// The parent must exist; a directory is not a file.
	if _, err := f.Write("/no/such/dir/f", strings.NewReader("x"), Attrs{}, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("write under a missing directory: %v", err)
	}
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	if _, err := f.Write("/d", strings.NewReader("x"), Attrs{}, true); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("write over a directory: %v", err)
	}
	if _, _, err := f.OpenRead("/d"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("read a directory: %v", err)
	}
	if _, err := f.Stat("/missing"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `"/missing"`) {
		t.Fatalf("stat of a missing path: %v", err)
	}
	if _, err := f.Write("/m", strings.NewReader("x"), Attrs{Mode: u32(0o10000)}, false); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "mode") {
		t.Fatalf("a mode beyond 0o7777: %v", err)
	}
}

// A failed write leaves the file as it was and no upload behind.
func TestWriteFails(t *testing.T) {
	needRoot(t)
	f, dir := open(t)
	if _, err := f.Write("/keep", strings.NewReader("old"), Attrs{}, false); err != nil {
		t.Fatal(err)
	}
	_, err := f.Write("/keep", io.MultiReader(strings.NewReader("new"), failing{}), Attrs{}, true)
	if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(errdefs.ClientMessage(err), "went away") {
		t.Fatalf("a write whose body fails: %v (%q to the client)", err, errdefs.ClientMessage(err))
	}
	b, _ := os.ReadFile(filepath.Join(dir, "keep"))
	names, _ := os.ReadDir(dir)
	if string(b) != "old" || len(names) != 1 {
		t.Fatalf("after a failed write: %q, %d entries", b, len(names))
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("client went away") }

func TestMakeDirAndList(t *testing.T) {
	needRoot(t)
	f, _ := open(t)
	if _, err := f.MakeDir("/a/b/c", Attrs{}, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("mkdir without parents, no force: %v", err)
	}
	e, err := f.MakeDir("/a/b/c", Attrs{Mode: u32(0o750)}, true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Type != "directory" || e.Path != "/a/b/c" || e.Mode != 0o750 {
		t.Fatalf("entry %+v", e)
	}
	if _, err := f.MakeDir("/a/b/c", Attrs{}, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("mkdir of an existing dir without force: %v", err)
	}
	if _, err := f.MakeDir("/a/b/c", Attrs{}, true); err != nil {
		t.Fatalf("mkdir of an existing dir with force: %v", err)
	}
	if _, err := f.Write("/a/b/c/f.txt", strings.NewReader("x"), Attrs{}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write("/a/top.txt", strings.NewReader("x"), Attrs{}, false); err != nil {
		t.Fatal(err)
	}
	paths := func(es []Entry) string {
		var ps []string
		for _, e := range es {
			ps = append(ps, e.Path)
		}
		return strings.Join(ps, " ")
	}
	for _, tc := range []struct {
		dir   string
		depth int
		want  string
	}{
		{"/", 1, "/a"},
		{"/a", 1, "/a/b /a/top.txt"},
		{"/a", 2, "/a/b /a/b/c /a/top.txt"},
		{"a", 3, "/a/b /a/b/c /a/b/c/f.txt /a/top.txt"},
	} {
		es, err := f.List(tc.dir, tc.depth)
		if err != nil {
			t.Fatalf("list %s depth %d: %v", tc.dir, tc.depth, err)
		}
		if got := paths(es); got != tc.want {
			t.Errorf("list %s depth %d: %s, want %s", tc.dir, tc.depth, got, tc.want)
		}
	}
	for _, tc := range []struct {
		dir   string
		depth int
		class error
	}{
		{"/nope", 1, errdefs.ErrNotFound},
		{"/a/top.txt", 1, errdefs.ErrNotFound},
		{"/a", 0, errdefs.ErrInvalid},
		{"/a", MaxDepth + 1, errdefs.ErrInvalid},
	} {
		if _, err := f.List(tc.dir, tc.depth); !errors.Is(err, tc.class) {
			t.Errorf("list %s depth %d: %v, want %v", tc.dir, tc.depth, err, tc.class)
		}
	}
}

func TestRemove(t *testing.T) {
	f, _ := open(t)
	f.MakeDir("/r/n", Attrs{}, true)
	f.Write("/r/n/f", strings.NewReader("x"), Attrs{}, false)
	if err := f.Remove("/r"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat("/r"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after remove: %v", err)
	}
	if err := f.Remove("/r"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("remove of a missing path: %v", err)
	}
	if err := f.Remove("/"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("remove of the root: %v", err)
	}
}

// Symbolic links in a volume cannot lead out of it: not absolute ones
// (which a sandbox makes, meaning its own paths), not ones that climb.
func TestLinksStayInside(t *testing.T) {
	needRoot(t)
	f, dir := open(t)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o644)
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "abs"))
	os.Symlink("../../../../../../.."+outside, filepath.Join(dir, "up"))
	os.Symlink("inside.txt", filepath.Join(dir, "rel"))
	f.Write("/inside.txt", strings.NewReader("ok"), Attrs{}, false)
	for _, p := range []string{"/abs", "/up/secret"} {
		if _, _, err := f.OpenRead(p); !errors.Is(err, errdefs.ErrPermission) {
			t.Errorf("read %s: %v, want a refusal", p, err)
		}
	}
	if _, err := f.Write("/up/secret", strings.NewReader("x"), Attrs{}, true); err == nil {
		t.Error("a write through a link out of the volume succeeded")
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host" {
		t.Fatalf("the file outside changed: %q", b)
	}
	file, _, err := f.OpenRead("/rel")
	if err != nil {
		t.Fatalf("a link inside the volume: %v", err)
	}
	file.Close()
	e, err := f.Stat("/abs")
	if err != nil || e.Type != "symlink" || e.Target != filepath.Join(outside, "secret") {
		t.Fatalf("stat of a link: %+v, %v", e, err)
	}
}

func TestSetAttrs(t *testing.T) {
	needRoot(t)
	f, _ := open(t)
	f.Write("/x", strings.NewReader("x"), Attrs{UID: u32(0), GID: u32(0)}, false)
	e, err := f.SetAttrs("/x", Attrs{UID: u32(1001), GID: u32(1002), Mode: u32(0o755)})
	if err != nil {
		t.Fatal(err)
	}
	if e.UID != 1001 || e.GID != 1002 || e.Mode != 0o755 {
		t.Fatalf("entry %+v", e)
	}
	e, _ = f.SetAttrs("/x", Attrs{Mode: u32(0o4750)})
	if e.UID != 1001 || e.Mode != 0o4750 {
		t.Fatalf("after a mode alone: %+v", e)
	}
	if _, err := f.SetAttrs("/none", Attrs{Mode: u32(0o644)}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("setattrs of a missing path: %v", err)
	}
}

// A request run through Main (as in a sandbox) answers what Do answers,
// its error classed as it was.
func TestMainRoundTrip(t *testing.T) {
	needRoot(t)
	_, dir := open(t)
	run := func(req Request) Reply {
		t.Helper()
		b, _ := json.Marshal(req)
		var out bytes.Buffer
		if err := Main([]string{dir, string(b)}, &out); err != nil {
			t.Fatal(err)
		}
		var rep Reply
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("reply %q: %v", out.String(), err)
		}
		return rep
	}
	rep := run(Request{Op: OpCheckWrite, Path: "/f"})
	if rep.Err() != nil || !strings.HasPrefix(rep.Upload, "/"+UploadPrefix) {
		t.Fatalf("checkwrite: %+v", rep)
	}
	os.WriteFile(filepath.Join(dir, rep.Upload), []byte("data"), 0o600)
	rep = run(Request{Op: OpCommit, Path: "/f", Upload: rep.Upload})
	if rep.Err() != nil || rep.Entry == nil || rep.Entry.Size != 4 {
		t.Fatalf("commit: %+v", rep)
	}
	rep = run(Request{Op: OpCheckWrite, Path: "/f"})
	if err := rep.Err(); !errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "path_exists" {
		t.Fatalf("checkwrite of an existing file: %v", err)
	}
	if err := run(Request{Op: OpCommit, Path: "/f", Upload: "/etc/passwd"}).Err(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("commit of something not an upload: %v", err)
	}
	if err := run(Request{Op: "chmod"}).Err(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unknown op: %v", err)
	}
	rep = run(Request{Op: OpList, Path: "/", Depth: 1})
	if rep.Err() != nil || len(rep.Entries) != 1 || rep.Entries[0].Name != "f" {
		t.Fatalf("list: %+v", rep)
	}
	if err := Main([]string{dir}, io.Discard); err == nil {
		t.Fatal("Main with one argument")
	}
}

// needRoot skips a test that gives files to another owner (what is
// written belongs to uid 1000 unless asked otherwise), which only root may.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: what a volume's file API writes is given to uid 1000")
	}
}
