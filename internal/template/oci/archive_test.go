package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestOpenArchiveDockerSave opens a docker save style tarball.
func TestOpenArchiveDockerSave(t *testing.T) {
	cfg := v1.Config{Env: []string{"A=1"}, WorkingDir: "/app", Cmd: []string{"run"}}
	img := newImage(t, "linux", "amd64", cfg,
		newLayer(t, fileEntry("app/a", "lower"), fileEntry("app/b", "lower")),
		newLayer(t, whiteoutEntry("app/a"), fileEntry("app/b", "upper")),
	)
	p := filepath.Join(t.TempDir(), "image.tar")
	ref, err := name.ParseReference("example.com/team/app:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, ref, img); err != nil {
		t.Fatal(err)
	}

	got, err := OpenArchive(p)
	if err != nil {
		t.Fatalf("OpenArchive: %v", err)
	}
	c, err := ImageConfig(got)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Env, cfg.Env) || c.WorkingDir != "/app" || !slices.Equal(c.Cmd, cfg.Cmd) {
		t.Errorf("ImageConfig = %+v, want %+v", c, cfg)
	}
	root := flattenTo(t, got)
	mustNotExist(t, filepath.Join(root, "app/a"))
	if b := readFile(t, filepath.Join(root, "app/b")); b != "upper" {
		t.Errorf("app/b = %q, want upper", b)
	}

	arm := filepath.Join(t.TempDir(), "arm.tar")
	if err := tarball.WriteToFile(arm, ref, markedImage(t, "linux", "arm64")); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenArchive(arm); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "linux/arm64 only") {
		t.Errorf("OpenArchive of an arm64 image = %v, want ErrInvalid naming linux/arm64", err)
	}
}

// TestOpenArchiveLayout opens OCI image layouts, tarred.
func TestOpenArchiveLayout(t *testing.T) {
	amd64 := markedImage(t, "linux", "amd64")
	arm64 := markedImage(t, "linux", "arm64")

	t.Run("index of two platforms", func(t *testing.T) {
		dir := t.TempDir()
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendIndex(index(t, arm64, amd64)); err != nil {
			t.Fatal(err)
		}
		img, err := OpenArchive(tarDir(t, dir))
		if err != nil {
			t.Fatalf("OpenArchive: %v", err)
		}
		if got, want := digestOf(t, img), digestOf(t, amd64); got != want {
			t.Errorf("digest = %s, want the amd64 image's %s", got, want)
		}
		if b := readFile(t, filepath.Join(flattenTo(t, img), "platform")); b != "linux/amd64" {
			t.Errorf("flattened the %s image", b)
		}
	})

	t.Run("images without platforms", func(t *testing.T) {
		dir := t.TempDir()
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range []v1.Image{arm64, amd64} {
			if err := lp.AppendImage(img); err != nil {
				t.Fatal(err)
			}
		}
		img, err := OpenArchive(tarDir(t, dir))
		if err != nil {
			t.Fatalf("OpenArchive: %v", err)
		}
		if b := readFile(t, filepath.Join(flattenTo(t, img), "platform")); b != "linux/amd64" {
			t.Errorf("flattened the %s image", b)
		}
	})

	t.Run("no amd64", func(t *testing.T) {
		dir := t.TempDir()
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendIndex(index(t, arm64)); err != nil {
			t.Fatal(err)
		}
		_, err = OpenArchive(tarDir(t, dir))
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "linux/arm64 only") {
			t.Errorf("OpenArchive = %v, want ErrInvalid naming linux/arm64", err)
		}
	})

	t.Run("tampered config", func(t *testing.T) {
		dir := t.TempDir()
		img := newImage(t, "linux", "amd64", v1.Config{Env: []string{"A=1"}}, newLayer(t, fileEntry("f", "x")))
		lp, err := layout.Write(dir, empty.Index)
		if err != nil {
			t.Fatal(err)
		}
		if err := lp.AppendImage(img); err != nil {
			t.Fatal(err)
		}
		h, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "blobs", h.Algorithm, h.Hex)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.Replace(b, []byte("A=1"), []byte("A=2"), 1)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenArchive(tarDir(t, dir)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("OpenArchive = %v, want ErrInvalid", err)
		}
	})
}

// TestOpenArchiveInvalid feeds files that are not image archives.
func TestOpenArchiveInvalid(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, fileEntry("manifest.json", "[]")))
	zw.Close()
	files := map[string][]byte{
		"empty":             nil,
		"text":              []byte("this is not a tar archive, just some text that goes on for a while\n"),
		"tar of other":      tarOf(t, fileEntry("README", "hello"), dirEntry("src/")),
		"gzipped":           gz.Bytes(),
		"no images":         tarOf(t, fileEntry("manifest.json", "[]")),
		"bad manifest.json": tarOf(t, fileEntry("manifest.json", "{")),
		"layout, no blobs": tarOf(t, fileEntry("oci-layout", `{"imageLayoutVersion":"1.0.0"}`),
			fileEntry("index.json", `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:`+strings.Repeat("a", 64)+`","size":10}]}`)),
	}
	for name, b := range files {
		p := filepath.Join(t.TempDir(), "upload")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenArchive(p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: OpenArchive = %v, want ErrInvalid", name, err)
		}
	}
}

// tarDir tars the tree at dir into a file and returns its path.
func tarDir(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layout.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestScanTarOffsets checks that scanTar finds each file's content where
// it lies, for names long enough to need extended headers too.
func TestScanTarOffsets(t *testing.T) {
	long := strings.Repeat("d/", 80) + "file"
	entries := []entry{fileEntry("./a", "first"), fileEntry(long, "second"), dirEntry("dir/"), fileEntry("b", "")}
	p := filepath.Join(t.TempDir(), "x.tar")
	if err := os.WriteFile(p, tarOf(t, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := scanTar(f)
	if err != nil {
		t.Fatal(err)
	}
	a := &archive{path: p, entries: got}
	for name, want := range map[string]string{"a": "first", long: "second", "b": ""} {
		b, err := a.readFile(name)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", name, b, err, want)
		}
	}
	if _, ok := got["dir"]; ok {
		t.Error("a directory is listed as a file")
	}
}
