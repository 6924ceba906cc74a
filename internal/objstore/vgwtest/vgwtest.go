// Package vgwtest starts a versitygw S3 gateway of a test's own: the POSIX
// backend in a temporary directory, on a 127.0.0.1 port of its own, with
// generated root credentials and one bucket. Tests can stop and start it
// again (the data is kept) to play an object store that goes away. The
// objstore backends' tests, package durable's, the moves' between nodes
// (internal/sandbox/move), the end-to-end tests and bench/ (its durable
// section) use it; nothing else may.
package vgwtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Version is the versitygw release scripts/install-deps.sh installs.
const Version = "v1.8.0"

// Ports are the loopback ports gateways started here listen on; Start takes
// the first one free that no other gateway of this machine holds (a lock
// file per port, held until Close: a stopped gateway keeps its port, and a
// test process cannot take another's, then reach the other's gateway as
// its own).
const (
	FirstPort = 18600
	LastPort  = 18619
)

// ErrNoVersitygw is returned by Start when the binary is missing.
var ErrNoVersitygw = errors.New("versitygw not found (scripts/install-deps.sh installs it into /var/cache/lizard/tools/versitygw-" + Version + "; or set LIZARD_VERSITYGW)")

// Binary is versitygw's path: $LIZARD_VERSITYGW, else the cache's, else
// PATH's.
func Binary() (string, error) {
	if p := os.Getenv("LIZARD_VERSITYGW"); p != "" {
		return p, nil
	}
	p := filepath.Join("/var/cache/lizard/tools", "versitygw-"+Version, "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	return "", ErrNoVersitygw
}

// Server is a running (or stopped) gateway.
type Server struct {
	Bucket    string
	AccessKey string
	SecretKey string
	Addr      string // host:port (127.0.0.1 unless StartOn said otherwise)

	bin  string
	dir  string   // data/ (the buckets) and log
	port *os.File // the port's lock (holdPort)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start makes a data directory and starts a gateway on it with a bucket.
func Start(ctx context.Context) (*Server, error) { return StartOn(ctx, "127.0.0.1") }

// StartOn is Start listening on host (an address of this machine: a
// bridge the test made, for servers in network namespaces).
func StartOn(ctx context.Context, host string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lizard-vgw-")
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"data", "meta"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{Bucket: "lizard", AccessKey: "AK" + token(9), SecretKey: token(20), bin: bin, dir: dir}
	var last error
	for port := FirstPort; port <= LastPort; port++ {
		lock := holdPort(host, port)
		if lock == nil {
			continue
		}
		if !free(host, port) {
			lock.Close()
			continue
		}
		s.Addr, s.port = net.JoinHostPort(host, strconv.Itoa(port)), lock
		if last = s.Start(ctx); last == nil {
			break
		}
		lock.Close()
		s.Addr, s.port = "", nil
	}
	if s.Addr == "" {
		os.RemoveAll(dir)
		if last == nil {
			last = fmt.Errorf("no free port in %d-%d", FirstPort, LastPort)
		}
		return nil, fmt.Errorf("versitygw: %w", last)
	}
	if err := s.client().MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{}); err != nil {
		s.Close()
		return nil, fmt.Errorf("versitygw: make bucket: %w", err)
	}
	return s, nil
}

func token(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// holdPort locks host's port for this process's gateway (nil: another
// holds it); closing the file lets it go, and so does the process's end.
func holdPort(host string, port int) *os.File {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), fmt.Sprintf("lizard-vgw-%s-%d.lock", host, port)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil
	}
	return f
}

func free(host string, port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// URL is the --object-store URL of the bucket, with prefix (may be "")
// before every key. The credentials are not in it: see Env.
func (s *Server) URL(prefix string) string {
	u := "s3://" + s.Bucket
	if prefix != "" {
		u += "/" + prefix
	}
	return u + "?endpoint=" + s.Addr + "&region=us-east-1&insecure=true"
}

// Env are the environment variables that give a client the credentials.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}

// SetEnv sets Env in the test's environment (restored when it ends), where
// the server's S3 clients find the credentials.
func (s *Server) SetEnv(t testing.TB) {
	t.Helper()
	for _, e := range s.Env() {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
}

func (s *Server) client() *minio.Client {
	c, _ := minio.New(s.Addr, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1"})
	return c
}

// Start starts the stopped gateway again on the same port and data; it
// returns once the gateway answers. Start of a running gateway is a no-op.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(s.bin, "--port", s.Addr, "--region", "us-east-1", "--quiet",
		"posix", "--sidecar", filepath.Join(s.dir, "meta"), filepath.Join(s.dir, "data"))
	// Metadata (ETags, which multipart uploads need) in a sidecar
	// directory: the temp dir may be on a filesystem without user xattrs.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
			s.cmd, s.done = cmd, done
			return nil
		}
		select {
		case <-done:
			out, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			return fmt.Errorf("versitygw exited at start: %s", tail(out))
		case <-ctx.Done():
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("versitygw did not listen on %s: %w", s.Addr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 2000 {
		return b[len(b)-2000:]
	}
	return b
}

// Stop kills the gateway, keeping its data; connections in flight fail.
// Stop of a stopped gateway is a no-op.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Path is where the POSIX backend keeps key's object: tests corrupt or
// truncate objects there. prefix is the URL's.
func (s *Server) Path(key string) string {
	return filepath.Join(s.dir, "data", s.Bucket, filepath.FromSlash(key))
}

// Close stops the gateway, lets its port go and removes its data.
func (s *Server) Close() error {
	s.Stop()
	if s.port != nil {
		s.port.Close()
	}
	return os.RemoveAll(s.dir)
}

// New starts a gateway for t, closed when t ends. t is skipped when
// versitygw is not installed (scripts/install-deps.sh installs it).
func New(t testing.TB) *Server { t.Helper(); return NewOn(t, "127.0.0.1") }

// NewOn is New listening on host.
func NewOn(t testing.TB, host string) *Server {
	t.Helper()

	gw, err := StartOn(context.Background(), host)
	if errors.Is(err, ErrNoVersitygw) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	return gw
}
