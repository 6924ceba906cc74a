package store

import (
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// ReadMigrations reads a backend's migrations: the files NNNN_what.sql of
// dir in fsys (embedded in the binary), numbered from 0001 without gaps.
// File N brings the schema from version N-1 to N; a backend applies each in
// a transaction that also records N, so that a migration is applied whole
// or not at all. A change of the schema is a new file, never an edit of an
// applied one, in each backend's migrations/ (each numbers its own).
func ReadMigrations(fsys fs.FS, dir string) ([]string, error) {
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents { // sorted by name
		num, _, _ := strings.Cut(e.Name(), "_")
		n, err := strconv.Atoi(num)
		if err != nil || n != len(out)+1 || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration %s: want %04d_NAME.sql", e.Name(), len(out)+1)
		}
		b, err := fs.ReadFile(fsys, dir+"/"+e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
	}
	return out, nil
}

// SchemaVersionOf is the version the migrations in dir of fsys bring a
// schema to: their number. They are embedded at build time and each
// backend's tests read them, so an error here is a broken build.
func SchemaVersionOf(fsys fs.FS, dir string) int {
	m, err := ReadMigrations(fsys, dir)
	if err != nil {
		panic(err)
	}
	return len(m)
}
