// Package internal holds lizard's packages, one per concept
// (docs/ARCHITECTURE.md). Its only file is this test: every package of
// the module says what it is in a package comment.
package internal

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPackageComments fails for a package of the module (a directory of
// .go files, test-only ones included) none of whose files has a package
// comment that begins "Package <name>" ("Command <dir>" for a program), as
// godoc reads them.
func TestPackageComments(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module root %s has no go.mod: %v", root, err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if dir != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules" || name == "bin" || name == "dist") {
			return filepath.SkipDir
		}
		pkgs, err := parser.ParseDir(token.NewFileSet(), dir, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if len(pkgs) == 0 {
			return nil
		}
		checked++
		documented := false
		var names []string
		for pkgName, pkg := range pkgs {
			names = append(names, pkgName)
			for _, f := range pkg.Files {
				want := "Package " + strings.TrimSuffix(pkgName, "_test")
				if pkgName == "main" {
					want = "Command " + filepath.Base(dir)
				}
				if f.Doc != nil && strings.HasPrefix(f.Doc.Text(), want) {
					documented = true
				}
			}
		}
		if !documented {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("%s (package %s): no package comment beginning \"Package <name>\" or \"Command <dir>\"", rel, strings.Join(names, ", "))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 30 {
		t.Fatalf("only %d packages found under %s: the walk is broken", checked, root)
	}
}

// TestArchitectureImports keeps the package table of docs/ARCHITECTURE.md
// true: each package under internal/ has a row (or is below the row of a
// parent, as the generated envd packages are), and the row's last cell
// names exactly the lizard packages its non-test files import ("—" for
// none; words in parentheses are remarks; "envd" stands for envd's
// subpackages).
func TestArchitectureImports(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	// rows: package path (without "internal/") → the names in its cell.
	rows := map[string][]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(line, "| `internal/") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		names := cellNames(cells[len(cells)-1])
		for _, p := range strings.Split(cells[0], ",") {
			rows[strings.TrimPrefix(strings.Trim(strings.TrimSpace(p), "`"), "internal/")] = names
		}
	}
	if len(rows) < 30 {
		t.Fatalf("only %d rows found in the package table: the parse is broken", len(rows))
	}
	// rowOf is the row that covers package p: its own, or its nearest
	// parent's.
	rowOf := func(p string) string {
		for q := p; q != "."; q = filepath.Dir(q) {
			if _, ok := rows[q]; ok {
				return q
			}
		}
		return ""
	}
	imports := map[string]map[string]bool{} // row → what its packages import, as rows
	err = filepath.WalkDir(filepath.Join(root, "internal"), func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(filepath.Join(root, "internal"), dir)
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if len(pkgs) == 0 {
			return nil
		}
		row := rowOf(rel)
		if row == "" {
			t.Errorf("internal/%s has no row in docs/ARCHITECTURE.md's package table", rel)
			return nil
		}
		if imports[row] == nil {
			imports[row] = map[string]bool{}
		}
		for _, pkg := range pkgs {
			for _, f := range pkg.Files {
				for _, imp := range f.Imports {
					path := strings.Trim(imp.Path.Value, `"`)
					name, ok := strings.CutPrefix(path, "github.com/lizard-build/lizard/internal/")
					if !ok {
						continue
					}
					if r := rowOf(name); r != row {
						imports[row][r] = true
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for row, names := range rows {
		got := imports[row]
		for _, n := range names {
			if !got[n] {
				t.Errorf("internal/%s: the table says it imports %s; it does not", row, n)
			}
		}
		for n := range got {
			if !slices.Contains(names, n) {
				t.Errorf("internal/%s imports %s; the table's row does not say so", row, n)
			}
		}
	}
}

// cellNames are the package names of an imports cell: "store, sandbox
// (statuses only), errdefs" → store, sandbox, errdefs; "—" → none.
func cellNames(cell string) []string {
	var names []string
	for _, item := range strings.Split(cell, ",") {
		if i := strings.Index(item, "("); i >= 0 {
			item = item[:i]
		}
		item = strings.TrimSpace(item)
		if item != "" && item != "—" {
			names = append(names, item)
		}
	}
	return names
}
