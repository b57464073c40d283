package imagebuild

import (
	"archive/tar"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

var (
	bigBody  = strings.Repeat("0123456789", 20000)
	longName = strings.Repeat("n", 150) // written with a PAX header
)

// sample is a build context with a bit of everything.
func sample(t *testing.T) []byte {
	return mkTar(t,
		tent{name: "README", body: "read me\n"},
		tent{name: "app/", typ: tar.TypeDir},
		tent{name: "app/main.py", body: "print(1)\n", mode: 0o755, uid: 1000},
		tent{name: "app/lib/util.py", body: "def f(): pass\n"}, // app/lib is implied
		tent{name: "app/self", typ: tar.TypeSymlink, link: "../README"},
		tent{name: "app/passwd", typ: tar.TypeSymlink, link: "/etc/passwd"},
		tent{name: "app/hard", typ: tar.TypeLink, link: "app/main.py"},
		tent{name: "app/lib/readme", typ: tar.TypeLink, link: "README"},
		tent{name: "link-to-app", typ: tar.TypeSymlink, link: "app"},
		tent{name: "chain", typ: tar.TypeSymlink, link: "link-to-app/lib/../main.py"},
		tent{name: "escape", typ: tar.TypeSymlink, link: "../outside"},
		tent{name: "abs", typ: tar.TypeSymlink, link: "/etc"},
		tent{name: "up", typ: tar.TypeSymlink, link: ".."},
		tent{name: "loop", typ: tar.TypeSymlink, link: "loop"},
		tent{name: "dangling", typ: tar.TypeSymlink, link: "nowhere"},
		tent{name: "docs/a.md", body: "a"},
		tent{name: "docs/b.md", body: "b"},
		tent{name: "docs/c.txt", body: "c"},
		tent{name: "docs/sub/", typ: tar.TypeDir},
		tent{name: "docs/sub/d.md", body: "d"},
		tent{name: "big", body: bigBody},
		tent{name: "long/" + longName, body: "after a PAX header"},
	)
}

// extract reads what s.Extract(dest) streams, one entry a line.
func extract(t *testing.T, s *Selection, dest string) (string, []string) {
	t.Helper()
	root, r, err := s.Extract(dest)
	if err != nil {
		t.Fatalf("Extract(%s): %v", dest, err)
	}
	defer r.Close()
	var out []string
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read the stream: %v", err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("read %s: %v", hdr.Name, err)
		}
		e := fmt.Sprintf("%s %c %o", hdr.Name, hdr.Typeflag, hdr.Mode)
		if hdr.Linkname != "" {
			e += " -> " + hdr.Linkname
		}
		if len(body) > 40 {
			e += fmt.Sprintf(" (%d bytes, sha256 %.8x)", len(body), sha256.Sum256(body))
		} else if len(body) > 0 {
			e += fmt.Sprintf(" %q", body)
		}
		out = append(out, e)
	}
	return root, out
}

func TestSelect(t *testing.T) {
	c := OpenContexts(t.TempDir())
	id := put(t, c, sample(t))
	appContents := []string{
		"main.py 0 755 \"print(1)\\n\"",
		"lib/util.py 0 644 \"def f(): pass\\n\"",
		"self 2 644 -> ../README",
		"passwd 2 644 -> /etc/passwd",
		"hard 1 644 -> main.py",
		"lib/readme 0 644 \"read me\\n\"",
	}
	for _, tc := range []struct {
		src  string
		dir  bool
		name string
		want []string
	}{
		{"README", false, "README", []string{"README 0 644 \"read me\\n\""}},
		{"/README", false, "README", []string{"README 0 644 \"read me\\n\""}},
		{"app", true, "", appContents},
		{"app/", true, "", appContents},
		{"./app", true, "", appContents},
		{"/app/", true, "", appContents},
		{"app/lib", true, "", []string{"util.py 0 644 \"def f(): pass\\n\"", "readme 0 644 \"read me\\n\""}},
		{"app/lib/util.py", false, "util.py", []string{"util.py 0 644 \"def f(): pass\\n\""}},
		{"link-to-app", true, "", appContents},
		{"link-to-app/main.py", false, "main.py", []string{"main.py 0 755 \"print(1)\\n\""}},
		{"app/self", false, "self", []string{"self 0 644 \"read me\\n\""}},
		{"chain", false, "chain", []string{"chain 0 755 \"print(1)\\n\""}},
		{"app/hard", false, "hard", []string{"hard 0 644 \"print(1)\\n\""}},
		{"app/../docs/a.md", false, "a.md", []string{"a.md 0 644 \"a\""}},
		{"docs/*.md", true, "", []string{"a.md 0 644 \"a\"", "b.md 0 644 \"b\""}},
		{"docs/c*", false, "c.txt", []string{"c.txt 0 644 \"c\""}},
		{"docs/s*", true, "", []string{"d.md 0 644 \"d\""}},
		{"*/*.py", false, "main.py", []string{"main.py 0 755 \"print(1)\\n\""}},
		{"link-to-app/*.py", false, "main.py", []string{"main.py 0 755 \"print(1)\\n\""}},
		{"big", false, "big", []string{fmt.Sprintf("big 0 644 (200000 bytes, sha256 %.8x)", sha256.Sum256([]byte(bigBody)))}},
		{"long", true, "", []string{longName + ` 0 644 "after a PAX header"`}},
	} {
		t.Run(tc.src, func(t *testing.T) {
			s, err := c.Select(id, tc.src)
			if err != nil {
				t.Fatalf("Select: %v", err)
			}
			if s.Dir != tc.dir || s.Name != tc.name {
				t.Errorf("Dir %v Name %q, want %v %q", s.Dir, s.Name, tc.dir, tc.name)
			}
			root, got := extract(t, s, "/dest/")
			if root != "/dest" {
				t.Errorf("root %q, want /dest", root)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stream holds\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if !strings.HasPrefix(s.Digest, "sha256:") || len(s.Digest) != 71 {
				t.Errorf("digest %q is not sha256:<hex>", s.Digest)
			}
		})
	}
}

func TestSelectWholeContext(t *testing.T) {
	c := OpenContexts(t.TempDir())
	id := put(t, c, mkTar(t,
		tent{name: "./", typ: tar.TypeDir},
		tent{name: "./a", body: "1"},
		tent{name: "./d/", typ: tar.TypeDir, mode: 0o700},
		tent{name: "./d/b", body: "2"}))
	for _, src := range []string{".", "/", "./", "d/.."} {
		s, err := c.Select(id, src)
		if err != nil {
			t.Fatalf("Select(%q): %v", src, err)
		}
		_, got := extract(t, s, "/srv")
		want := []string{`a 0 644 "1"`, "d/ 5 700", `d/b 0 644 "2"`}
		if !s.Dir || !reflect.DeepEqual(got, want) {
			t.Errorf("Select(%q): Dir %v, stream %q, want %q", src, s.Dir, got, want)
		}
	}
}

func TestSelectRefuses(t *testing.T) {
	c := OpenContexts(t.TempDir())
	id := put(t, c, sample(t))
	for _, tc := range []struct {
		src string
		is  error
		msg string
	}{
		{"../x", errdefs.ErrInvalid, "COPY source ../x is outside the build context"},
		{"app/../../x", errdefs.ErrInvalid, "COPY source app/../../x is outside the build context"},
		{"escape", errdefs.ErrInvalid, "symlink escape -> ../outside leads outside the build context"},
		{"escape/x", errdefs.ErrInvalid, "symlink escape -> ../outside leads outside the build context"},
		{"abs/passwd", errdefs.ErrInvalid, "symlink abs -> /etc leads outside the build context"},
		{"up/x", errdefs.ErrInvalid, "symlink up -> .. leads outside the build context"},
		{"app/passwd", errdefs.ErrInvalid, "symlink app/passwd -> /etc/passwd leads outside"},
		{"loop", errdefs.ErrInvalid, "too many levels of symlinks"},
		{"a\x00b", errdefs.ErrInvalid, "NUL byte"},
		{"docs/[", errdefs.ErrInvalid, "is not a valid pattern"},
		{"README/", errdefs.ErrInvalid, "COPY source README/ is not a directory"},
		{"missing", errdefs.ErrNotFound, "COPY source missing is not in the build context"},
		{"app/missing.py", errdefs.ErrNotFound, "COPY source app/missing.py is not in the build context"},
		{"README/x", errdefs.ErrNotFound, "COPY source README/x is not in the build context"},
		{"dangling", errdefs.ErrNotFound, "COPY source dangling is not in the build context"},
		{"docs/*.rs", errdefs.ErrNotFound, "COPY source docs/*.rs matches nothing"},
	} {
		t.Run(tc.src, func(t *testing.T) {
			s, err := c.Select(id, tc.src)
			if err == nil {
				t.Fatalf("Select gave %+v, want an error", s)
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Select: %v, want %v saying %q", err, tc.is, tc.msg)
			}
		})
	}
}

func TestSelectDigest(t *testing.T) {
	c := OpenContexts(t.TempDir())
	base := []tent{
		{name: "app/main.py", body: "print(1)\n"},
		{name: "app/link", typ: tar.TypeSymlink, link: "main.py"},
		{name: "README", body: "read me\n"},
	}
	digest := func(src string, edit func([]tent)) string {
		t.Helper()
		ents := append([]tent(nil), base...)
		if edit != nil {
			edit(ents)
		}
		s, err := c.Select(put(t, c, mkTar(t, ents...)), src)
		if err != nil {
			t.Fatalf("Select: %v", err)
		}
		return s.Digest
	}
	app := digest("app", nil)
	if again := digest("app", nil); again != app {
		t.Fatalf("the same content gives digests %s and %s", app, again)
	}
	for _, tc := range []struct {
		name    string
		edit    func([]tent)
		changes bool
	}{
		{"one byte of a file", func(e []tent) { e[0].body = "print(2)\n" }, true},
		{"a mode", func(e []tent) { e[0].mode = 0o600 }, true},
		{"an owner", func(e []tent) { e[0].uid = 1000 }, true},
		{"a symlink target", func(e []tent) { e[1].link = "other.py" }, true},
		{"a name", func(e []tent) { e[0].name = "app/main2.py"; e[1].link = "main2.py" }, true},
		{"only a modification time", func(e []tent) { e[0].time = time.Unix(1800000000, 0) }, false},
		{"a file outside the source", func(e []tent) { e[2].body = "changed" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := digest("app", tc.edit); (got != app) != tc.changes {
				t.Fatalf("digest %s, was %s; want a change: %v", got, app, tc.changes)
			}
		})
	}
	if digest("app/main.py", nil) == digest("README", func(e []tent) { e[2].body = "print(1)\n" }) {
		t.Errorf("two files of the same bytes under different names have one digest")
	}
	if digest("app/", nil) != app {
		t.Errorf("app and app/ select different things")
	}
}

func TestExtractPlacement(t *testing.T) {
	c := OpenContexts(t.TempDir())
	id := put(t, c, sample(t))
	file, err := c.Select(id, "README")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := c.Select(id, "docs")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		s       *Selection
		dest    string
		root    string
		first   string
		targets []string
	}{
		{"file into a directory", file, "/etc/app/", "/etc/app", "README", []string{"/etc/app/README"}},
		{"file to a new name", file, "/etc/app/README.md", "/etc/app", "README.md", []string{"/etc/app/README.md"}},
		{"file to the root", file, "/", "/", "README", []string{"/README"}},
		{"directory", dir, "/srv/docs", "/srv/docs", "a.md", []string{"/srv/docs/a.md", "/srv/docs/b.md", "/srv/docs/c.txt", "/srv/docs/sub"}},
		{"directory with a slash", dir, "/srv/docs/", "/srv/docs", "a.md", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, entries := extract(t, tc.s, tc.dest)
			if root != tc.root || len(entries) == 0 || !strings.HasPrefix(entries[0], tc.first+" ") {
				t.Fatalf("Extract(%s) = %s %q, want root %s and first entry %s", tc.dest, root, entries, tc.root, tc.first)
			}
			if tc.targets == nil {
				return
			}
			targets, err := tc.s.Targets(tc.dest)
			if err != nil || !reflect.DeepEqual(targets, tc.targets) {
				t.Fatalf("Targets(%s) = %q %v, want %q", tc.dest, targets, err, tc.targets)
			}
		})
	}
	if _, _, err := file.Extract("relative/path"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Extract to a relative path: %v, want ErrInvalid", err)
	}
	if err := c.Remove(id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := file.Extract("/x/"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Extract after Remove: %v, want ErrNotFound", err)
	}
}
