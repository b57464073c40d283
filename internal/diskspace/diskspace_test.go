package diskspace

import (
	"path/filepath"
	"testing"
)

func TestSize(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 MiB"},
		{5 << 20, "5 MiB"},
		{1<<30 - 1, "1023 MiB"},
		{1 << 30, "1.0 GiB"},
		{3<<30 + 1<<29, "3.5 GiB"},
		{2 << 40, "2.0 TiB"},
	} {
		if got := Size(c.n); got != c.want {
			t.Errorf("Size(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestFreeOfAPathNotMadeYet(t *testing.T) {
	dir := t.TempDir()
	have, err := Free(dir)
	if err != nil || have <= 0 {
		t.Fatalf("Free(%s) = %d, %v; want room", dir, have, err)
	}
	// A path not made yet is measured at its nearest existing parent.
	if got, err := Free(filepath.Join(dir, "not", "made", "yet")); err != nil || got <= 0 {
		t.Fatalf("Free of a path under %s not made yet = %d, %v; want its parent's room", dir, got, err)
	}
	if _, err := Free("relative/nowhere\x00"); err == nil {
		t.Fatal("Free of a path with a NUL succeeded")
	}
}
