package airlock_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every package says what it provides in exactly one package comment.
func TestPackageDocs(t *testing.T) {
	docs := map[string]int{} // directory -> files with a package comment
	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		seen[dir] = true
		if f.Doc != nil {
			docs[dir]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range seen {
		if n := docs[dir]; n != 1 {
			t.Errorf("package %s has %d package comments, want 1", dir, n)
		}
	}
}

// Every package under cmd/ and internal/ has a row in docs/architecture.md's
// package table, so that the table cannot fall behind the tree.
func TestArchitectureTableComplete(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| `") {
			first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
			rows = append(rows, first)
		}
	}
	named := map[string]bool{}
	for _, first := range rows {
		for _, cell := range strings.Split(first, ",") {
			named[strings.Trim(strings.TrimSpace(cell), "`")] = true
		}
	}
	pkgs := map[string]bool{}
	for _, root := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				pkgs[filepath.ToSlash(filepath.Dir(path))] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages: is the test running at the repository's root?", len(pkgs))
	}
	for p := range pkgs {
		if !named[p] {
			t.Errorf("package %s has no row in docs/architecture.md's package table", p)
		}
	}
}
