package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// XattrDir returns a new temporary directory on a filesystem that keeps
// user extended attributes, as a guest's ext4 does (the file metadata of
// E2B's envd lives there); a host whose temporary directory keeps none
// is Lacking.
func XattrDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	if err := os.WriteFile(probe, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(probe, "user.probe", []byte("1"), 0); err != nil {
		Lacking(t, "%s keeps no user extended attributes: %v", dir, err)
	}
	if err := os.Remove(probe); err != nil {
		t.Fatal(err)
	}
	return dir
}
