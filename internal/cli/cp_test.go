package cli

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestParseCpArgs(t *testing.T) {
	tests := []struct {
		name     string
		src, dst string
		from, to cpSpec
		wantErr  string // part of the message; "" for success
	}{
		{name: "upload", src: "./a.txt", dst: "sbx1:/root/a.txt",
			from: cpSpec{path: "a.txt"}, to: cpSpec{sandbox: "sbx1", path: "/root/a.txt"}},
		{name: "upload into a directory", src: "dir/", dst: "sbx1:/root/",
			from: cpSpec{path: "dir", dirHint: true}, to: cpSpec{sandbox: "sbx1", path: "/root", dirHint: true}},
		{name: "download", src: "sbx7k2m:/var/log/../log/x", dst: ".",
			from: cpSpec{sandbox: "sbx7k2m", path: "/var/log/x"}, to: cpSpec{path: "."}},
		{name: "stdin", src: "-", dst: "sbx1:/tmp/in",
			from: cpSpec{path: "-"}, to: cpSpec{sandbox: "sbx1", path: "/tmp/in"}},
		{name: "stdout", src: "sbx1:/etc/hostname", dst: "-",
			from: cpSpec{sandbox: "sbx1", path: "/etc/hostname"}, to: cpSpec{path: "-"}},
		{name: "the sandbox root", src: "sbx1:/", dst: "out",
			from: cpSpec{sandbox: "sbx1", path: "/"}, to: cpSpec{path: "out"}},
		{name: "a colon in a local path", src: "./a:b", dst: "sbx1:/x",
			from: cpSpec{path: "a:b"}, to: cpSpec{sandbox: "sbx1", path: "/x"}},
		{name: "an upper-case prefix is local", src: "Notes:/x", dst: "sbx1:/x",
			from: cpSpec{path: "Notes:/x"}, to: cpSpec{sandbox: "sbx1", path: "/x"}},
		{name: "relative sandbox path", src: "a", dst: "sbx1:root/a", wantErr: "must be absolute"},
		{name: "empty sandbox path", src: "a", dst: "sbx1:", wantErr: "must be absolute"},
		{name: "both in sandboxes", src: "sbx1:/a", dst: "sbx2:/a", wantErr: "both sides are in sandboxes"},
		{name: "both local", src: "a", dst: "b", wantErr: "neither side is in a sandbox"},
		{name: "stdin to stdout", src: "-", dst: "-", wantErr: "neither side is in a sandbox"},
		{name: "empty", src: "", dst: "sbx1:/a", wantErr: "empty path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, to, err := parseCpArgs(tc.src, tc.dst)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("got %v, want an invalid-argument error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || from != tc.from || to != tc.to {
				t.Fatalf("got %+v %+v %v, want %+v %+v", from, to, err, tc.from, tc.to)
			}
		})
	}
}

// makeTree writes a small tree: files with two modes, a symlink and an
// empty directory.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	for _, step := range []error{
		os.MkdirAll(filepath.Join(dir, "bin"), 0o755),
		os.Mkdir(filepath.Join(dir, "empty"), 0o755),
		os.WriteFile(filepath.Join(dir, "a.txt"), []byte("A\n"), 0o644),
		os.WriteFile(filepath.Join(dir, "bin", "run.sh"), []byte("#!/bin/sh\necho run\n"), 0o755),
		os.Symlink("a.txt", filepath.Join(dir, "link")),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
}

// checkTree checks that dir holds what makeTree wrote.
func checkTree(t *testing.T, dir string) {
	t.Helper()
	for name, want := range map[string]struct {
		data string
		mode fs.FileMode
	}{"a.txt": {"A\n", 0o644}, "bin/run.sh": {"#!/bin/sh\necho run\n", 0o755}} {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != want.data {
			t.Errorf("%s: %q %v", name, b, err)
			continue
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != want.mode {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode().Perm(), want.mode)
		}
	}
	if l, err := os.Readlink(filepath.Join(dir, "link")); err != nil || l != "a.txt" {
		t.Errorf("link: %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "empty")); err != nil || !fi.IsDir() {
		t.Errorf("empty: %v", err)
	}
}

func TestCpDirectoryRoundTrip(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	f.mu.Lock()
	f.mkdirAll("/root")
	f.mu.Unlock()
	tmp := t.TempDir()
	src := filepath.Join(tmp, "proj")
	makeTree(t, src)

	// Into an existing directory: it lands as /root/proj.
	if _, _, err := f.run(t, "", "cp", src, "sbx1:/root"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := map[string]string{}
	for p, file := range f.files {
		if rest, ok := strings.CutPrefix(p, "/root/proj/"); ok {
			got[rest] = string(file.data) + file.link + " " + file.mode.String()
		}
	}
	f.mu.Unlock()
	want := map[string]string{"a.txt": "A\n -rw-r--r--", "bin": " -rwxr-xr-x", "bin/run.sh": "#!/bin/sh\necho run\n -rwxr-xr-x",
		"empty": " -rwxr-xr-x", "link": "a.txt -rwxrwxrwx"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("sandbox /root/proj/%s: %q, want %q", k, got[k], v)
		}
	}

	// Back out to a new directory: it becomes that directory.
	out := filepath.Join(tmp, "out")
	if _, _, err := f.run(t, "", "cp", "sbx1:/root/proj", out); err != nil {
		t.Fatal(err)
	}
	checkTree(t, out)

	// And into an existing one: it lands inside.
	if _, _, err := f.run(t, "", "cp", "sbx1:/root/proj", out); err != nil {
		t.Fatal(err)
	}
	checkTree(t, filepath.Join(out, "proj"))

	// A directory over a file is refused.
	if _, _, err := f.run(t, "", "cp", "sbx1:/root/proj", filepath.Join(out, "a.txt")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("directory over a file: %v", err)
	}
}

func TestCpFiles(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	tmp := t.TempDir()
	local := filepath.Join(tmp, "secret.conf")
	if err := os.WriteFile(local, []byte("key=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A trailing slash names a directory, made as needed.
	if _, _, err := f.run(t, "", "cp", local, "sbx1:/etc/app/"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	file := f.files["/etc/app/secret.conf"]
	f.mu.Unlock()
	if file == nil || string(file.data) != "key=1\n" || file.mode != 0o600 {
		t.Fatalf("sandbox file %+v", file)
	}

	// Out into an existing directory, keeping the mode.
	dl := filepath.Join(tmp, "dl")
	if err := os.Mkdir(dl, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.run(t, "", "cp", "sbx1:/etc/app/secret.conf", dl); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dl, "secret.conf"))
	fi, _ := os.Stat(filepath.Join(dl, "secret.conf"))
	if err != nil || string(b) != "key=1\n" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("local copy %q %v", b, err)
	}

	// stdin in, stdout out.
	if _, _, err := f.run(t, "from stdin\n", "cp", "-", "sbx1:/tmp/in.txt"); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := f.run(t, "", "cp", "sbx1:/tmp/in.txt", "-")
	if err != nil || stdout != "from stdin\n" {
		t.Fatalf("stdout %q %v", stdout, err)
	}

	// A directory to stdout is a tar stream of its contents.
	stdout, _, err = f.run(t, "", "cp", "sbx1:/etc", "-")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(strings.NewReader(stdout))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if !slices.Equal(names, []string{"app/", "app/secret.conf"}) {
		t.Fatalf("tar entries %q", names)
	}

	for name, args := range map[string][]string{
		"missing local source":  {"cp", filepath.Join(tmp, "nope"), "sbx1:/x"},
		"missing sandbox path":  {"cp", "sbx1:/nope", tmp},
		"missing local dir":     {"cp", "sbx1:/tmp/in.txt", filepath.Join(tmp, "nodir") + "/"},
		"stdin to a directory":  {"cp", "-", "sbx1:/etc"},
		"missing sandbox":       {"cp", local, "sbxnone:/x"},
		"one argument":          {"cp", local},
		"between two sandboxes": {"cp", "sbx1:/a", "sbx2:/b"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := f.run(t, "", args...)
			if ExitCode(err) != 2 {
				t.Fatalf("exit %d: %v", ExitCode(err), err)
			}
		})
	}
}

// tarOf builds an archive of the given headers; regular files get body.
func tarOf(t *testing.T, hdrs ...*tar.Header) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len("body"))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, "body")
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestExtractTarRefusesEscapes(t *testing.T) {
	reg := func(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: name} }
	sym := func(name, to string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: to}
	}
	tests := []struct {
		name string
		hdrs func(outside string) []*tar.Header
	}{
		{"dot-dot", func(string) []*tar.Header { return []*tar.Header{reg("../evil")} }},
		{"dot-dot inside", func(string) []*tar.Header { return []*tar.Header{reg("a/../../evil")} }},
		{"absolute", func(o string) []*tar.Header { return []*tar.Header{reg(filepath.Join(o, "evil"))} }},
		{"through a relative symlink", func(string) []*tar.Header { return []*tar.Header{sym("ln", ".."), reg("ln/evil")} }},
		{"through an absolute symlink", func(o string) []*tar.Header { return []*tar.Header{sym("ln", o), reg("ln/evil")} }},
		{"hard link out", func(string) []*tar.Header {
			return []*tar.Header{{Typeflag: tar.TypeLink, Name: "hl", Linkname: "../evil"}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			outside := t.TempDir()
			dest := filepath.Join(outside, "dest")
			if err := os.Mkdir(dest, 0o755); err != nil {
				t.Fatal(err)
			}
			err := extractTar(tarOf(t, tc.hdrs(outside)...), dest, io.Discard)
			if err == nil {
				t.Fatal("extracted an archive that writes outside its destination")
			}
			if _, serr := os.Lstat(filepath.Join(outside, "evil")); !errors.Is(serr, fs.ErrNotExist) {
				t.Fatalf("a file was written outside: %v", serr)
			}
		})
	}
}

func TestExtractTar(t *testing.T) {
	dest := t.TempDir()
	err := extractTar(tarOf(t,
		&tar.Header{Typeflag: tar.TypeDir, Name: "./"},
		&tar.Header{Typeflag: tar.TypeDir, Name: "./ro/", Mode: 0o555},
		&tar.Header{Typeflag: tar.TypeReg, Name: "./ro/f", Mode: 0o640},
		&tar.Header{Typeflag: tar.TypeReg, Name: "deep/er/g"},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "ln", Linkname: "ro/f"},
		&tar.Header{Typeflag: tar.TypeLink, Name: "hard", Linkname: "deep/er/g"},
		&tar.Header{Typeflag: tar.TypeFifo, Name: "fifo"},
	), dest, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "ln")); err != nil || string(b) != "body" {
		t.Fatalf("through the symlink: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "hard")); err != nil || string(b) != "body" {
		t.Fatalf("hard link: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "ro")); err != nil || fi.Mode().Perm() != 0o555 {
		t.Fatalf("read-only dir: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "ro", "f")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("file in it: %v %v", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "fifo")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a fifo was made: %v", err)
	}
	os.Chmod(filepath.Join(dest, "ro"), 0o755) // so that the test can clean up
}
