package vm

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// UIDRange is the range of users (and groups of the same numbers) jailed
// VMs run as, one each. Nothing else on the host may use them: Check
// tells.
type UIDRange struct {
	First int `json:"first"`
	Count int `json:"count"`
}

// DefaultUIDs is a million users high above those distributions hand out
// (regular users, system users, and the subordinate ranges of user
// namespaces, which start at 100000 in 65536 steps).
var DefaultUIDs = UIDRange{First: 2_000_000_000, Count: 1_000_000}

// UIDRegistry is the host-wide record of which jail user belongs to
// which VM directory: one file per user, named by its number, holding the
// directory. It is on a tmpfs, as the VMs it records do not outlive a
// reboot, and shared by every airlock process on the host, so that two
// servers never give one user to two VMs.
var UIDRegistry = "/run/airlock/jail-uids"

// Check reports whether the range is usable: within the kernel's user
// IDs, and not used by the host's users, groups or subordinate ranges.
func (r UIDRange) Check() error {
	if r.First < 1000 || r.Count < 1 || int64(r.First)+int64(r.Count) > 1<<31 {
		return fmt.Errorf("jail user range %d+%d must start at 1000 or more and end below 2^31: %w", r.First, r.Count, errdefs.ErrInvalid)
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if err := r.checkIDs(f, 2); err != nil {
			return err
		}
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		if err := r.checkRanges(f); err != nil {
			return err
		}
	}
	return nil
}

// Contains reports whether uid is in the range.
func (r UIDRange) Contains(uid int) bool { return r.contains(int64(uid)) }

func (r UIDRange) contains(id int64) bool {
	return id >= int64(r.First) && id < int64(r.First)+int64(r.Count)
}

// checkIDs checks the numeric field field (from 0) of a colon-separated
// database such as /etc/passwd.
func (r UIDRange) checkIDs(path string, field int) error {
	return scanColonFile(path, func(f []string) error {
		if len(f) <= field {
			return nil
		}
		if id, err := strconv.ParseInt(f[field], 10, 64); err == nil && r.contains(id) {
			return fmt.Errorf("%s gives id %d to %q, inside the jail user range %d+%d: pick another range with --jail-uids: %w",
				path, id, f[0], r.First, r.Count, errdefs.ErrPrecondition)
		}
		return nil
	})
}

// checkRanges checks a subordinate id file (name:first:count).
func (r UIDRange) checkRanges(path string) error {
	return scanColonFile(path, func(f []string) error {
		if len(f) < 3 {
			return nil
		}
		first, err1 := strconv.ParseInt(f[1], 10, 64)
		n, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil
		}
		if first < int64(r.First)+int64(r.Count) && int64(r.First) < first+n {
			return fmt.Errorf("%s gives %q ids %d+%d, overlapping the jail user range %d+%d: pick another range with --jail-uids: %w",
				path, f[0], first, n, r.First, r.Count, errdefs.ErrPrecondition)
		}
		return nil
	})
}

func scanColonFile(path string, fn func([]string) error) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := fn(strings.Split(line, ":")); err != nil {
			return err
		}
	}
	return sc.Err()
}

// maxUIDProbes bounds the search for a free user.
const maxUIDProbes = 4096

// AllocateUID gives the VM directory dir a user of the range: the one
// want names when that is free (or already dir's), else a free one. A
// user whose recorded directory no longer exists is free. dir must be
// absolute.
func (r UIDRange) AllocateUID(dir string, want int) (int, error) {
	if !filepath.IsAbs(dir) {
		return 0, fmt.Errorf("jail user for %q: not an absolute path: %w", dir, errdefs.ErrInvalid)
	}
	if r.Count < 1 {
		return 0, fmt.Errorf("jail user range %d+%d is empty: %w", r.First, r.Count, errdefs.ErrInvalid)
	}
	unlock, err := lockRegistry()
	if err != nil {
		return 0, err
	}
	defer unlock()
	if want != 0 && r.contains(int64(want)) && claimUID(want, dir) {
		return want, nil
	}
	h := fnv.New32a()
	h.Write([]byte(dir))
	start := int(h.Sum32() % uint32(r.Count))
	for i := 0; i < min(r.Count, maxUIDProbes); i++ {
		uid := r.First + (start+i)%r.Count
		if claimUID(uid, dir) {
			return uid, nil
		}
	}
	return 0, fmt.Errorf("no free jail user in %d+%d after %d tries: widen --jail-uids: %w", r.First, r.Count, maxUIDProbes, errdefs.ErrExhausted)
}

// claimUID records uid as dir's if it is free or already dir's. The
// registry is locked.
func claimUID(uid int, dir string) bool {
	path := filepath.Join(UIDRegistry, strconv.Itoa(uid))
	if b, err := os.ReadFile(path); err == nil {
		owner := string(b)
		if owner == dir {
			return true
		}
		if _, err := os.Stat(owner); err == nil || !errors.Is(err, os.ErrNotExist) {
			return false // taken by a directory that still exists
		}
	}
	return os.WriteFile(path, []byte(dir), 0o600) == nil
}

// ReleaseUID frees the user that dir holds, if it holds one.
func ReleaseUID(dir string) {
	unlock, err := lockRegistry()
	if err != nil {
		return
	}
	defer unlock()
	entries, _ := os.ReadDir(UIDRegistry)
	for _, e := range entries {
		path := filepath.Join(UIDRegistry, e.Name())
		if b, err := os.ReadFile(path); err == nil && string(b) == dir {
			os.Remove(path)
		}
	}
}

// lockRegistry takes the registry's lock, making the registry first.
func lockRegistry() (func(), error) {
	if err := os.MkdirAll(UIDRegistry, 0o700); err != nil {
		return nil, fmt.Errorf("make the jail user registry: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(UIDRegistry, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
