package oci

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// resolveInRoot makes the kernel resolve a path as if dir were "/": ".."
// stops at it and absolute symlinks start from it. Magic links (/proc/N/fd)
// are not followed at all.
const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// openRetries bounds the retries of an openat2 the kernel refused with
// EAGAIN, which it does when a rename or mount races the resolution.
const openRetries = 16

// tree is a directory that layers are written into. Paths in it are
// resolved from its descriptor by openat2 with RESOLVE_IN_ROOT, and entries
// are then made with the *at calls on a parent directory descriptor and a
// single name, so no path, however its symlinks point, reaches outside.
type tree struct {
	root int // O_PATH descriptor of the directory
}

// openTree opens dir as a tree. It fails with errdefs.ErrPrecondition on a
// kernel without openat2.
func openTree(dir string) (*tree, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	t := &tree{root: fd}
	probe, err := t.open(".", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		t.close()
		if errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("openat2 is not available (it needs Linux 5.6 or later): %w", errdefs.ErrPrecondition)
		}
		return nil, fmt.Errorf("openat2: %w", err)
	}
	unix.Close(probe)
	return t, nil
}

func (t *tree) close() { unix.Close(t.root) }

// open opens rel, a path relative to the tree, resolved inside it.
func (t *tree) open(rel string, flags int) (int, error) {
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveInRoot}
	for range openRetries {
		fd, err := unix.Openat2(t.root, rel, how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
	return -1, fmt.Errorf("open %s: resolution kept racing: %w", rel, unix.EAGAIN)
}

// openParent makes the parent directories of rel as needed and returns an
// O_PATH descriptor of its parent and its last component; for the root,
// the root itself and ".".
func (t *tree) openParent(rel string) (int, string, error) {
	if rel == "." {
		fd, err := t.open(".", unix.O_PATH|unix.O_DIRECTORY)
		return fd, ".", err
	}
	fd, err := t.mkdirAll(path.Dir(rel))
	if err != nil {
		return -1, "", err
	}
	return fd, path.Base(rel), nil
}

// maxSymlinks bounds the symlinks mkdirAll follows in one path, as the
// kernel's own limit does.
const maxSymlinks = 40

// mkdirAll makes the directory rel and any parents missing, mode 0755, and
// returns an O_PATH descriptor of it. A symlink on the way is followed
// inside the tree even if its target does not exist yet, which is then
// made, as containerd does. A component that is neither a directory nor a
// symlink is errdefs.ErrInvalid: a layer replacing it must say so with an
// entry of its own.
func (t *tree) mkdirAll(rel string) (int, error) {
	fd, err := t.open(rel, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, parentError(rel, err)
	}
	// Walk the path a component at a time. resolved is a path of real
	// directories; symlinks met are replaced by their targets, ".." stops
	// at the root. Each step is a single name in a directory opened
	// inside the tree, so even a wrong walk could not leave it.
	resolved := "."
	todo := strings.Split(rel, "/")
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		parent, err := t.open(resolved, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return -1, parentError(resolved, err)
		}
		next, target, err := step(parent, c)
		unix.Close(parent)
		if err != nil {
			return -1, parentError(path.Join(resolved, c), err)
		}
		if !next {
			resolved = path.Join(resolved, c)
			continue
		}
		if links++; links > maxSymlinks {
			return -1, parentError(rel, unix.ELOOP)
		}
		if strings.HasPrefix(target, "/") {
			resolved = "."
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	fd, err = t.open(resolved, unix.O_PATH|unix.O_DIRECTORY)
	return fd, parentError(resolved, err)
}

// step makes sure name in the directory parent is a directory, making it
// if missing, or reports that it is a symlink and where it points.
func step(parent int, name string) (isLink bool, target string, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		if err := unix.Mkdirat(parent, name, 0o755); err != nil {
			return false, "", err
		}
		return false, "", unix.Fchmodat(parent, name, 0o755, 0)
	case err != nil:
		return false, "", err
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return false, "", nil
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(parent, name, buf)
		if err != nil {
			return false, "", err
		}
		return true, string(buf[:n]), nil
	default:
		return false, "", unix.ENOTDIR
	}
}

// parentError explains a failure to open or make the directory rel.
func parentError(rel string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdefs.ErrInvalid):
		return err
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("parent %s is not a directory: %w", rel, errdefs.ErrInvalid)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("parent %s: too many levels of symlinks: %w", rel, errdefs.ErrInvalid)
	default:
		return fmt.Errorf("parent %s: %w", rel, err)
	}
}
