package sqlite

import (
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) func() (store.Store, error) {
		path := filepath.Join(t.TempDir(), "lizard.db")
		return func() (store.Store, error) { return Open(path) }
	})
}

func TestClusterConformance(t *testing.T) {
	storetest.RunCluster(t, func(t *testing.T) func() (store.Store, error) {
		path := filepath.Join(t.TempDir(), "lizard.db")
		return func() (store.Store, error) { return Open(path) }
	})
}
