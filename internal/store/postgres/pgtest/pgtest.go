// Package pgtest starts a PostgreSQL server of a test's own: a cluster made
// by initdb in a temporary directory, reached only through a unix socket in
// that directory (no TCP port), stopped and removed at the end. The store's
// backend tests and the end-to-end harness use it; nothing else may.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/lizard-build/lizard/internal/store"
)

// BinDir is where Debian's postgresql-15 puts initdb and pg_ctl;
// $LIZARD_PG_BIN overrides it.
const BinDir = "/usr/lib/postgresql/15/bin"

// ErrNoPostgres is returned by Start when initdb or pg_ctl is missing.
var ErrNoPostgres = errors.New("PostgreSQL server binaries not found (install postgresql-15: scripts/install-deps.sh, or set LIZARD_PG_BIN)")

// port names the socket file; with no TCP listener it is private anyway.
const port = 5432

// Server is a running PostgreSQL cluster. Its superuser is postgres, with
// trust authentication on the socket.
type Server struct {
	dir string   // holds data/, the socket and log
	bin string   // initdb's and pg_ctl's directory
	run []string // runuser … when root
	// tcp, when valid, is the one TCP address the server also listens on
	// (StartTCP); URLs then use it.
	tcp netip.AddrPort
	up  bool // between Up and Down
}

// Start makes and starts a cluster. As root, the server runs as the
// postgres user (initdb refuses root).
func Start(ctx context.Context) (*Server, error) {
	return start(ctx, netip.AddrPort{}, netip.Prefix{})
}

// StartTCP is Start with the server also listening on addr (an address of
// a bridge of the test's own, never a wildcard) and trusting connections
// from clients in allow: for tests whose servers run in network namespaces
// of their own and must reach the database over the network (and lose it
// to a firewall rule).
func StartTCP(ctx context.Context, addr netip.AddrPort, allow netip.Prefix) (*Server, error) {
	if !addr.IsValid() || addr.Addr().IsUnspecified() || !allow.IsValid() {
		return nil, fmt.Errorf("pgtest: listen address %s, clients %s: want one address and a prefix", addr, allow)
	}
	return start(ctx, addr, allow)
}

func start(ctx context.Context, tcp netip.AddrPort, allow netip.Prefix) (*Server, error) {
	bin := os.Getenv("LIZARD_PG_BIN")
	if bin == "" {
		bin = BinDir
	}
	for _, b := range []string{"initdb", "pg_ctl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(bin, b), ErrNoPostgres)
		}
	}
	dir, err := os.MkdirTemp("", "lizard-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin, tcp: tcp}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs the postgres user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.run = []string{"runuser", "-u", "postgres", "--"}
	}
	data := filepath.Join(dir, "data")
	if err := s.cmd(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if allow.IsValid() {
		hba := fmt.Sprintf("host all all %s trust\n", allow.Masked())
		f, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(hba)
			f.Close()
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := s.Up(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Up starts the server on its data directory: at Start, and again after
// Down.
func (s *Server) Up(ctx context.Context) error {
	listen, p := "", port
	if s.tcp.IsValid() {
		listen, p = s.tcp.Addr().String(), int(s.tcp.Port())
	}
	opts := fmt.Sprintf("-c listen_addresses='%s' -k %s -p %d -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off", listen, s.dir, p)
	if err := s.cmd(ctx, filepath.Join(s.bin, "pg_ctl"), "-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "log"), "-o", opts, "-w", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		return fmt.Errorf("%w\n%s", err, log)
	}
	s.up = true
	return nil
}

// Down stops the server and keeps its data, for tests of a database
// outage: clients' connections are cut and new ones refused until Up. It
// is a fast shutdown, not an immediate one: with synchronous_commit off an
// immediate stop would lose the last commits.
func (s *Server) Down(ctx context.Context) error { return s.stop(ctx, "fast") }

func (s *Server) stop(ctx context.Context, mode string) error {
	s.up = false
	return s.cmd(ctx, filepath.Join(s.bin, "pg_ctl"), "-D", filepath.Join(s.dir, "data"), "-m", mode, "-w", "stop")
}

func (s *Server) cmd(ctx context.Context, name string, args ...string) error {
	argv := append(append(append([]string{}, s.run...), name), args...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, out)
	}
	return nil
}

// URL is the connection URL of database name on the server.
func (s *Server) URL(name string) string {
	if s.tcp.IsValid() {
		return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.tcp, name)
	}
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", name, url.QueryEscape(s.dir), port)
}

// NewDatabase creates an empty database with a name of its own and returns
// its URL.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	name := store.NewID("lizard_", 12)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return s.URL(name), nil
}

// Stop stops the server at once and removes its directory.
func (s *Server) Stop() error {
	var err error
	if s.up {
		err = s.stop(context.Background(), "immediate")
	}
	if rerr := os.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	return err
}

// ForTest starts a server for t and stops it when t ends; it skips t, with
// the reason, only when the binaries are missing.
func ForTest(t testing.TB) *Server {
	t.Helper()
	s, err := Start(context.Background())
	if errors.Is(err, ErrNoPostgres) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	return s
}
