package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/lizard-build/lizard/internal/slowness"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// LIZARD_E2E_DATABASE=postgres runs every server of the tests on
// PostgreSQL: one server for the test binary (pgtest, started at the first
// server), a fresh database per data directory, so that a restart over a
// data directory finds its state again. Unset: SQLite in the data dir.
var pg struct {
	once sync.Once
	srv  *pgtest.Server
	err  error
	mu   sync.Mutex
	dbs  map[string]string // data dir → database URL
}

func TestMain(m *testing.M) {
	// Read here, once: a LIZARD_TEST_SLOWNESS that is not a number stops
	// the run before any test.
	fmt.Printf("e2e: fixed waits are %.2f times their nominal length (%s, measured by scripts/test.sh)\n", slowness.Factor(), slowness.Env)
	code := m.Run()
	if line := slowest(12); line != "" {
		// go test shows a passing package's output only with -v:
		// scripts/test.sh reads the file.
		fmt.Println(line)
		if f := os.Getenv("LIZARD_E2E_TIMES"); f != "" {
			if err := appendLine(f, line); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: write the tests' times:", err)
			}
		}
	}
	if err := removeTestNetworks(); err != nil {
		fmt.Fprintln(os.Stderr, "remove the tests' networks:", err)
		code = 1
	}
	if pg.srv != nil {
		if err := pg.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop postgres:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// databaseFor is the --database of a server on dataDir: "" for SQLite.
func databaseFor(t *testing.T, dataDir string) string {
	t.Helper()
	switch kind := os.Getenv("LIZARD_E2E_DATABASE"); kind {
	case "", "sqlite":
		return ""
	case "postgres":
	default:
		t.Fatalf("LIZARD_E2E_DATABASE=%q: want sqlite or postgres", kind)
	}
	pg.once.Do(func() { pg.srv, pg.err = pgtest.Start(context.Background()) })
	if pg.err != nil {
		t.Fatalf("LIZARD_E2E_DATABASE=postgres: %v", pg.err)
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if url, ok := pg.dbs[dataDir]; ok {
		return url
	}
	url, err := pg.srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if pg.dbs == nil {
		pg.dbs = map[string]string{}
	}
	pg.dbs[dataDir] = url
	return url
}

// stateArgs are the flags that name a server's state to the CLI.
func (s *server) stateArgs() []string {
	args := []string{"--data-dir", s.dataDir}
	if s.db != "" {
		args = append(args, "--database", s.db)
	}
	return args
}
