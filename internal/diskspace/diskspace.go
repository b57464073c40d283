// Package diskspace measures the room left on a filesystem and says a
// size for a person, for the checks that refuse work a disk cannot hold.
package diskspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Free is the space left for unprivileged use on the filesystem that
// holds path, or would hold it: a path not made yet is measured at its
// nearest existing parent.
func Free(path string) (int64, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(path, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		parent := filepath.Dir(path)
		if !errors.Is(err, unix.ENOENT) || parent == path {
			return 0, &os.PathError{Op: "statfs", Path: path, Err: err}
		}
		path = parent
	}
}

// Size is n bytes for a person: TiB or GiB with one decimal from 1 of
// them, else MiB.
func Size(n int64) string {
	if n >= 1<<40 {
		return fmt.Sprintf("%.1f TiB", float64(n)/(1<<40))
	}
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
