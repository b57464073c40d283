package oci

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestFlattenLayers checks that later layers change what earlier ones
// wrote: whiteouts, opaque directories and replacements.
func TestFlattenLayers(t *testing.T) {
	lower := newLayer(t,
		dirEntry("etc/"),
		fileEntry("etc/passwd", "root:x:0:0::/root:/bin/sh\n"),
		fileEntry("etc/gone", "lower"),
		dirEntry("opt/"),
		fileEntry("opt/old", "lower"),
		dirEntry("opt/sub/"),
		fileEntry("opt/sub/deep", "lower"),
		fileEntry("f2d", "a file that becomes a directory"),
		dirEntry("d2f/"),
		fileEntry("d2f/x", "in a directory that becomes a file"),
		dirEntry("keep/"),
		fileEntry("keep/same", "lower"),
	)
	upper := newLayer(t,
		whiteoutEntry("etc/gone"),
		fileEntry("opt/early", "upper, before the marker"),
		opaqueEntry("opt"),
		fileEntry("opt/new", "upper"),
		dirEntry("opt/sub/"),
		fileEntry("opt/sub/kept", "upper"),
		dirEntry("f2d/"),
		fileEntry("f2d/y", "upper"),
		fileEntry("d2f", "now a file"),
		fileEntry("keep/same", "upper"),
		fileEntry("usr/local/bin/tool", "no parent entries"),
		whiteoutEntry("never/existed"),
	)
	root := flattenTo(t, newImage(t, "linux", "amd64", v1.Config{}, lower, upper))

	if got := readFile(t, filepath.Join(root, "etc/passwd")); !strings.HasPrefix(got, "root:") {
		t.Errorf("etc/passwd = %q", got)
	}
	mustNotExist(t, filepath.Join(root, "etc/gone"))
	mustNotExist(t, filepath.Join(root, "etc/.wh.gone"))
	mustNotExist(t, filepath.Join(root, "opt/old"))
	mustNotExist(t, filepath.Join(root, "opt/sub/deep"))
	mustNotExist(t, filepath.Join(root, "opt/.wh..wh..opq"))
	for p, want := range map[string]string{
		"opt/early":          "upper, before the marker",
		"opt/new":            "upper",
		"opt/sub/kept":       "upper",
		"f2d/y":              "upper",
		"d2f":                "now a file",
		"keep/same":          "upper",
		"usr/local/bin/tool": "no parent entries",
	} {
		if got := readFile(t, filepath.Join(root, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if !lstat(t, filepath.Join(root, "f2d")).IsDir() {
		t.Error("f2d is not a directory")
	}
	if !lstat(t, filepath.Join(root, "d2f")).Mode().IsRegular() {
		t.Error("d2f is not a regular file")
	}
	for _, p := range []string{"usr", "usr/local", "usr/local/bin"} {
		if fi := lstat(t, filepath.Join(root, p)); !fi.IsDir() || fi.Mode().Perm() != 0o755 {
			t.Errorf("implicit %s: mode %v, want a directory 0755", p, fi.Mode())
		}
	}
	mustNotExist(t, filepath.Join(root, "never"))
}

// TestFlattenMetadata checks modes, owners, times, links and special files.
func TestFlattenMetadata(t *testing.T) {
	root0 := os.Geteuid() == 0
	setuid := fileEntry("bin/passwd", "#!/bin/sh\n")
	setuid.hdr.Mode = 0o4755 | 0o2000
	setuid.hdr.Uid, setuid.hdr.Gid = 1000, 1001
	sticky := dirEntry("tmp/")
	sticky.hdr.Mode = 0o1777
	home := dirEntry("home/user/")
	home.hdr.Uid, home.hdr.Gid = 1000, 1000
	home.hdr.Mode = 0o700
	link := symlinkEntry("bin/sh", "busybox")
	link.hdr.Uid, link.hdr.Gid = 1000, 1000
	link.hdr.ModTime = testTime.Add(time.Hour)
	fifo := entry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o620}}
	null := entry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}}
	img := newImage(t, "linux", "amd64", v1.Config{}, newLayer(t,
		dirEntry("./"),
		dirEntry("bin/"),
		fileEntry("bin/busybox", "ELF"),
		setuid,
		link,
		hardlinkEntry("bin/ls", "bin/busybox"),
		sticky,
		home,
		fileEntry("home/user/.profile", "PS1=$ "),
		fifo,
		null,
	))
	root := flattenTo(t, img)

	fi := lstat(t, filepath.Join(root, "bin/passwd"))
	if want := os.FileMode(0o755) | os.ModeSetuid | os.ModeSetgid; fi.Mode() != want {
		t.Errorf("bin/passwd mode = %v, want %v", fi.Mode(), want)
	}
	if !fi.ModTime().Equal(testTime) {
		t.Errorf("bin/passwd mtime = %v, want %v", fi.ModTime(), testTime)
	}
	if fi := lstat(t, filepath.Join(root, "tmp")); fi.Mode() != os.ModeDir|os.ModeSticky|0o777 {
		t.Errorf("tmp mode = %v, want dtrwxrwxrwx", fi.Mode())
	}
	// Directories get their times after their content is written.
	for _, p := range []string{"bin", "home/user", "."} {
		if fi := lstat(t, filepath.Join(root, p)); !fi.ModTime().Equal(testTime) {
			t.Errorf("%s mtime = %v, want %v", p, fi.ModTime(), testTime)
		}
	}

	fi = lstat(t, filepath.Join(root, "bin/sh"))
	if fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("bin/sh mode = %v, want a symlink", fi.Mode())
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || target != "busybox" {
		t.Errorf("bin/sh -> %q, %v; want busybox", target, err)
	}
	if !fi.ModTime().Equal(testTime.Add(time.Hour)) {
		t.Errorf("bin/sh mtime = %v, want the link's own %v", fi.ModTime(), testTime.Add(time.Hour))
	}

	busybox := lstat(t, filepath.Join(root, "bin/busybox")).Sys().(*syscall.Stat_t)
	ls := lstat(t, filepath.Join(root, "bin/ls")).Sys().(*syscall.Stat_t)
	if busybox.Ino != ls.Ino || ls.Nlink != 2 {
		t.Errorf("bin/ls: inode %d, %d links; want bin/busybox's inode %d, 2 links", ls.Ino, ls.Nlink, busybox.Ino)
	}

	if fi := lstat(t, filepath.Join(root, "run/fifo")); fi.Mode() != os.ModeNamedPipe|0o620 {
		t.Errorf("run/fifo mode = %v, want a fifo 0620", fi.Mode())
	}
	if fi, err := os.Lstat(filepath.Join(root, "dev/null")); err == nil {
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&os.ModeCharDevice == 0 || st.Rdev != 1<<8|3 {
			t.Errorf("dev/null: mode %v rdev %#x, want a char device 1:3", fi.Mode(), st.Rdev)
		}
	} else if root0 {
		t.Logf("dev/null not made (%v): mknod not permitted here", err)
	}

	if !root0 {
		testenv.Lacking(t, "owners are only set as root")
	}
	for p, want := range map[string][2]uint32{
		"bin/passwd": {1000, 1001},
		"home/user":  {1000, 1000},
		"bin/sh":     {1000, 1000},
		"bin/ls":     {0, 0},
	} {
		st := lstat(t, filepath.Join(root, p)).Sys().(*syscall.Stat_t)
		if st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s owner = %d:%d, want %d:%d", p, st.Uid, st.Gid, want[0], want[1])
		}
	}
}

// hostProbe is the name of a file that only a broken Flatten would make in
// the host's /etc.
const hostProbe = "airlock-oci-flatten-escape-test"

// TestFlattenEscapes feeds layers that try to write outside the directory
// and checks that nothing outside it changed.
func TestFlattenEscapes(t *testing.T) {
	tests := []struct {
		name string
		// entries gets the absolute path of the directory holding root.
		entries func(outside string) []entry
		// inside, if set, is where the payload must land, relative to root.
		inside func(outside string) string
		// host, if set, is a path outside any test directory that a
		// broken Flatten would write; it must not exist after.
		host    string
		wantErr error
	}{
		{
			name:    "dotdot",
			entries: func(string) []entry { return []entry{fileEntry("../escape", "x")} },
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:    "dotdot inside a path",
			entries: func(string) []entry { return []entry{dirEntry("a/"), fileEntry("a/../../escape", "x")} },
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:    "absolute name",
			entries: func(string) []entry { return []entry{fileEntry("/escape", "x")} },
			inside:  func(string) string { return "escape" },
		},
		{
			name: "symlink to root then a path through it",
			entries: func(outside string) []entry {
				return []entry{symlinkEntry("link", "/"), fileEntry("link"+outside+"/escape", "x")}
			},
			inside: func(outside string) string { return outside + "/escape" },
		},
		{
			name: "symlink to root then etc through it",
			entries: func(string) []entry {
				return []entry{symlinkEntry("link", "/"), fileEntry("link/etc/"+hostProbe, "x")}
			},
			inside: func(string) string { return "etc/" + hostProbe },
			host:   "/etc/" + hostProbe,
		},
		{
			name: "absolute symlink to the outside directory",
			entries: func(outside string) []entry {
				return []entry{symlinkEntry("link", outside), fileEntry("link/escape", "x")}
			},
			inside: func(outside string) string { return outside + "/escape" },
		},
		{
			name: "relative symlink climbing out",
			entries: func(string) []entry {
				return []entry{symlinkEntry("up", ".."), fileEntry("up/escape", "x")}
			},
			inside: func(string) string { return "escape" },
		},
		{
			name: "relative symlink climbing out in a subdirectory",
			entries: func(string) []entry {
				return []entry{dirEntry("a/b/"), symlinkEntry("a/b/up", "../../.."), fileEntry("a/b/up/escape", "x")}
			},
			inside: func(string) string { return "escape" },
		},
		{
			name: "symlink in one layer, path through it in the next",
			entries: func(outside string) []entry {
				// Split into two layers below.
				return []entry{symlinkEntry("link", outside), {}, dirEntry("link/d/"), fileEntry("link/d/escape", "x")}
			},
			inside: func(outside string) string { return outside + "/d/escape" },
		},
		{
			name:    "hard link to ..",
			entries: func(string) []entry { return []entry{hardlinkEntry("h", "../secret")} },
			wantErr: errdefs.ErrInvalid,
		},
		{
			name: "hard link through a symlink to root",
			entries: func(outside string) []entry {
				return []entry{symlinkEntry("l", "/"), hardlinkEntry("h", "l"+outside+"/secret")}
			},
			wantErr: errdefs.ErrInvalid,
		},
		{
			name: "hard link to an absolute outside path",
			entries: func(outside string) []entry {
				return []entry{hardlinkEntry("h", outside+"/secret")}
			},
			wantErr: errdefs.ErrInvalid,
		},
		{
			name: "whiteout through a symlink",
			entries: func(outside string) []entry {
				return []entry{symlinkEntry("l", outside), whiteoutEntry("l/secret")}
			},
		},
		{
			name: "opaque directory through a symlink",
			entries: func(outside string) []entry {
				return []entry{symlinkEntry("l", outside), opaqueEntry("l")}
			},
		},
		{
			name:    "whiteout of ..",
			entries: func(string) []entry { return []entry{fileEntry(".wh...", "")} },
			wantErr: errdefs.ErrInvalid,
		},
		{
			name: "symlink replacing a directory, then writes through it",
			entries: func(outside string) []entry {
				return []entry{dirEntry("d/"), {}, symlinkEntry("d", outside), fileEntry("d/escape", "x")}
			},
			inside: func(outside string) string { return outside + "/escape" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outside := t.TempDir()
			secret := filepath.Join(outside, "secret")
			if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(outside, "root")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			var layers []v1.Layer
			var cur []entry
			for _, e := range append(tt.entries(outside), entry{}) {
				if e.hdr.Name == "" {
					layers = append(layers, newLayer(t, cur...))
					cur = nil
					continue
				}
				cur = append(cur, e)
			}
			img := newImage(t, "linux", "amd64", v1.Config{}, layers...)

			err := Flatten(context.Background(), img, root, 1<<20)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("Flatten = %v, want %v", err, tt.wantErr)
				}
			} else if err != nil {
				t.Errorf("Flatten: %v", err)
			}

			names, err := os.ReadDir(outside)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range names {
				got = append(got, n.Name())
			}
			if !slices.Equal(got, []string{"root", "secret"}) {
				t.Errorf("outside root: %v, want [root secret]", got)
			}
			if b, err := os.ReadFile(secret); err != nil || string(b) != "secret" {
				t.Errorf("secret: %q, %v", b, err)
			}
			if st := lstat(t, secret).Sys().(*syscall.Stat_t); st.Nlink != 1 {
				t.Errorf("secret has %d links, want 1", st.Nlink)
			}
			if tt.host != "" {
				if _, err := os.Lstat(tt.host); err == nil {
					os.Remove(tt.host)
					t.Errorf("wrote %s outside the tree", tt.host)
				}
			}
			if tt.inside != nil {
				if got := readFile(t, filepath.Join(root, tt.inside(outside))); got != "x" {
					t.Errorf("payload inside = %q, want x", got)
				}
			}
		})
	}
}

// TestFlattenLimit checks that the bytes written are bounded, over all
// layers.
func TestFlattenLimit(t *testing.T) {
	body := strings.Repeat("x", 400)
	one := newLayer(t, fileEntry("a", body), fileEntry("b", body))
	two := newLayer(t, fileEntry("c", body))
	img := newImage(t, "linux", "amd64", v1.Config{}, one, two)
	tests := []struct {
		limit   int64
		wantErr bool
	}{
		{limit: 1200},
		{limit: 1199, wantErr: true},
		{limit: 500, wantErr: true},
	}
	for _, tt := range tests {
		root := t.TempDir()
		err := Flatten(context.Background(), img, root, tt.limit)
		if !tt.wantErr {
			if err != nil {
				t.Errorf("limit %d: %v", tt.limit, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrTooLarge) {
			t.Errorf("limit %d: err = %v, want ErrTooLarge", tt.limit, err)
		} else if want := "limit of " + strconv.FormatInt(tt.limit, 10) + " bytes"; !strings.Contains(err.Error(), want) {
			t.Errorf("limit %d: err = %q, want it to say %q", tt.limit, err, want)
		}
	}
}

// TestFlattenRefuses checks the preconditions on its arguments.
func TestFlattenRefuses(t *testing.T) {
	img := markedImage(t, "linux", "amd64")
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		dir   string
		limit int64
	}{
		{"not empty", full, 1 << 20},
		{"missing", filepath.Join(full, "missing"), 1 << 20},
		{"a file", filepath.Join(full, "f"), 1 << 20},
		{"zero limit", t.TempDir(), 0},
	}
	for _, tt := range tests {
		if err := Flatten(context.Background(), img, tt.dir, tt.limit); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tt.name, err)
		}
	}
}

// TestFlattenCancelled checks that a cancelled context stops it.
func TestFlattenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	root := t.TempDir()
	err := Flatten(ctx, markedImage(t, "linux", "amd64"), root, 1<<20)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Flatten = %v, want context.Canceled", err)
	}
	mustNotExist(t, filepath.Join(root, "platform"))
}

// TestFlattenXattrs checks that extended attributes are set on files and
// directories where the filesystem takes them.
func TestFlattenXattrs(t *testing.T) {
	probe := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(probe, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(probe, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("the test directory's filesystem takes no user xattrs: %v", err)
	}
	f := fileEntry("f", "x")
	f.hdr.PAXRecords = map[string]string{"SCHILY.xattr.user.airlock": "file"}
	d := dirEntry("d/")
	d.hdr.PAXRecords = map[string]string{"SCHILY.xattr.user.airlock": "dir"}
	root := flattenTo(t, newImage(t, "linux", "amd64", v1.Config{}, newLayer(t, f, d)))
	for p, want := range map[string]string{"f": "file", "d": "dir"} {
		buf := make([]byte, 64)
		n, err := unix.Lgetxattr(filepath.Join(root, p), "user.airlock", buf)
		if err != nil || string(buf[:n]) != want {
			t.Errorf("%s: user.airlock = %q, %v; want %q", p, buf[:max(n, 0)], err, want)
		}
	}
}
