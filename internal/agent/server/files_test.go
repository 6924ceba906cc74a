package server_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

const nobodyUID = 65534

// nobodyDir is a directory inside dir owned by nobody.
func nobodyDir(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "nobody")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, nobodyUID, nobodyUID); err != nil {
		t.Fatal(err)
	}
	return p
}

func allBytes() []byte {
	b := make([]byte, 0, 256*64+1<<20)
	for range 64 {
		for i := range 256 {
			b = append(b, byte(i))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		b = append(b, byte(r.Uint32()))
	}
	return b
}

func readAll(t *testing.T, c *agent.Client, path, user string) []byte {
	t.Helper()
	rc, err := c.ReadFile(testContext(t), path, user)
	if err != nil {
		t.Fatalf("ReadFile(%s, %q): %v", path, user, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return b
}

func TestWriteReadExactBytes(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	owned := nobodyDir(t, dir)
	data := allBytes()
	tests := []struct {
		name, user, path, wantOwner string
	}{
		{"root", "", filepath.Join(dir, "root", "bin.dat"), "root"},
		{"explicit root", "root", filepath.Join(dir, "root2", "bin.dat"), "root"},
		{"nobody", "nobody", filepath.Join(owned, "sub", "bin.dat"), "nobody"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			if err := c.WriteFile(ctx, tt.path, tt.user, bytes.NewReader(data)); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			if got := readAll(t, c, tt.path, tt.user); !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes back, differ from the %d written", len(got), len(data))
			}
			st, err := c.Stat(ctx, tt.path, tt.user)
			if err != nil {
				t.Fatal(err)
			}
			if st.Owner != tt.wantOwner || st.Size != int64(len(data)) || st.Mode != 0o644 || st.Permissions != "-rw-r--r--" {
				t.Errorf("stat = %+v, want owner %s, size %d, mode 0644", st, tt.wantOwner, len(data))
			}
			parent, err := c.Stat(ctx, filepath.Dir(tt.path), tt.user)
			if err != nil || parent.Type != "dir" || parent.Owner != tt.wantOwner {
				t.Errorf("created parent = %+v (%v), want a dir owned by %s", parent, err, tt.wantOwner)
			}
		})
	}
}

func TestWriteEmptyFile(t *testing.T) {
	c := newClient(t)
	p := filepath.Join(testDir(t), "empty")
	if err := c.WriteFile(testContext(t), p, "", nil); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c, p, ""); len(got) != 0 {
		t.Fatalf("read %d bytes, want 0", len(got))
	}
}

// patternReader yields n deterministic pseudo-random bytes without holding
// them in memory.
type patternReader struct {
	r *rand.Rand
	n int64
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n {
		b = b[:p.n]
	}
	for i := range b {
		b[i] = byte(p.r.Uint32())
	}
	p.n -= int64(len(b))
	return len(b), nil
}

func TestWriteReadLargeStreamed(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	owned := nobodyDir(t, dir)
	tests := []struct {
		name, user, path string
		size             int64
	}{
		{"root 100 MB", "", filepath.Join(dir, "big"), 100 << 20},
		{"nobody 32 MB", "nobody", filepath.Join(owned, "big"), 32 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := sha256.New()
			src := io.TeeReader(&patternReader{r: rand.New(rand.NewPCG(7, uint64(tt.size))), n: tt.size}, want)
			if err := c.WriteFile(testContext(t), tt.path, tt.user, src); err != nil {
				t.Fatal(err)
			}
			rc, err := c.ReadFile(testContext(t), tt.path, tt.user)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			got := sha256.New()
			n, err := io.Copy(got, rc)
			if err != nil || n != tt.size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
				t.Fatalf("read back %d bytes (err %v), want %d identical bytes", n, err, tt.size)
			}
		})
	}
}

func TestWriteKeepsModeAndFollowsSymlink(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	ctx := testContext(t)
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, nobodyUID, nobodyUID); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("secret", link); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, link, "", strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Fatalf("target holds %q, want new", b)
	}
	st, err := c.Stat(ctx, p, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != 0o600 || st.Owner != "nobody" {
		t.Errorf("after root overwrote it: mode %o owner %s, want 600 nobody", st.Mode, st.Owner)
	}
	lst, err := c.Stat(ctx, link, "")
	if err != nil || lst.Type != "symlink" || lst.SymlinkTarget != "secret" {
		t.Errorf("link after write = %+v (%v), want still a symlink to secret", lst, err)
	}
}

func TestFileErrors(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(dir, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	rootTarget := "/root/lizard-agent-test-" + time.Now().Format("150405.000000000")
	t.Cleanup(func() { os.Remove(rootTarget) })

	tests := []struct {
		name string
		op   func() error
		want error
	}{
		{"read missing", func() error { _, err := c.ReadFile(testContext(t), missing, ""); return err }, errdefs.ErrNotFound},
		{"read dir", func() error { _, err := c.ReadFile(testContext(t), dir, ""); return err }, errdefs.ErrInvalid},
		{"read relative", func() error { _, err := c.ReadFile(testContext(t), "etc/passwd", ""); return err }, errdefs.ErrInvalid},
		{"read as nobody, no permission", func() error { _, err := c.ReadFile(testContext(t), secret, "nobody"); return err }, errdefs.ErrPermission},
		{"read as nobody, missing", func() error { _, err := c.ReadFile(testContext(t), missing, "nobody"); return err }, errdefs.ErrNotFound},
		{"write over dir", func() error { return c.WriteFile(testContext(t), dir, "", strings.NewReader("x")) }, errdefs.ErrInvalid},
		{"write below a file", func() error { return c.WriteFile(testContext(t), file+"/x", "", strings.NewReader("x")) }, errdefs.ErrInvalid},
		{"write as nobody to /root", func() error { return c.WriteFile(testContext(t), rootTarget, "nobody", strings.NewReader("x")) }, errdefs.ErrPermission},
		{"write as nobody to private dir", func() error {
			return c.WriteFile(testContext(t), filepath.Join(private, "x"), "nobody", strings.NewReader("x"))
		}, errdefs.ErrPermission},
		{"write as unknown user", func() error { return c.WriteFile(testContext(t), file, "no-such-user-lizard", strings.NewReader("x")) }, errdefs.ErrInvalid},
		{"list missing", func() error { _, err := c.List(testContext(t), missing, ""); return err }, errdefs.ErrNotFound},
		{"list file", func() error { _, err := c.List(testContext(t), file, ""); return err }, errdefs.ErrInvalid},
		{"list as nobody, no permission", func() error { _, err := c.List(testContext(t), private, "nobody"); return err }, errdefs.ErrPermission},
		{"stat missing", func() error { _, err := c.Stat(testContext(t), missing, ""); return err }, errdefs.ErrNotFound},
		{"stat as nobody below private", func() error { _, err := c.Stat(testContext(t), filepath.Join(private, "x"), "nobody"); return err }, errdefs.ErrPermission},
		{"remove missing", func() error { return c.Remove(testContext(t), missing, "") }, errdefs.ErrNotFound},
		{"remove /", func() error { return c.Remove(testContext(t), "/", "") }, errdefs.ErrInvalid},
		{"remove as nobody, no permission", func() error { return c.Remove(testContext(t), file, "nobody") }, errdefs.ErrPermission},
		{"move missing", func() error { return c.Move(testContext(t), missing, file+"2", "") }, errdefs.ErrNotFound},
		{"move relative", func() error { return c.Move(testContext(t), file, "x", "") }, errdefs.ErrInvalid},
		{"move as nobody, no permission", func() error { return c.Move(testContext(t), file, file+"2", "nobody") }, errdefs.ErrPermission},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantClass(t, tt.op(), tt.want)
		})
	}
	if _, err := os.Stat(rootTarget); err == nil {
		t.Errorf("nobody created %s", rootTarget)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("a refused remove or move still changed %s: %v", file, err)
	}
}

func TestListDir(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	ctx := testContext(t)
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "c")); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"", "nobody"} {
		got, err := c.List(ctx, dir, user)
		if err != nil {
			t.Fatal(err)
		}
		want := []agent.FileEntry{
			{Name: "a.txt", Path: filepath.Join(dir, "a.txt"), Type: "file", Size: 5},
			{Name: "b", Path: filepath.Join(dir, "b"), Type: "dir"},
			{Name: "c", Path: filepath.Join(dir, "c"), Type: "symlink", Size: 5},
		}
		if len(got) != len(want) {
			t.Fatalf("user %q: list = %+v, want %+v", user, got, want)
		}
		for i := range want {
			if want[i].Type == "dir" {
				want[i].Size = got[i].Size // a directory's size is the file system's business
			}
			if got[i] != want[i] {
				t.Errorf("user %q: entry %d = %+v, want %+v", user, i, got[i], want[i])
			}
		}
	}

	empty, err := c.List(ctx, filepath.Join(dir, "b"), "nobody")
	if err != nil || empty == nil || len(empty) != 0 {
		t.Fatalf("empty dir: %#v, %v; want a non-nil empty list", empty, err)
	}
}

func TestStat(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	ctx := testContext(t)
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	if err := os.Chtimes(file, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	suid := filepath.Join(dir, "suid")
	sticky := filepath.Join(dir, "sticky")
	if err := os.WriteFile(suid, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	mustChmod(t, suid, 0o4754)
	mustChmod(t, sticky, 0o1777)
	link := filepath.Join(dir, "l")
	if err := os.Symlink("/no/where", link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, wantType, wantPerm string
		wantMode                 uint32
	}{
		{file, "file", "-rw-r--r--", 0o644},
		{dir, "dir", "drwxr-xr-x", 0o755},
		{suid, "file", "-rwsr-xr--", 0o4754},
		{sticky, "dir", "drwxrwxrwt", 0o1777},
		{link, "symlink", "lrwxrwxrwx", 0o777},
	}
	for _, tt := range tests {
		for _, user := range []string{"", "nobody"} {
			st, err := c.Stat(ctx, tt.path, user)
			if err != nil {
				t.Fatalf("Stat(%s, %q): %v", tt.path, user, err)
			}
			if st.Type != tt.wantType || st.Permissions != tt.wantPerm || st.Mode != tt.wantMode ||
				st.Path != tt.path || st.Name != filepath.Base(tt.path) || st.Owner != "root" || st.Group != "root" {
				t.Errorf("Stat(%s, %q) = %+v, want type %s perm %s mode %o", tt.path, user, st, tt.wantType, tt.wantPerm, tt.wantMode)
			}
		}
	}
	st, err := c.Stat(ctx, file, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Size != 5 || st.ModTime != mtime.UnixMilli() || st.ModifiedAt != mtime.UnixMilli() {
		t.Errorf("stat = %+v, want size 5, mtime %v", st, mtime)
	}
	lst, err := c.Stat(ctx, link, "")
	if err != nil || lst.SymlinkTarget != "/no/where" {
		t.Errorf("symlink stat = %+v (%v), want target /no/where", lst, err)
	}
	numeric := filepath.Join(dir, "numeric")
	if err := os.WriteFile(numeric, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(numeric, 43210, 43211); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Stat(ctx, numeric, ""); err != nil || st.Owner != "43210" || st.Group != "43211" {
		t.Errorf("unknown owner: %+v (%v), want numeric names", st, err)
	}
}

func mustChmod(t *testing.T, p string, mode uint32) {
	t.Helper()
	if err := syscall.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func TestMoveAndRemove(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	owned := nobodyDir(t, dir)
	ctx := testContext(t)
	for _, tt := range []struct{ user, base string }{{"", dir}, {"nobody", owned}} {
		src := filepath.Join(tt.base, "src.txt")
		if err := c.WriteFile(ctx, src, tt.user, strings.NewReader("payload")); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(tt.base, "x", "y", "dst.txt")
		if err := c.Move(ctx, src, dst, tt.user); err != nil {
			t.Fatalf("Move as %q: %v", tt.user, err)
		}
		if got := readAll(t, c, dst, tt.user); string(got) != "payload" {
			t.Errorf("moved file holds %q", got)
		}
		if _, err := c.Stat(ctx, src, tt.user); !isNotFound(err) {
			t.Errorf("source still there after move: %v", err)
		}
		if err := c.Remove(ctx, filepath.Join(tt.base, "x"), tt.user); err != nil {
			t.Fatalf("Remove dir as %q: %v", tt.user, err)
		}
		if _, err := os.Lstat(filepath.Join(tt.base, "x")); !os.IsNotExist(err) {
			t.Errorf("directory not removed recursively: %v", err)
		}
	}
	// Moving to itself is a no-op, not an error.
	p := filepath.Join(dir, "same")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Move(ctx, p, p, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, p, ""); err != nil {
		t.Fatal(err)
	}
}

func isNotFound(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such file") && errors.Is(err, errdefs.ErrNotFound)
}
