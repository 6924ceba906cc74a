package server

import (
	"bufio"
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lizard-build/lizard/internal/agent"
	fspb "github.com/lizard-build/lizard/internal/envd/filesystem"
	"github.com/lizard-build/lizard/internal/envd/filesystem/filesystemconnect"
	pb "github.com/lizard-build/lizard/internal/envd/process"
	"github.com/lizard-build/lizard/internal/envd/process/processconnect"
)

// userWithHome is a non-root account of this machine whose home directory
// exists, standing in for E2B's "user" (the test machine has none).
func userWithHome(t *testing.T) (name, home string) {
	t.Helper()
	f, err := os.Open("/etc/passwd")
	if err != nil {
		t.Skipf("skipping: no /etc/passwd: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) != 7 || fields[2] == "0" || fields[5] == "/" || !strings.HasPrefix(fields[5], "/") {
			continue
		}
		if fi, err := os.Stat(fields[5]); err == nil && fi.IsDir() {
			return fields[0], fields[5]
		}
	}
	t.Skip("skipping: no non-root account with an existing home")
	return "", ""
}

func basicUser(name string) http.Header {
	h := http.Header{}
	if name != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(name+":")))
	}
	return h
}

func TestEnvdDefaultAccount(t *testing.T) {
	other, _ := userWithHome(t)
	const missing = "no-such-user-lizard"
	tests := []struct {
		name       string
		configured string // EnvdRequest.User
		fallback   string // envdUser, as the sandbox has it or not
		basic      string // the Basic auth user
		param      string // the username parameter
		want       string
	}{
		{"the fallback when the sandbox has it", "", other, "", "", other},
		{"root when the sandbox lacks the fallback", "", missing, "", "", "root"},
		{"the configured user over the fallback", other, missing, "", "", other},
		{"an explicit root over the fallback", "root", other, "", "", "root"},
		{"Basic auth over the default", "", other, "root", "", "root"},
		{"the username parameter over the default", "", other, "", "root", "root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &envd{fallback: tt.fallback, user: tt.configured}
			a, err := e.account(basicUser(tt.basic), tt.param)
			if err != nil {
				t.Fatalf("account: %v", err)
			}
			if a.name != tt.want {
				t.Errorf("account = %q, want %q", a.name, tt.want)
			}
		})
	}
	// A configured user the sandbox lacks is named, never replaced.
	e := &envd{fallback: other, user: missing}
	if _, err := e.account(http.Header{}, ""); err == nil || !strings.Contains(err.Error(), missing) || toAPIError(err).status != http.StatusBadRequest {
		t.Errorf("a missing configured user: %v, want a 400 naming %q", err, missing)
	}
}

// envdMarked adds what the node's proxy adds to E2B traffic.
type envdMarked struct{ next http.RoundTripper }

func (m envdMarked) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(agent.EnvdHeader, "1")
	return m.next.RoundTrip(r)
}

// TestEnvdDefaultUserCommandsAndPaths: with no user named, commands run as
// the fallback account in its home, and relative paths are its home's.
func TestEnvdDefaultUserCommandsAndPaths(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: runs commands as another user, needs root")
	}
	other, home := userWithHome(t)
	srv, err := New(Config{Token: "test-token"})
	if err != nil {
		t.Fatal(err)
	}
	srv.envd.fallback = other
	ts := httptest.NewServer(srv)
	defer ts.Close()
	hc := &http.Client{Transport: envdMarked{ts.Client().Transport}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pc := processconnect.NewProcessClient(hc, ts.URL, connect.WithProtoJSON())
	st, err := pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "id -un; pwd"}}}))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for st.Receive() {
		out += string(st.Msg().GetEvent().GetData().GetStdout())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if want := other + "\n" + home + "\n"; out != want {
		t.Errorf("id -un; pwd = %q, want %q", out, want)
	}

	fc := filesystemconnect.NewFilesystemClient(hc, ts.URL, connect.WithProtoJSON())
	res, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "."}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.Entry.Path != home {
		t.Errorf("Stat(\".\") = %s, want the default user's home %s", res.Msg.Entry.Path, home)
	}
}

// TestWriteAsUserMakesParents: a user's write under directories that do
// not exist is made as envd makes it: the missing parents are created and
// given to the user, even under a directory only root may write; a file
// straight into such a directory is still refused.
func TestWriteAsUserMakesParents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: writes as another user, needs root")
	}
	name, _ := userWithHome(t)
	srv, err := New(Config{Token: "test-token"})
	if err != nil {
		t.Fatal(err)
	}
	acct, err := srv.accts.lookupAccount(name)
	if err != nil {
		t.Fatal(err)
	}
	// A root-owned directory that others may enter but not write.
	rootDir, err := os.MkdirTemp("/tmp", "lizard-parents-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rootDir) })
	if err := os.Chmod(rootDir, 0o755); err != nil {
		t.Fatal(err)
	}

	p := filepath.Join(rootDir, "0", "deeper", "file.txt")
	if err := srv.putFile(acct, p, strings.NewReader("data"), nil); err != nil {
		t.Fatalf("write %s as %s: %v", p, name, err)
	}
	for _, q := range []string{filepath.Dir(filepath.Dir(p)), filepath.Dir(p), p} {
		fi, err := os.Lstat(q)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != acct.uid || st.Gid != acct.gid {
			t.Errorf("%s is owned by %d:%d, want %s's %d:%d", q, st.Uid, st.Gid, name, acct.uid, acct.gid)
		}
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "data" {
		t.Errorf("read back %q %v", b, err)
	}
	if err := srv.putFile(acct, filepath.Join(rootDir, "direct.txt"), strings.NewReader("x"), nil); err == nil {
		t.Errorf("a file straight into root's directory was written as %s", name)
	}
}
