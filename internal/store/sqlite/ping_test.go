package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestPing: a store answers while its file is the one it opened; a file
// moved away or replaced, or a closed store, does not.
func TestPing(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "lizard.db")
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("Ping of an open store: %v", err)
	}
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err == nil {
		t.Fatal("Ping with the file moved away: no error")
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err == nil {
		t.Fatal("Ping with the file replaced: no error")
	}
	if err := os.Rename(path+".away", path); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("Ping with the file back: %v", err)
	}
	st.Close()
	if err := st.Ping(ctx); err == nil {
		t.Fatal("Ping of a closed store: no error")
	}
}
