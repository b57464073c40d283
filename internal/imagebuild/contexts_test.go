package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// tent is one entry of a test archive.
type tent struct {
	name string
	typ  byte // tar.TypeReg when zero
	body string
	link string
	mode int64
	uid  int
	time time.Time
}

func mkTar(t *testing.T, ents ...tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, ModTime: e.time}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.ModTime.IsZero() {
			hdr.ModTime = time.Unix(1700000000, 0)
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("write header %s: %v", e.name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func put(t *testing.T, c *Contexts, body []byte) string {
	t.Helper()
	id, _, err := c.Put(context.Background(), bytes.NewReader(body), 1<<20)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	return id
}

// files lists the names in dir.
func files(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestPut(t *testing.T) {
	dir := t.TempDir() + "/build-contexts"
	c := OpenContexts(dir)
	body := mkTar(t, tent{name: "app/", typ: tar.TypeDir}, tent{name: "app/main.py", body: "print(1)\n"})
	sum := sha256.Sum256(body)
	wantDigest := "sha256:" + hex.EncodeToString(sum[:])
	wantID := "ctx" + hex.EncodeToString(sum[:])[:24]

	id, digest, err := c.Put(context.Background(), bytes.NewReader(body), 1<<20)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if id != wantID || digest != wantDigest {
		t.Fatalf("Put = %s %s, want %s %s", id, digest, wantID, wantDigest)
	}
	again, digest2, err := c.Put(context.Background(), bytes.NewReader(body), 1<<20)
	if err != nil || again != id || digest2 != digest {
		t.Fatalf("second Put = %s %s %v, want the same id", again, digest2, err)
	}
	other := put(t, c, mkTar(t, tent{name: "other", body: "x"}))
	if other == id {
		t.Fatalf("different content got the same id %s", id)
	}
	if got := files(t, dir); len(got) != 4 {
		t.Fatalf("directory holds %q, want two archives and their digests, nothing else", got)
	}

	f, err := c.Open(id)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	stored, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(stored, body) {
		t.Fatalf("Open reads %d bytes that differ from the %d put", len(stored), len(body))
	}
	p, d, err := c.Path(id)
	if err != nil || d != wantDigest {
		t.Fatalf("Path = %s %s %v", p, d, err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, body) {
		t.Fatalf("Path names a file that is not the archive")
	}

	if err := c.Remove(id); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := c.Open(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Open after Remove: %v, want ErrNotFound", err)
	}
	if _, _, err := c.Path(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Path after Remove: %v, want ErrNotFound", err)
	}
	if err := c.Remove(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second Remove: %v, want ErrNotFound", err)
	}
	if got := files(t, dir); len(got) != 2 {
		t.Fatalf("after Remove the directory holds %q", got)
	}
}

func TestPutLimit(t *testing.T) {
	dir := t.TempDir()
	c := OpenContexts(dir)
	body := mkTar(t, tent{name: "f", body: strings.Repeat("x", 5000)})
	if _, _, err := c.Put(context.Background(), bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatalf("Put of exactly the limit: %v", err)
	}
	limit := int64(len(body) - 1)
	_, _, err := c.Put(context.Background(), bytes.NewReader(body), limit)
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), fmt.Sprintf("limit of %d bytes", limit)) {
		t.Fatalf("Put over the limit: %v, want ErrTooLarge naming the limit", err)
	}
	if _, _, err := c.Put(context.Background(), bytes.NewReader(body), 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Put with no limit: %v, want ErrInvalid", err)
	}
	if got := files(t, dir); len(got) != 2 {
		t.Fatalf("directory holds %q, want only the first archive and its digest", got)
	}
}

func TestPutCancelled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := OpenContexts(dir).Put(ctx, bytes.NewReader(mkTar(t, tent{name: "f"})), 1<<20)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Put: %v, want context.Canceled", err)
	}
	if got := files(t, dir); len(got) != 0 {
		t.Fatalf("a cancelled Put left %q", got)
	}
}

func TestPutRefuses(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(mkTar(t, tent{name: "f"}))
	zw.Close()
	for _, tc := range []struct {
		name string
		body []byte
		msg  string
	}{
		{"empty body", nil, "is empty, not a tar archive"},
		{"text", []byte("hello, this is not a tar archive\n"), "is not a valid tar archive"},
		{"long text", bytes.Repeat([]byte("not a tar "), 200), "is not a valid tar archive"},
		{"gzip", gz.Bytes(), "is gzip-compressed"},
		{"truncated", mkTar(t, tent{name: "f", body: strings.Repeat("x", 4000)})[:2048], "is not a valid tar archive"},
		{"dot-dot entry", mkTar(t, tent{name: "../x"}), "entry ../x has a .. component"},
		{"inner dot-dot entry", mkTar(t, tent{name: "a/../../x"}), "has a .. component"},
		{"absolute entry", mkTar(t, tent{name: "/etc/passwd"}), "entry /etc/passwd has an absolute name"},
		{"device", mkTar(t, tent{name: "dev", typ: tar.TypeChar}), "devices and fifos are not allowed"},
		{"fifo", mkTar(t, tent{name: "pipe", typ: tar.TypeFifo}), "devices and fifos are not allowed"},
		{"hard link to nothing", mkTar(t, tent{name: "h", typ: tar.TypeLink, link: "missing"}), "is not an earlier file"},
		{"hard link out", mkTar(t, tent{name: "h", typ: tar.TypeLink, link: "../etc/passwd"}), "has a .. component"},
		{"entry through a symlink", mkTar(t,
			tent{name: "link", typ: tar.TypeSymlink, link: "/etc"},
			tent{name: "link/cron.d/x", body: "evil"}), "entry link: it holds other entries but is not a directory"},
		{"entry under a file", mkTar(t, tent{name: "f"}, tent{name: "f/g"}), "entry f: it holds other entries"},
		{"file replacing a directory with entries", mkTar(t, tent{name: "d/x"}, tent{name: "d"}), "entry d: it holds other entries"},
		{"root as a file", mkTar(t, tent{name: "./", typ: tar.TypeDir}, tent{name: "."}), "names the context root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, _, err := OpenContexts(dir).Put(context.Background(), bytes.NewReader(tc.body), 1<<20)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Put: %v, want ErrInvalid saying %q", err, tc.msg)
			}
			if got := files(t, dir); len(got) != 0 {
				t.Fatalf("a refused Put left %q", got)
			}
		})
	}
}

func TestPutAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty archive", mkTar(t)},
		{"symlinks anywhere are recorded, not refused", mkTar(t,
			tent{name: "abs", typ: tar.TypeSymlink, link: "/etc/passwd"},
			tent{name: "up", typ: tar.TypeSymlink, link: "../../x"})},
		{"implied directories and ./ names", mkTar(t, tent{name: "./", typ: tar.TypeDir}, tent{name: "./a/b/c", body: "x"})},
		{"a later entry replaces an earlier", mkTar(t, tent{name: "f", body: "1"}, tent{name: "f", body: "2"})},
		{"hard link to an earlier file", mkTar(t, tent{name: "f", body: "1"}, tent{name: "h", typ: tar.TypeLink, link: "./f"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := OpenContexts(t.TempDir()).Put(context.Background(), bytes.NewReader(tc.body), 1<<20); err != nil {
				t.Fatalf("Put: %v", err)
			}
		})
	}
}

func TestEntryNameNUL(t *testing.T) {
	if _, err := entryName("a\x00b"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("entryName with NUL: %v, want ErrInvalid", err)
	}
}

func TestContextIDs(t *testing.T) {
	c := OpenContexts(t.TempDir())
	missing := "ctx" + strings.Repeat("0", 24)
	for _, id := range []string{"", "../etc/passwd", "ctx", "ctx" + strings.Repeat("0", 23), "ctx" + strings.Repeat("A", 24),
		"ctx" + strings.Repeat("0", 24) + "/../x", "sbx" + strings.Repeat("0", 24)} {
		if _, err := c.Open(id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Open(%q): %v, want ErrInvalid", id, err)
		}
		if _, _, err := c.Path(id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Path(%q): %v, want ErrInvalid", id, err)
		}
		if err := c.Remove(id); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Remove(%q): %v, want ErrInvalid", id, err)
		}
		if _, err := c.Select(id, "."); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Select(%q): %v, want ErrInvalid", id, err)
		}
	}
	if _, err := c.Open(missing); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Open of a missing context: %v, want ErrNotFound", err)
	}
	if _, err := c.Select(missing, "."); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Select in a missing context: %v, want ErrNotFound", err)
	}
}
