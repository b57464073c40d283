package imagebuild

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Selection is what one COPY source takes from a build context, ready to be
// written as a tar stream for extraction at the destination (Extract).
//
// A directory selection (Dir) holds the contents of the source directory,
// or of all the matches of a pattern. Otherwise it is one file, named Name
// unless the destination renames it. Symlinks inside a copied directory
// are copied as symlinks; a symlink named by the source itself is followed.
//
// Entries keep the mode, owners and modification time of the context;
// COPY's rule that files belong to root, or to --chown, is the extractor's
// to apply. Hard links within the selection stay hard links; one to a file
// outside it is written as a copy of the file.
type Selection struct {
	// Dir reports whether this is a directory selection.
	Dir bool
	// Name is the base name of the source of a file selection.
	Name string
	// Digest is "sha256:<hex>" over what the selection copies: each
	// entry's name, type, mode, owners, link target and bytes, but not its
	// modification time. It is the copy's part of a step's cache key.
	Digest string

	archive string
	items   []item
}

// item is one entry of a selection.
type item struct {
	name string
	e    *entry
	// link is the name, in the selection, of the file a hard link is
	// written as a link to; "" writes its data.
	link string
}

// Select returns what COPY src takes from build context id. src is a path in
// the context as in Copy.Src; it may not climb out with ".." nor reach
// through a symlink that leads out of the context (ErrInvalid), and must
// exist (ErrNotFound). A pattern (*, ? or [...]) selects every match: the
// components before the first with a pattern are resolved as a path, the
// rest are matched against the names under it, and each match is taken as
// if named alone; several matches make a directory selection.
func (c *Contexts) Select(id, src string) (*Selection, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if strings.ContainsRune(src, 0) {
		return nil, fmt.Errorf("COPY source contains a NUL byte: %w", errdefs.ErrInvalid)
	}
	rel, dirOnly, err := sourcePath(src)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(c.file(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("build context %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open build context %s: %w", id, err)
	}
	defer f.Close()
	ix, err := readIndex(f)
	if err != nil {
		return nil, fmt.Errorf("build context %s %w", id, err)
	}
	var s *Selection
	if strings.ContainsAny(rel, "*?[") {
		s, err = ix.selectPattern(src, rel, dirOnly)
	} else {
		s, err = ix.selectPath(src, rel, dirOnly)
	}
	if err != nil {
		return nil, err
	}
	s.archive = f.Name()
	if s.Digest, err = s.hash(f); err != nil {
		return nil, fmt.Errorf("read build context %s: %w", id, err)
	}
	return s, nil
}

// selectPath selects the one path rel, following its symlinks.
func (ix *index) selectPath(src, rel string, dirOnly bool) (*Selection, error) {
	name, err := ix.resolve(src, rel)
	if err != nil {
		return nil, err
	}
	if ix.isDir(name) {
		return &Selection{Dir: true, items: ix.under(name)}, nil
	}
	e := ix.entries[name]
	if e == nil {
		return nil, fmt.Errorf("COPY source %s is not in the build context: %w", src, errdefs.ErrNotFound)
	}
	if dirOnly {
		return nil, fmt.Errorf("COPY source %s is not a directory: %w", src, errdefs.ErrInvalid)
	}
	base := path.Base(rel)
	return &Selection{Name: base, items: []item{{name: base, e: e}}}, nil
}

// under lists the entries under the directory dir, named relative to it.
func (ix *index) under(dir string) []item {
	prefix := dir + "/"
	if dir == "" {
		prefix = ""
	}
	var items []item
	written := map[*entry]string{}
	for _, e := range ix.order {
		if !strings.HasPrefix(e.name, prefix) {
			continue
		}
		it := item{name: strings.TrimPrefix(e.name, prefix), e: e}
		if e.hdr.Typeflag == tar.TypeLink {
			it.link = written[e.data]
		}
		if e.hdr.Typeflag == tar.TypeReg {
			written[e] = it.name
		}
		items = append(items, it)
	}
	return items
}

// selectPattern selects every match of a pattern. The components before
// the first one with a pattern are resolved as a path; the rest are
// matched against the names under it.
func (ix *index) selectPattern(src, rel string, dirOnly bool) (*Selection, error) {
	parts := splitPath(rel)
	i := slices.IndexFunc(parts, func(p string) bool { return strings.ContainsAny(p, "*?[") })
	base, err := ix.resolve(src, strings.Join(parts[:i], "/"))
	if err != nil {
		return nil, err
	}
	pattern := strings.Join(parts[i:], "/")
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("COPY source %s is not a valid pattern: %w", src, errdefs.ErrInvalid)
	}
	prefix := base + "/"
	if base == "" {
		prefix = ""
	}
	var matches []string
	for name := range ix.names() {
		if rest, ok := strings.CutPrefix(name, prefix); ok && name != base {
			if ok, _ := path.Match(pattern, rest); ok {
				matches = append(matches, name)
			}
		}
	}
	slices.Sort(matches)
	if len(matches) == 0 {
		return nil, fmt.Errorf("COPY source %s matches nothing in the build context: %w", src, errdefs.ErrNotFound)
	}
	var sels []*Selection
	for _, m := range matches {
		s, err := ix.selectPath(src, m, dirOnly)
		if err != nil {
			return nil, err
		}
		sels = append(sels, s)
	}
	if len(sels) == 1 {
		return sels[0], nil
	}
	merged := &Selection{Dir: true}
	for _, s := range sels {
		merged.items = append(merged.items, s.items...)
	}
	return merged, nil
}

// names yields every name in the context: entries and implied directories.
func (ix *index) names() func(func(string) bool) {
	return func(yield func(string) bool) {
		for name := range ix.entries {
			if !yield(name) {
				return
			}
		}
		for name := range ix.parents {
			if _, ok := ix.entries[name]; !ok && name != "" && !yield(name) {
				return
			}
		}
	}
}

// record is what the digest covers of one entry.
type record struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Mode   int64  `json:"mode"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
	Uname  string `json:"uname,omitempty"`
	Gname  string `json:"gname,omitempty"`
	Link   string `json:"link,omitempty"`
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

func (s *Selection) hash(f *os.File) (string, error) {
	h := sha256.New()
	enc := json.NewEncoder(h)
	if err := enc.Encode(struct {
		Dir bool `json:"dir"`
	}{s.Dir}); err != nil {
		return "", err
	}
	for _, it := range s.items {
		hdr := it.header()
		r := record{Name: hdr.Name, Type: string(hdr.Typeflag), Mode: hdr.Mode, UID: hdr.Uid, GID: hdr.Gid,
			Uname: hdr.Uname, Gname: hdr.Gname, Link: hdr.Linkname, Size: hdr.Size}
		if it.e.data != nil {
			fh := sha256.New()
			if _, err := io.Copy(fh, it.data(f)); err != nil {
				return "", err
			}
			r.SHA256 = hex.EncodeToString(fh.Sum(nil))
		}
		if err := enc.Encode(r); err != nil {
			return "", err
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// header returns the tar header the item is written with.
func (it item) header() *tar.Header {
	src := it.e.hdr
	hdr := &tar.Header{
		Name:    it.name,
		Mode:    src.Mode & 0o7777,
		Uid:     src.Uid,
		Gid:     src.Gid,
		Uname:   src.Uname,
		Gname:   src.Gname,
		ModTime: src.ModTime,
	}
	switch {
	case src.Typeflag == tar.TypeDir:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case src.Typeflag == tar.TypeSymlink:
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = src.Linkname
	case it.link != "":
		hdr.Typeflag = tar.TypeLink
		hdr.Linkname = it.link
	default:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = it.e.data.hdr.Size
	}
	return hdr
}

// data reads the item's file bytes from the archive f, empty for an item
// written without data.
func (it item) data(f *os.File) io.Reader {
	if it.link != "" || it.e.data == nil {
		return strings.NewReader("")
	}
	return io.NewSectionReader(f, it.e.data.off, it.e.data.hdr.Size)
}

// Extract returns the directory in the guest to extract the selection in,
// and the tar stream to extract there, for a copy to dest, an absolute
// path. A directory selection goes inside dest. A file selection goes
// inside dest when dest ends in "/" (a caller that finds dest to be an
// existing directory appends one, as Docker copies into it), and is
// written as dest otherwise. Directories on the way to the returned one
// are the extractor's to make. The stream reads the context archive as it
// goes: it fails if the context is removed meanwhile, and must be closed.
func (s *Selection) Extract(dest string) (root string, r io.ReadCloser, err error) {
	root, items, err := s.place(dest)
	if err != nil {
		return "", nil, err
	}
	f, err := os.Open(s.archive)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, fmt.Errorf("extract COPY selection: the build context is gone: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return "", nil, fmt.Errorf("extract COPY selection: %w", err)
	}
	ts := &tarStream{f: f, items: items}
	ts.tw = tar.NewWriter(&ts.buf)
	return root, ts, nil
}

// Targets returns the paths in the guest that Extract(dest) writes at the
// top: each one the extractor creates or replaces in the returned root.
// A --chown applies to them and, recursively, to what is under them (with
// chown -R -h, so that a copied symlink is not followed).
func (s *Selection) Targets(dest string) ([]string, error) {
	root, items, err := s.place(dest)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, it := range items {
		top, _, _ := strings.Cut(it.name, "/")
		if !seen[top] {
			seen[top] = true
			out = append(out, path.Join(root, top))
		}
	}
	return out, nil
}

// place returns where the selection goes for a copy to dest, and its items
// named for there.
func (s *Selection) place(dest string) (string, []item, error) {
	if !path.IsAbs(dest) || strings.ContainsRune(dest, 0) {
		return "", nil, fmt.Errorf("COPY destination %q is not an absolute path: %w", dest, errdefs.ErrInvalid)
	}
	clean := path.Clean(dest)
	if s.Dir || strings.HasSuffix(dest, "/") || clean == "/" {
		return clean, s.items, nil
	}
	return path.Dir(clean), []item{{name: path.Base(clean), e: s.items[0].e}}, nil
}

// tarStream writes a selection's tar stream as it is read: each Read
// writes the next header or the next piece of file data into buf.
type tarStream struct {
	f     *os.File
	items []item
	tw    *tar.Writer
	buf   bytes.Buffer
	// data is the rest of the current item's bytes, nil between items.
	data io.Reader
	next int
	done bool
	err  error
}

// chunk is how much file data one step of a tarStream copies.
const chunk = 64 << 10

func (t *tarStream) Read(p []byte) (int, error) {
	for t.buf.Len() == 0 {
		switch {
		case t.err != nil:
			return 0, t.err
		case t.done:
			return 0, io.EOF
		}
		if err := t.step(); err != nil {
			t.err = fmt.Errorf("write COPY selection: %w", err)
		}
	}
	return t.buf.Read(p)
}

// step writes the next piece of the stream into buf.
func (t *tarStream) step() error {
	if t.data != nil {
		_, err := io.CopyN(t.tw, t.data, chunk)
		if err == io.EOF {
			t.data = nil
			return nil
		}
		return err
	}
	if t.next == len(t.items) {
		t.done = true
		return t.tw.Close()
	}
	it := t.items[t.next]
	t.next++
	if err := t.tw.WriteHeader(it.header()); err != nil {
		return err
	}
	t.data = it.data(t.f)
	return nil
}

// Close closes the context archive.
func (t *tarStream) Close() error { return t.f.Close() }
