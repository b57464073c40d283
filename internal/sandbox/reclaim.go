package sandbox

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/vm"
)

// ReclaimSnapshots removes the template snapshots that keep says no
// sandbox can need: keep is asked with the snapshot's template digest and
// whether the snapshot was made with today's boot artifacts, QEMU and
// accelerator (a stale one is never used for a new clone again, but a
// suspended clone of it still wakes from its RAM file). A snapshot whose
// lock someone holds (a clone or a build in progress) stays. It returns
// the bytes freed.
func (r *Runtime) ReclaimSnapshots(keep func(digest string, current bool) bool) (int64, error) {
	origin, err := r.snapshotOrigin()
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir(r.snapshotsRoot())
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var freed int64
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, ".") || len(name) <= 64 {
			continue
		}
		dir := filepath.Join(r.snapshotsRoot(), name)
		var rec snapshotRecord
		b, err := os.ReadFile(filepath.Join(dir, snapshotRecordName))
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.Template == "" {
			continue // being made, or not a snapshot: its build cleans it up
		}
		if keep(rec.Template, rec.Origin == origin) {
			continue
		}
		lock, err := tryLock(filepath.Join(r.snapshotsRoot(), name+snapshotLockSuffix), unix.LOCK_EX)
		if err != nil {
			continue // in use
		}
		size := dirSize(dir)
		// The sealed copy jailed clones map goes with it (theirs stay
		// mapped).
		vm.ForgetMemory(filepath.Join(dir, snapshotMemName))
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		} else {
			freed += size
			os.Remove(lock.Name())
			r.log.Info("removed a template snapshot nothing can use", "snapshot", name, "bytes", size)
		}
		lock.Close()
	}
	return freed, errors.Join(errs...)
}

// dirSize adds up the disk space of the files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}
