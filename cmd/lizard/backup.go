package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lizard-build/lizard/internal/backup"
)

// backupCmd runs `lizard backup FILE`: an archive of the data directory
// (database, snapshot images, volume images), taken while the server runs.
// FILE is written under a temporary name and renamed when complete.
func backupCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory to back up")
	database := fs.String("database", "", databaseUsage)
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	if err := sqliteOnly("backup", *database); err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: lizard backup FILE [--data-dir DIR]")
	}
	if _, err := os.Stat(filepath.Join(*dataDir, "lizard.db")); err != nil {
		return fmt.Errorf("no lizard database in %s: %w", *dataDir, err)
	}
	st, err := openSQLite(*dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	out := pos[0]
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	m, err := backup.Create(ctx, backup.Options{
		DataDir: *dataDir, Store: st,
		Warn: func(s string) { fmt.Fprintln(os.Stderr, "warning:", s) },
	}, tmp)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Printf("backup of %s written to %s: schema version %d, %d projects, %d snapshots, %d volumes",
		*dataDir, out, m.SchemaVersion, m.Projects, len(m.Snapshots), len(m.Volumes))
	if len(m.Sandboxes) > 0 {
		fmt.Printf(" (%d running sandboxes are not part of a backup)", len(m.Sandboxes))
	}
	fmt.Println()
	return nil
}

// restoreCmd runs `lizard restore FILE --data-dir DIR`: it unpacks a backup
// into an empty (or new) data directory for `lizard serve --data-dir DIR`.
func restoreCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory to restore into: new or empty")
	database := fs.String("database", "", databaseUsage)
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	if err := sqliteOnly("restore", *database); err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: lizard restore FILE [--data-dir DIR]")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := backup.Restore(ctx, f, *dataDir)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	fmt.Printf("restored the backup of %s into %s: %d projects, %d snapshots, %d volumes; start it with lizard serve --data-dir %s\n",
		m.CreatedAt.Format("2006-01-02 15:04:05Z"), *dataDir, m.Projects, len(m.Snapshots), len(m.Volumes), *dataDir)
	return nil
}
