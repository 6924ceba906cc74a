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
