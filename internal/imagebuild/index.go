package imagebuild

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxEntries bounds the entries of one build context, and so the memory of
// its index.
const maxEntries = 1 << 20

// entry is the last entry of one name in a build context archive.
type entry struct {
	// name is the cleaned path relative to the context root.
	name string
	hdr  *tar.Header
	// seq is the entry's place in the archive.
	seq int
	// off is where a regular file's data starts in the archive.
	off int64
	// data is the regular file whose bytes this entry has: itself, or the
	// target of a hard link as it was when the link came.
	data *entry
}

// index is what a build context archive holds, by name: what extracting it
// whole would leave.
type index struct {
	entries map[string]*entry
	// parents holds every name some entry is under; "" is the root.
	parents map[string]bool
	// order holds the entries by seq.
	order []*entry
}

// readIndex reads the archive in f and checks it. Entry names must be
// relative, without ".." or NUL; entries are directories, regular files,
// symlinks (any target: whether following one stays in the context is
// checked when a COPY follows it) and hard links to an earlier file. A name
// may not lie under one that is not a directory, which would write through
// a symlink on extraction. Devices, fifos and sparse files are refused. A
// later entry of a name replaces an earlier one, as on extraction.
func readIndex(f *os.File) (*index, error) {
	ix := &index{entries: map[string]*entry{}, parents: map[string]bool{"": true}}
	tr := tar.NewReader(f)
	for seq := 0; ; seq++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("is not a valid tar archive: %v: %w", err, errdefs.ErrInvalid)
		}
		if seq >= maxEntries {
			return nil, fmt.Errorf("has more than %d entries: %w", maxEntries, errdefs.ErrTooLarge)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return nil, err
		}
		e := &entry{name: name, hdr: hdr, seq: seq}
		switch hdr.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg:
			if isSparse(hdr) {
				return nil, fmt.Errorf("entry %s: sparse files are not supported: %w", name, errdefs.ErrInvalid)
			}
			if e.off, err = f.Seek(0, io.SeekCurrent); err != nil {
				return nil, fmt.Errorf("entry %s: find its data: %w", name, err)
			}
			e.data = e
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
				return nil, fmt.Errorf("entry %s: symlink target is empty or contains a NUL byte: %w", name, errdefs.ErrInvalid)
			}
		case tar.TypeLink:
			target, err := entryName(hdr.Linkname)
			if err != nil {
				return nil, fmt.Errorf("hard link %s: %w", name, err)
			}
			t := ix.entries[target]
			if t == nil || t.data == nil {
				return nil, fmt.Errorf("entry %s: hard link target %s is not an earlier file: %w", name, target, errdefs.ErrInvalid)
			}
			e.data = t.data
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return nil, fmt.Errorf("entry %s: devices and fifos are not allowed: %w", name, errdefs.ErrInvalid)
		default:
			return nil, fmt.Errorf("entry %s: tar entry type %q is not supported: %w", name, hdr.Typeflag, errdefs.ErrInvalid)
		}
		if name == "" {
			if hdr.Typeflag != tar.TypeDir {
				return nil, fmt.Errorf("entry %q names the context root, which is a directory: %w", hdr.Name, errdefs.ErrInvalid)
			}
			continue
		}
		ix.entries[name] = e
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			ix.parents[p] = true
		}
	}
	for p := range ix.parents {
		if e := ix.entries[p]; e != nil && e.hdr.Typeflag != tar.TypeDir {
			return nil, fmt.Errorf("entry %s: it holds other entries but is not a directory: %w", p, errdefs.ErrInvalid)
		}
	}
	for _, e := range ix.entries {
		ix.order = append(ix.order, e)
	}
	slices.SortFunc(ix.order, func(a, b *entry) int { return a.seq - b.seq })
	return ix, nil
}

// entryName cleans an archive entry name into a path relative to the root,
// "" for the root itself.
func entryName(raw string) (string, error) {
	switch {
	case strings.ContainsRune(raw, 0):
		return "", fmt.Errorf("entry name %q contains a NUL byte: %w", raw, errdefs.ErrInvalid)
	case strings.HasPrefix(raw, "/"):
		return "", fmt.Errorf("entry %s has an absolute name: %w", raw, errdefs.ErrInvalid)
	}
	var parts []string
	for _, p := range strings.Split(raw, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", fmt.Errorf("entry %s has a .. component: %w", raw, errdefs.ErrInvalid)
		default:
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 && raw == "" {
		return "", fmt.Errorf("entry with an empty name: %w", errdefs.ErrInvalid)
	}
	return strings.Join(parts, "/"), nil
}

func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// isDir reports whether name is a directory in the context.
func (ix *index) isDir(name string) bool {
	if ix.parents[name] {
		return true
	}
	e := ix.entries[name]
	return e != nil && e.hdr.Typeflag == tar.TypeDir
}

// maxLinks bounds the symlinks followed in resolving one path, as
// Linux's ELOOP does.
const maxLinks = 40

// resolve follows the symlinks of the path rel, its last component
// included, within the context: a symlink whose target is absolute or
// climbs above the root is refused. src is the source as written, for
// messages. The result may not exist.
func (ix *index) resolve(src, rel string) (string, error) {
	todo := splitPath(rel)
	cur, links := "", 0
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		if p == ".." {
			if cur == "" {
				return "", fmt.Errorf("COPY source %s is outside the build context: %w", src, errdefs.ErrInvalid)
			}
			cur = parentOf(cur)
			continue
		}
		next := path.Join(cur, p)
		e := ix.entries[next]
		if e == nil || e.hdr.Typeflag != tar.TypeSymlink {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("COPY source %s: too many levels of symlinks: %w", src, errdefs.ErrInvalid)
		}
		target := e.hdr.Linkname
		if path.IsAbs(target) || escapes(cur, target) {
			return "", fmt.Errorf("COPY source %s: symlink %s -> %s leads outside the build context: %w", src, next, target, errdefs.ErrInvalid)
		}
		todo = append(splitPath(target), todo...)
	}
	return cur, nil
}

// escapes reports whether the relative symlink target, taken from the
// directory dir, climbs above the root.
func escapes(dir, target string) bool {
	depth := len(splitPath(dir))
	for _, p := range splitPath(target) {
		if p == ".." {
			if depth--; depth < 0 {
				return true
			}
		} else {
			depth++
		}
	}
	return false
}

func splitPath(p string) []string {
	var parts []string
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			parts = append(parts, s)
		}
	}
	return parts
}

func parentOf(name string) string {
	if d := path.Dir(name); d != "." {
		return d
	}
	return ""
}
