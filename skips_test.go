package airlock_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// skipAllowed names the functions that may skip a test without
// internal/testenv, each with the reason: they skip only on a host unlike
// any make test runs on, which nothing make test installs could change.
// Every other skip goes through testenv.Lacking or testenv.Short, which
// fail under CI=true, so that CI cannot pass without having run the test.
// A key is a file (slash-separated, from the repository's root) and the
// function in it that skips.
var skipAllowed = map[string]string{
	"internal/gateway/tcp_test.go TestHostAddressDenied":      "needs one of the host's own IPv4 addresses besides loopback; a host without a network interface has none, and make test cannot make one",
	"internal/template/oci/pull_test.go nonLoopbackAddr":      "needs one of the host's own IPv4 addresses besides loopback; a host without a network interface has none, and make test cannot make one",
	"internal/template/oci/flatten_test.go TestFlattenXattrs": "needs user extended attributes in the test's temporary directory, which tmpfs takes only from Linux 6.6; make test cannot change the filesystem of /tmp",
}

// TestNoPlainSkips fails on a t.Skip, t.Skipf, t.SkipNow or
// testing.Short() outside internal/testenv that skipAllowed does not
// name, and on an entry of skipAllowed that names no such call.
func TestNoPlainSkips(t *testing.T) {
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		// testenv's own helpers are where skips belong.
		if filepath.Dir(path) == filepath.Join("internal", "testenv") && !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(path)] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("found %d Go files; is the test running in the repository's root?", len(files))
	}
	if problems := skipProblems(fset, files, skipAllowed); len(problems) > 0 {
		t.Errorf("a skip must go through testenv.Lacking (a missing prerequisite, which fails under CI) or testenv.Short, or be named in skipAllowed with its reason:\n%s", strings.Join(problems, "\n"))
	}
}

// TestSkipProblems shows that the check finds each kind of plain skip,
// leaves testenv's and allowed ones alone, and names stale entries.
func TestSkipProblems(t *testing.T) {
	tests := []struct {
		name  string
		src   string
		allow map[string]string
		want  []string
	}{
		{
			name: "t.Skip",
			src:  `func TestA(t *testing.T) { if x { t.Skip("no x") } }`,
			want: []string{`a_test.go:3: TestA calls t.Skip`},
		},
		{
			name: "Skipf in a helper",
			src:  "func need(tb testing.TB) {\n\ttb.Skipf(\"%s\", y)\n}",
			want: []string{`a_test.go:4: need calls tb.Skipf`},
		},
		{
			name: "SkipNow in a subtest",
			src:  `func TestA(t *testing.T) { t.Run("s", func(t *testing.T) { t.SkipNow() }) }`,
			want: []string{`a_test.go:3: TestA calls t.SkipNow`},
		},
		{
			name: "b.Skip in a benchmark",
			src:  `func BenchmarkA(b *testing.B) { b.Skip() }`,
			want: []string{`a_test.go:3: BenchmarkA calls b.Skip`},
		},
		{
			name: "testing.Short",
			src:  `func TestA(t *testing.T) { if testing.Short() { return } }`,
			want: []string{`a_test.go:3: TestA calls testing.Short`},
		},
		{
			name: "in a package-level function value",
			src:  `var need = func(t *testing.T) { t.Skip() }`,
			want: []string{`a_test.go:3: (package level) calls t.Skip`},
		},
		{
			name: "testenv",
			src:  `func TestA(t *testing.T) { testenv.Lacking(t, "no x"); testenv.Short(t, "slow") }`,
		},
		{
			name:  "allowed",
			src:   `func TestA(t *testing.T) { t.Skip("no x") }`,
			allow: map[string]string{"a_test.go TestA": "x is rare"},
		},
		{
			name:  "allowed in another function",
			src:   `func TestB(t *testing.T) { t.Skip("no x") }`,
			allow: map[string]string{"a_test.go TestA": "x is rare"},
			want:  []string{`a_test.go:3: TestB calls t.Skip`, `skipAllowed names a_test.go TestA, which does not skip`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "a_test.go", "package a\n\n"+tt.src+"\n", parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			got := skipProblems(fset, map[string]*ast.File{"a_test.go": f}, tt.allow)
			if !slices.Equal(got, tt.want) {
				t.Errorf("skipProblems = %q, want %q", got, tt.want)
			}
		})
	}
}

// skipProblems returns, sorted, one line per plain skip in files (keyed
// by path) that allow does not name, and one per entry of allow that
// names none.
func skipProblems(fset *token.FileSet, files map[string]*ast.File, allow map[string]string) []string {
	var problems []string
	used := map[string]bool{}
	for path, f := range files {
		for _, decl := range f.Decls {
			fn := "(package level)"
			if d, ok := decl.(*ast.FuncDecl); ok {
				fn = d.Name.Name
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, _ := sel.X.(*ast.Ident)
				isSkip := slices.Contains([]string{"Skip", "Skipf", "SkipNow"}, sel.Sel.Name)
				isShort := x != nil && x.Name == "testing" && sel.Sel.Name == "Short"
				if !isSkip && !isShort {
					return true
				}
				key := path + " " + fn
				if _, ok := allow[key]; ok {
					used[key] = true
					return true
				}
				recv := "…"
				if x != nil {
					recv = x.Name
				}
				problems = append(problems, fmt.Sprintf("%s:%d: %s calls %s.%s", path, fset.Position(call.Pos()).Line, fn, recv, sel.Sel.Name))
				return true
			})
		}
	}
	for key := range allow {
		if !used[key] {
			problems = append(problems, "skipAllowed names "+key+", which does not skip")
		}
	}
	slices.Sort(problems)
	return problems
}
