package atomicfile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := WriteBytes(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := Write(p, 0o644, func(w io.Writer) error {
		_, err := w.Write([]byte("new"))
		return err
	})
	want := sha256.Sum256([]byte("new"))
	if err != nil || sum != hex.EncodeToString(want[:]) {
		t.Fatalf("sum %s err %v", sum, err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Fatalf("content %q", b)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", fi.Mode())
	}

	// A failing fill leaves the old file and no temporary file.
	boom := errors.New("boom")
	if _, err := Write(p, 0o644, func(w io.Writer) error { w.Write([]byte("partial")); return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Fatalf("content after a failed write %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
}
