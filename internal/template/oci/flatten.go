package oci

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Layer whiteouts, as the OCI image spec names them.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // AUFS bookkeeping, skipped
	opaqueMarker   = ".wh..wh..opq"
)

// Flatten writes img's filesystem into dir, which must be an existing
// empty directory: the layers are applied in order, as a container runtime
// would unpack them, with whiteouts (.wh.NAME removes NAME of lower layers)
// and opaque directories (.wh..wh..opq removes the directory's lower-layer
// content and keeps what the same layer puts there). Files keep their
// mode, setuid, setgid and sticky bits included, their owner and their
// times; symlinks, hard links, directories, fifos and devices are made as
// the layer says, and extended attributes are set where the filesystem
// allows. Devices are skipped when the process may not make them. It is
// meant to run as root: owners are set as given.
//
// Nothing is written outside dir. Every path is resolved by the kernel with
// dir as its root (openat2 with RESOLVE_IN_ROOT), so a symlink in the tree,
// absolute or relative, resolves as it would inside the sandbox; parents
// missing on the way are made, through symlinks too. Entry names are taken
// relative to dir; a name or hard link target with a ".." component, or a
// hard link to something not in the tree, is errdefs.ErrInvalid. A kernel
// without openat2 (before Linux 5.6) is errdefs.ErrPrecondition.
//
// limit, which must be positive, bounds the bytes of file content
// written, summed over all layers; an image over it is errdefs.ErrTooLarge.
// On error dir holds part of the image, for the caller to remove.
func Flatten(ctx context.Context, img Image, dir string, limit int64) error {
	if limit <= 0 {
		return fmt.Errorf("flatten image into %s: limit %d is not positive: %w", dir, limit, errdefs.ErrInvalid)
	}
	if err := checkEmptyDir(dir); err != nil {
		return fmt.Errorf("flatten image into %s: %w", dir, err)
	}
	t, err := openTree(dir)
	if err != nil {
		return fmt.Errorf("flatten image into %s: %w", dir, err)
	}
	defer t.close()
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("flatten image into %s: %w", dir, registryError(ctx, "", "", err))
	}
	w := &writer{t: t, limit: limit, left: limit}
	for i, l := range layers {
		if err := w.applyLayer(ctx, l); err != nil {
			return fmt.Errorf("flatten image into %s: layer %d of %d: %w", dir, i+1, len(layers), err)
		}
	}
	return nil
}

// checkEmptyDir fails with errdefs.ErrInvalid unless dir is an empty
// directory.
func checkEmptyDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("not a directory: %w", errdefs.ErrInvalid)
	}
	names, err := f.Readdirnames(1)
	if len(names) > 0 {
		return fmt.Errorf("directory is not empty: %w", errdefs.ErrInvalid)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// writer applies layers to a tree, keeping count of the bytes written.
type writer struct {
	t     *tree
	limit int64
	left  int64 // of limit

	// Of the layer being applied:
	seen map[string]bool // paths it wrote, and their parents
	dirs []dirTimes      // times of its directories, set at its end
}

// dirTimes are the times a directory entry gives.
type dirTimes struct {
	rel   string
	atime time.Time
	mtime time.Time
}

// applyLayer applies one layer's tar stream.
func (w *writer) applyLayer(ctx context.Context, l v1.Layer) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return registryError(ctx, "", "", err)
	}
	defer rc.Close()
	w.seen = map[string]bool{}
	w.dirs = nil
	r := ctxReader{ctx: ctx, r: rc}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return readError(ctx, err)
		}
		if err := w.apply(hdr, tr); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			return fmt.Errorf("entry %q: %w", hdr.Name, registryError(ctx, "", "", err))
		}
	}
	// Read to the end, so that a digest check at the end of the stream runs.
	n, err := io.Copy(io.Discard, io.LimitReader(r, w.limit+1))
	if err != nil {
		return readError(ctx, err)
	}
	if n > w.limit {
		return fmt.Errorf("layer goes on after its tar archive ends for over the limit of %d bytes: %w", w.limit, errdefs.ErrTooLarge)
	}
	return w.setDirTimes()
}

// readError classifies an error reading a layer stream.
func readError(ctx context.Context, err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) {
		return fmt.Errorf("read layer: %v: %w", err, errdefs.ErrInvalid)
	}
	return fmt.Errorf("read layer: %w", registryError(ctx, "", "", err))
}

// apply writes one tar entry whose content is r.
func (w *writer) apply(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if base := path.Base(rel); strings.HasPrefix(base, whiteoutPrefix) {
		return w.whiteout(path.Dir(rel), base)
	}
	if rel == "." && hdr.Typeflag != tar.TypeDir {
		return fmt.Errorf("the root must be a directory: %w", errdefs.ErrInvalid)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return w.dir(rel, hdr)
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
		return w.file(rel, hdr, r)
	case tar.TypeSymlink:
		return w.symlink(rel, hdr)
	case tar.TypeLink:
		return w.hardlink(rel, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return w.node(rel, hdr)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("unsupported tar entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalid)
	}
}

// cleanName returns a tar entry name as a clean path relative to the tree,
// "." for the root. A ".." component is errdefs.ErrInvalid rather than
// resolved, however harmless.
func cleanName(name string) (string, error) {
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q has a \"..\" component: %w", name, errdefs.ErrInvalid)
		}
	}
	rel := strings.TrimPrefix(path.Clean("/"+name), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// mark records that this layer wrote rel, and so its parents.
func (w *writer) mark(rel string) {
	for p := rel; !w.seen[p]; p = path.Dir(p) {
		w.seen[p] = true
		if p == "." {
			break
		}
	}
}

// whiteout handles the whiteout entry base in directory dir.
func (w *writer) whiteout(dir, base string) error {
	if base == opaqueMarker {
		return w.opaque(dir)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("whiteout %q names nothing: %w", base, errdefs.ErrInvalid)
	}
	target := path.Join(dir, name)
	if w.seen[target] {
		return nil // a whiteout hides only lower layers
	}
	fd, err := w.t.open(dir, unix.O_PATH|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("whiteout %s: %w", target, err)
	}
	defer unix.Close(fd)
	if err := removeAt(fd, name); err != nil {
		return fmt.Errorf("whiteout %s: %w", target, err)
	}
	return nil
}

// opaque removes what lower layers put in dir, keeping what this layer
// wrote there before or after the marker.
func (w *writer) opaque(dir string) error {
	fd, err := w.t.mkdirAll(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	w.mark(dir)
	if err := w.clearLower(fd, dir); err != nil {
		return fmt.Errorf("opaque directory %s: %w", dir, err)
	}
	return nil
}

// clearLower removes every entry under the directory fd (at rel) that this
// layer did not write.
func (w *writer) clearLower(fd int, rel string) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(rel, n)
		if !w.seen[p] {
			if err := removeAt(fd, n); err != nil {
				return err
			}
			continue
		}
		sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // this layer's, and not a directory
		}
		if err != nil {
			return err
		}
		err = w.clearLower(sub, p)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}

// dir makes or updates a directory.
func (w *writer) dir(rel string, hdr *tar.Header) error {
	pfd, base, err := w.t.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if rel != "." {
		isDir, err := replace(pfd, base, true)
		if err != nil {
			return err
		}
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return fmt.Errorf("mkdir: %w", err)
			}
		}
	}
	if err := setOwnerMode(pfd, base, hdr); err != nil {
		return err
	}
	if hasXattrs(hdr) {
		if fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			setXattrs(fd, hdr)
			unix.Close(fd)
		}
	}
	w.dirs = append(w.dirs, dirTimes{rel: rel, atime: hdr.AccessTime, mtime: hdr.ModTime})
	w.mark(rel)
	return nil
}

// file writes a regular file.
func (w *writer) file(rel string, hdr *tar.Header, r io.Reader) error {
	if hdr.Size > w.left {
		return fmt.Errorf("image is over the limit of %d bytes: %w", w.limit, errdefs.ErrTooLarge)
	}
	pfd, base, err := w.t.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, err := replace(pfd, base, false); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := os.NewFile(uintptr(fd), rel)
	n, err := io.Copy(f, io.LimitReader(r, w.left+1))
	w.left -= n
	if err == nil && w.left < 0 {
		err = fmt.Errorf("image is over the limit of %d bytes: %w", w.limit, errdefs.ErrTooLarge)
	}
	if err == nil {
		// Owner before mode: changing the owner clears setuid and setgid.
		if err = unix.Fchown(fd, hdr.Uid, hdr.Gid); err == nil {
			err = unix.Fchmod(fd, uint32(hdr.Mode&0o7777))
		}
		setXattrs(fd, hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := setTimes(pfd, base, hdr.AccessTime, hdr.ModTime); err != nil {
		return err
	}
	w.mark(rel)
	return nil
}

// symlink makes a symlink. Its target is kept as given: it is only ever
// resolved inside the tree.
func (w *writer) symlink(rel string, hdr *tar.Header) error {
	pfd, base, err := w.t.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, err := replace(pfd, base, false); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return fmt.Errorf("symlink to %q: %w", hdr.Linkname, err)
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := setTimes(pfd, base, hdr.AccessTime, hdr.ModTime); err != nil {
		return err
	}
	w.mark(rel)
	return nil
}

// hardlink links rel to an existing non-directory of the tree.
func (w *writer) hardlink(rel string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	notInTree := fmt.Errorf("hard link target %q is not in the tree: %w", hdr.Linkname, errdefs.ErrInvalid)
	if target == "." {
		return notInTree
	}
	tfd, err := w.t.open(path.Dir(target), unix.O_PATH|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return notInTree
	}
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	defer unix.Close(tfd)
	tbase := path.Base(target)
	var tst unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &tst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return notInTree
		}
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if tst.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hard link target %q is a directory: %w", hdr.Linkname, errdefs.ErrInvalid)
	}

	pfd, base, err := w.t.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Dev == tst.Dev && st.Ino == tst.Ino {
		w.mark(rel)
		return nil // already that file
	}
	if _, err := replace(pfd, base, false); err != nil {
		return err
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	w.mark(rel)
	return nil
}

// node makes a fifo or a device; a device the process may not make is
// skipped.
func (w *writer) node(rel string, hdr *tar.Header) error {
	kind := uint32(unix.S_IFIFO)
	switch hdr.Typeflag {
	case tar.TypeChar:
		kind = unix.S_IFCHR
	case tar.TypeBlock:
		kind = unix.S_IFBLK
	}
	pfd, base, err := w.t.openParent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if _, err := replace(pfd, base, false); err != nil {
		return err
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := unix.Mknodat(pfd, base, kind|0o600, int(dev)); err != nil {
		if errors.Is(err, unix.EPERM) && kind != unix.S_IFIFO {
			return nil
		}
		return fmt.Errorf("mknod: %w", err)
	}
	if err := setOwnerMode(pfd, base, hdr); err != nil {
		return err
	}
	if err := setTimes(pfd, base, hdr.AccessTime, hdr.ModTime); err != nil {
		return err
	}
	w.mark(rel)
	return nil
}

// setDirTimes sets the times of the layer's directories, now that nothing
// more is written into them.
func (w *writer) setDirTimes() error {
	for _, d := range w.dirs {
		fd, err := w.t.open(path.Dir(d.rel), unix.O_PATH|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			continue // replaced later in the layer
		}
		if err != nil {
			return fmt.Errorf("set times of %s: %w", d.rel, err)
		}
		base := path.Base(d.rel)
		var st unix.Stat_t
		err = unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = setTimes(fd, base, d.atime, d.mtime)
		} else if errors.Is(err, unix.ENOENT) {
			err = nil
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("set times of %s: %w", d.rel, err)
		}
	}
	return nil
}

// replace clears the way for a new entry base in the directory pfd. An
// existing directory is kept, and reported, if keepDir; anything else there
// is removed.
func replace(pfd int, base string, keepDir bool) (isDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat: %w", err)
	}
	if keepDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true, nil
	}
	if err := removeAt(pfd, base); err != nil {
		return false, fmt.Errorf("remove what was there: %w", err)
	}
	return false, nil
}

// removeAt removes name, and all under it if it is a directory, from the
// directory dirfd. Symlinks are removed, never followed.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readNames(fd)
	for _, n := range names {
		if err == nil {
			err = removeAt(fd, n)
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// readNames lists the directory fd.
func readNames(fd int) ([]string, error) {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(dfd), ".")
	defer d.Close()
	return d.Readdirnames(-1)
}

// setOwnerMode sets the owner, then the mode, of a directory, fifo or
// device.
func setOwnerMode(pfd int, base string, hdr *tar.Header) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// setTimes sets the access and modification times of base in pfd, not
// following a symlink; a zero atime means mtime.
func setTimes(pfd int, base string, atime, mtime time.Time) error {
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// xattrPrefix marks an extended attribute among a tar header's PAX records.
const xattrPrefix = "SCHILY.xattr."

func hasXattrs(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, xattrPrefix) {
			return true
		}
	}
	return false
}

// setXattrs sets the extended attributes hdr carries on fd, as far as the
// filesystem allows.
func setXattrs(fd int, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, xattrPrefix); ok {
			_ = unix.Fsetxattr(fd, name, []byte(v), 0)
		}
	}
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
