package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// extImage makes an ext4 image of a small tree in dir.
func extImage(t *testing.T, dir, content string) string {
	t.Helper()
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		testenv.Lacking(t, "mkfs.ext4 not found (e2fsprogs)")
	}
	img := filepath.Join(dir, "disk.ext4")
	if err := mkfs(context.Background(), smallTree(t, content), img, treeUsage{bytes: 1 << 20, inodes: 16}, nil); err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImportImage(t *testing.T) {
	ctx := context.Background()
	s := Open(datadir.Dir{Root: t.TempDir()})
	settings := Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}

	tests := []struct {
		name string
		dir  string // where the image is made: beside the store, or on another filesystem
	}{
		{"same filesystem", t.TempDir()},
		{"other filesystem", otherFS(t)},
	}
	var first []byte // the first image, imported again below
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img := extImage(t, tc.dir, tc.name+"\n")
			if first == nil {
				b, err := os.ReadFile(img)
				if err != nil {
					t.Fatal(err)
				}
				first = b
			}
			sum, size, err := digest.File(ctx, img)
			if err != nil {
				t.Fatal(err)
			}
			tpl, err := s.ImportImage(ctx, "saved", tc.name[:4], img, settings)
			if err != nil {
				t.Fatal(err)
			}
			if tpl.Digest != "sha256:"+sum || tpl.SizeBytes != size || tpl.DiskMiB != 512 || tpl.Ref() != "saved:"+tc.name[:4] {
				t.Errorf("imported %+v, want digest %s, %d bytes", tpl, sum, size)
			}
			if _, err := os.Stat(img); !os.IsNotExist(err) {
				t.Errorf("the image is still at its old path: %v", err)
			}
			got, err := s.Resolve("saved:" + tc.name[:4])
			if err != nil || got.Digest != tpl.Digest {
				t.Fatalf("resolve: %+v, %v", got, err)
			}
			if err := s.Verify(ctx, got); err != nil {
				t.Error(err)
			}
			if fi, err := os.Stat(got.Image); err != nil || fi.Mode().Perm() != 0o444 {
				t.Errorf("stored image: %v, %v; want mode 0444", fi, err)
			}
		})
	}

	// The same content again only moves the ref.
	img := filepath.Join(t.TempDir(), "again.ext4")
	if err := os.WriteFile(img, first, 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := s.ImportImage(ctx, "other", "", img, settings)
	if err != nil {
		t.Fatal(err)
	}
	saved, _ := s.Resolve("saved:same")
	if again.Digest != saved.Digest || again.Ref() != "other:latest" {
		t.Errorf("second import %+v, want digest %s as other:latest", again, saved.Digest)
	}
	if all, _ := s.Images(); len(all) != 2 {
		t.Errorf("%d images stored, want 2", len(all))
	}
}

func TestImportImageRefuses(t *testing.T) {
	ctx := context.Background()
	s := Open(datadir.Dir{Root: t.TempDir()})
	settings := Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}
	dir := t.TempDir()
	notExt4 := filepath.Join(dir, "not.ext4")
	if err := os.WriteFile(notExt4, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	img := extImage(t, t.TempDir(), "x\n")
	tests := []struct {
		name, ref, path string
		settings        Settings
		want            error
	}{
		{"not ext4", "saved", notExt4, settings, errdefs.ErrInvalid},
		{"bad name", "Saved", img, settings, errdefs.ErrInvalid},
		{"bad settings", "saved", img, Settings{}, errdefs.ErrInvalid},
		{"no file", "saved", filepath.Join(dir, "none"), settings, os.ErrNotExist},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.ImportImage(ctx, tc.ref, "", tc.path, tc.settings)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.want != os.ErrNotExist {
				if _, err := os.Stat(tc.path); err != nil {
					t.Errorf("a refused import lost the file: %v", err)
				}
			}
		})
	}
	if all, _ := s.List(); len(all) != 0 {
		t.Errorf("refused imports stored %v", all)
	}
}

// otherFS returns a directory on another filesystem than the test's
// temporary directories (a tmpfs), or skips the test.
func otherFS(t *testing.T) string {
	t.Helper()
	dev := func(p string) uint64 {
		fi, err := os.Stat(p)
		if err != nil {
			return 0
		}
		return fi.Sys().(*syscall.Stat_t).Dev
	}
	if a, b := dev("/dev/shm"), dev(os.TempDir()); a == 0 || a == b {
		testenv.Lacking(t, "no second filesystem (/dev/shm) to import from")
	}
	dir, err := os.MkdirTemp("/dev/shm", "airlock-test-")
	if err != nil {
		testenv.Lacking(t, "cannot write /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
