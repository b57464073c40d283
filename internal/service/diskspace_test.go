package service

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/diskspace"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template/oci"
)

func TestCheckFreeDisk(t *testing.T) {
	root := t.TempDir()
	free, err := diskspace.Free(root)
	if err != nil || free <= 0 {
		t.Fatalf("free space of %s: %d, %v", root, free, err)
	}
	tests := []struct {
		name string
		keep int64
		full bool
	}{
		{"off", 0, false},
		{"a byte", 1, false},
		{"more than there is", free + 1<<40, true},
		{"all of int64", math.MaxInt64, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{cfg: Config{Dir: datadir.Dir{Root: root}, MinFreeDiskBytes: tc.keep}}
			err := s.checkFreeDisk(s.cfg.Dir.Sandboxes())
			if !tc.full {
				if err != nil {
					t.Fatalf("keeping %d bytes free: %v", tc.keep, err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrExhausted) || errdefs.ClassOf(err).Code != "resource_exhausted" {
				t.Fatalf("keeping %d bytes free: %v, want resource exhausted", tc.keep, err)
			}
			for _, want := range []string{"free", "--min-free-disk", "retry"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q lacks %q", err, want)
				}
			}
		})
	}
}

// TestSpaceGuard: an upload is cut off as it passes the free space the
// server keeps, within a measure's worth, not when it ends.
func TestSpaceGuard(t *testing.T) {
	dir := t.TempDir()
	free, err := diskspace.Free(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{MinFreeDiskBytes: free - 24<<20}}
	f, err := os.Create(filepath.Join(dir, "upload"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := io.Copy(f, &spaceGuard{r: zeroReader{}, s: s, dir: dir})
	if !errors.Is(err, errdefs.ErrExhausted) || !strings.Contains(err.Error(), "--min-free-disk") {
		t.Fatalf("copy ended with %v after %d bytes, want resource exhausted", err, n)
	}
	if n > 24<<20+guardEvery {
		t.Fatalf("wrote %d MiB past a margin of 24 MiB", n>>20)
	}
	// A server that keeps nothing free does not measure.
	s.cfg.MinFreeDiskBytes = 0
	if n, err := io.Copy(io.Discard, &spaceGuard{r: io.LimitReader(zeroReader{}, 1<<20), s: s, dir: dir}); err != nil || n != 1<<20 {
		t.Fatalf("copy with no floor: %d, %v", n, err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// bombLayer is a layer whose gzip stream is small and whose one file
// unpacks to size bytes of zeros, streamed: it is never held whole.
func bombLayer(t *testing.T, size int64) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			err := tw.WriteHeader(&tar.Header{Name: "bomb", Mode: 0o644, Size: size, Typeflag: tar.TypeReg})
			if err == nil {
				_, err = io.Copy(tw, io.LimitReader(zeroReader{}, size))
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		return pr, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestFlattenBomb: a layer that inflates past what the disk can take while
// keeping --min-free-disk free is stopped as it passes, not when it ends.
func TestFlattenBomb(t *testing.T) {
	dir := t.TempDir()
	free, err := diskspace.Free(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{MinFreeDiskBytes: free - 64<<20}}
	limit, room, err := s.flattenLimit(dir)
	if err != nil || !room || limit > 32<<20 || limit < 16<<20 {
		t.Fatalf("flattenLimit with 64 MiB to spare = %d, %v, %v; want about 32 MiB set by the disk", limit, room, err)
	}
	img, err := mutate.AppendLayers(empty.Image, bombLayer(t, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	err = oci.Flatten(context.Background(), img, dir, limit)
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("flatten of a 1 GiB bomb under a %d-byte limit: %v", limit, err)
	}
	var written int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				written += fi.Size()
			}
		}
		return nil
	})
	if written > limit+1 {
		t.Fatalf("%d bytes written past the limit of %d", written, limit)
	}
	// Without a floor, the bound is the server's own.
	s.cfg.MinFreeDiskBytes = 0
	if limit, room, _ := s.flattenLimit(dir); limit != maxFlattenBytes || room {
		t.Fatalf("flattenLimit without a floor = %d, %v", limit, room)
	}
	// No room at all: refused before anything is written.
	s.cfg.MinFreeDiskBytes = free + 1<<30
	if _, _, err := s.flattenLimit(dir); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("flattenLimit with no room: %v", err)
	}
}
