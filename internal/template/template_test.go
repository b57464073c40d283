package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestParseRef(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		ref       string
		name, tag string
		invalid   bool
	}{
		{ref: "base", name: "base", tag: "latest"},
		{ref: "base:latest", name: "base", tag: "latest"},
		{ref: "my-env.2:v1.0_rc", name: "my-env.2", tag: "v1.0_rc"},
		{ref: digest, tag: digest},
		{ref: "", invalid: true},
		{ref: ":latest", invalid: true},
		{ref: "base:", invalid: true},
		{ref: "Base", invalid: true},
		{ref: "base:a:b", invalid: true},
		{ref: "../etc", invalid: true},
		{ref: "base:../x", invalid: true},
		{ref: "base/x", invalid: true},
		{ref: "sha256:1234", invalid: true},
		{ref: "sha256:" + strings.Repeat("AB", 32), invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			name, tag, err := ParseRef(tt.ref)
			if tt.invalid {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("ParseRef(%q) error = %v, want ErrInvalid", tt.ref, err)
				}
				return
			}
			if err != nil || name != tt.name || tag != tt.tag {
				t.Fatalf("ParseRef(%q) = %q, %q, %v, want %q, %q", tt.ref, name, tag, err, tt.name, tt.tag)
			}
		})
	}
}

// smallTree makes a directory tree to import.
func smallTree(t *testing.T, content string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"bin", "etc", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "bin", "link")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestImportResolveList(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testenv.Lacking(t, "mkfs.ext4 not found")
	}
	ctx := context.Background()
	dd := datadir.Dir{Root: t.TempDir()}
	s := Open(dd)

	if _, err := s.Resolve("base"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "run `airlock setup`") {
		t.Fatalf("Resolve in an empty store = %v, want ErrNotFound saying to run airlock setup", err)
	}
	if got, err := s.List(); err != nil || len(got) != 0 {
		t.Fatalf("List of an empty store = %v, %v", got, err)
	}

	settings := Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256,
		StartCmd: "exec server", ReadyPort: 8080, ReadyPath: "/health", Recipe: "sha256:x"}
	tpl, err := s.Import(ctx, "tiny", "", smallTree(t, "one\n"), settings)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Ref() != "tiny:latest" || !reflect.DeepEqual(tpl.Settings(), settings) || !strings.HasPrefix(tpl.Digest, "sha256:") {
		t.Errorf("Import = %+v", tpl)
	}
	fi, err := os.Stat(tpl.Image)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 || fi.Size() != tpl.SizeBytes || !filepath.IsAbs(tpl.Image) {
		t.Errorf("image %s: mode %v size %d (want 0444, %d, absolute path)", tpl.Image, fi.Mode(), fi.Size(), tpl.SizeBytes)
	}
	if want := filepath.Join(dd.Templates(), "sha256-"+strings.TrimPrefix(tpl.Digest, "sha256:")+".ext4"); tpl.Image != want {
		t.Errorf("image path %s, want %s", tpl.Image, want)
	}
	if err := s.Verify(ctx, tpl); err != nil {
		t.Error(err)
	}
	if out, err := exec.Command("e2fsck", "-fn", tpl.Image).CombinedOutput(); err != nil {
		t.Errorf("e2fsck of the image: %v\n%s", err, out)
	}
	if out, err := exec.Command("debugfs", "-R", "cat /etc/hostname", tpl.Image).Output(); err != nil || string(out) != "one\n" {
		t.Errorf("debugfs cat /etc/hostname = %q, %v", out, err)
	}

	for _, ref := range []string{"tiny", "tiny:latest", tpl.Digest} {
		got, err := s.Resolve(ref)
		if err != nil {
			t.Errorf("Resolve(%q): %v", ref, err)
			continue
		}
		if !reflect.DeepEqual(got, tpl) {
			t.Errorf("Resolve(%q) = %+v, want %+v", ref, got, tpl)
		}
	}

	if _, err := s.Import(ctx, "copy", "v1", smallTree(t, "one\n"), Settings{VCPUs: 2, MemoryMiB: 512, DiskMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	other, err := s.Import(ctx, "tiny", "v2", smallTree(t, "two\n"), settings)
	if err != nil {
		t.Fatal(err)
	}
	if other.Digest == tpl.Digest {
		t.Error("different trees gave the same digest")
	}

	all, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, x := range all {
		refs = append(refs, x.Ref())
	}
	if strings.Join(refs, " ") != "copy:v1 tiny:latest tiny:v2" {
		t.Errorf("List = %q", refs)
	}

	_, err = s.Resolve("base")
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "available: copy:v1, tiny:latest, tiny:v2") {
		t.Errorf("Resolve(base) = %v, want ErrNotFound listing the templates", err)
	}
	if _, err := s.Resolve("sha256:" + strings.Repeat("0", 64)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resolve(unknown digest) = %v, want ErrNotFound", err)
	}
	if _, err := s.Resolve("no/such"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Resolve(no/such) = %v, want ErrInvalid", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dd.Templates(), ".*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %q", leftovers)
	}
}

func TestImportRejects(t *testing.T) {
	s := Open(datadir.Dir{Root: t.TempDir()})
	ok := Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 256}
	tests := []struct {
		name, tpl, tag, dir string
		settings            Settings
	}{
		{name: "bad name", tpl: "Bad", dir: t.TempDir(), settings: ok},
		{name: "bad tag", tpl: "x", tag: "-x", dir: t.TempDir(), settings: ok},
		{name: "digest as name", tpl: "sha256", tag: strings.Repeat("0", 64), dir: t.TempDir(), settings: ok},
		{name: "zero memory", tpl: "x", dir: t.TempDir(), settings: Settings{VCPUs: 1, DiskMiB: 1}},
		{name: "missing dir", tpl: "x", dir: filepath.Join(t.TempDir(), "nope"), settings: ok},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.Import(context.Background(), tt.tpl, tt.tag, tt.dir, tt.settings); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Import error = %v, want ErrInvalid", err)
			}
		})
	}
}
