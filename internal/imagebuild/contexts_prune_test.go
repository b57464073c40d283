package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	c := OpenContexts(dir)
	put := func(name string) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
		tw.Close()
		id, _, err := c.Put(context.Background(), &buf, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	old, held, fresh := put("old"), put("held"), put("fresh")
	past := time.Now().Add(-48 * time.Hour)
	for _, id := range []string{old, held} {
		os.Chtimes(filepath.Join(dir, id+".tar"), past, past)
	}
	leftover := filepath.Join(dir, ".put-123.tmp")
	os.WriteFile(leftover, []byte("cut short"), 0o600)
	os.Chtimes(leftover, past, past)

	n, err := c.Prune(24*time.Hour, map[string]bool{held: true})
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1 removed", n, err)
	}
	if _, _, err := c.Path(old); err == nil {
		t.Errorf("the old context %s is still there", old)
	}
	if _, err := os.Stat(filepath.Join(dir, old+".sha256")); err == nil {
		t.Errorf("the old context's digest file is still there")
	}
	for _, id := range []string{held, fresh} {
		if _, _, err := c.Path(id); err != nil {
			t.Errorf("context %s was removed: %v", id, err)
		}
	}
	if _, err := os.Stat(leftover); err == nil {
		t.Errorf("an old leftover upload is still there")
	}
}
