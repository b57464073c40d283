package oci

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxMetadataBlob bounds the size of an index, manifest or config read
// from an archive into memory.
const maxMetadataBlob = 16 << 20

// OpenArchive opens the image in the uncompressed tar file at path, which
// is either a `docker save` tarball (manifest.json naming one image) or an
// OCI image layout (oci-layout and index.json at the top, blobs under
// blobs/). From an OCI layout it picks the linux/amd64 image as Pull does
// from an index; when a tarball is both, as docker 25 and later write them,
// the OCI layout is read. Anything else is errdefs.ErrInvalid. Blobs are
// read from the file as the image is used, so it must stay in place until
// the caller is done with the image.
func OpenArchive(path string) (Image, error) {
	what := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open image archive %s: %w", what, err)
	}
	defer f.Close()
	if err := checkUncompressed(f, what); err != nil {
		return nil, err
	}
	entries, err := scanTar(f)
	if err != nil {
		return nil, fmt.Errorf("open image archive %s: not a tar archive: %v: %w", what, err, errdefs.ErrInvalid)
	}
	_, hasLayout := entries["oci-layout"]
	_, hasIndex := entries["index.json"]
	_, hasManifest := entries["manifest.json"]
	switch {
	case hasLayout && hasIndex:
		return openLayout(&archive{path: path, entries: entries}, what)
	case hasManifest:
		return openDockerSave(path, what)
	default:
		return nil, fmt.Errorf("open image archive %s: neither a docker save tarball (manifest.json) nor an OCI image layout (oci-layout, index.json): %w",
			what, errdefs.ErrInvalid)
	}
}

// checkUncompressed fails with a hint to decompress if f starts with gzip
// or zstd magic, and leaves f at its start.
func checkUncompressed(f *os.File, what string) error {
	var magic [4]byte
	n, err := io.ReadFull(f, magic[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return fmt.Errorf("open image archive %s: %w", what, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("open image archive %s: %w", what, err)
	}
	switch {
	case n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		return fmt.Errorf("open image archive %s: it is gzip-compressed; upload the uncompressed tar: %w", what, errdefs.ErrInvalid)
	case n == 4 && bytes.Equal(magic[:], []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return fmt.Errorf("open image archive %s: it is zstd-compressed; upload the uncompressed tar: %w", what, errdefs.ErrInvalid)
	}
	return nil
}

// tarEntry is where a regular file's content lies in a tar file.
type tarEntry struct {
	offset, size int64
}

// scanTar returns the regular files of the tar file f by cleaned name, hard
// links resolved. The tar reader seeks over file content, so f's position
// after each header is where that file's content starts.
func scanTar(f *os.File) (map[string]tarEntry, error) {
	entries := make(map[string]tarEntry)
	links := make(map[string]string)
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := archiveName(hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeReg:
			off, err := f.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, err
			}
			entries[name] = tarEntry{offset: off, size: hdr.Size}
		case tar.TypeLink:
			links[name] = archiveName(hdr.Linkname)
		}
	}
	for name, target := range links {
		if e, ok := entries[target]; ok {
			entries[name] = e
		}
	}
	return entries, nil
}

// archiveName is a tar entry name relative to the archive's top: "./"
// and "/" prefixes removed.
func archiveName(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// openDockerSave opens the one image of a docker save tarball.
func openDockerSave(path, what string) (v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("open image archive %s: read manifest.json: %v: %w", what, err, errdefs.ErrInvalid)
	}
	if len(m) != 1 {
		return nil, fmt.Errorf("open image archive %s: it holds %d images; save exactly one: %w", what, len(m), errdefs.ErrInvalid)
	}
	img, err := tarball.Image(opener, nil)
	if err != nil {
		return nil, fmt.Errorf("open image archive %s: %v: %w", what, err, errdefs.ErrInvalid)
	}
	if err := checkPlatform(img, what); err != nil {
		return nil, err // it names the archive
	}
	return img, nil
}

// openLayout picks the linux/amd64 image of the OCI layout in a.
func openLayout(a *archive, what string) (v1.Image, error) {
	raw, err := a.readFile("index.json")
	if err != nil {
		return nil, fmt.Errorf("open image archive %s: %w", what, err)
	}
	idx, err := a.index(raw, types.OCIImageIndex)
	if err != nil {
		return nil, fmt.Errorf("open image archive %s: index.json: %w", what, err)
	}
	img, _, err := pickImage(idx, what)
	if err != nil {
		return nil, err // it names the archive
	}
	return img, nil
}

// archive is an OCI image layout inside a tar file.
type archive struct {
	path    string
	entries map[string]tarEntry
}

// open returns a reader of the named file in the archive.
func (a *archive) open(name string) (io.ReadCloser, int64, error) {
	e, ok := a.entries[name]
	if !ok {
		return nil, 0, fmt.Errorf("the archive has no %s: %w", name, errdefs.ErrInvalid)
	}
	f, err := os.Open(a.path)
	if err != nil {
		return nil, 0, err
	}
	return readCloser{io.NewSectionReader(f, e.offset, e.size), f}, e.size, nil
}

// readFile returns the content of a small file in the archive.
func (a *archive) readFile(name string) ([]byte, error) {
	rc, size, err := a.open(name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if size > maxMetadataBlob {
		return nil, fmt.Errorf("%s is %d bytes, over the %d allowed: %w", name, size, maxMetadataBlob, errdefs.ErrInvalid)
	}
	return io.ReadAll(rc)
}

// openBlob returns a reader of the blob d names that fails at its end if
// the content does not match d's digest and size.
func (a *archive) openBlob(d v1.Descriptor) (io.ReadCloser, error) {
	if d.Digest.Algorithm != "sha256" {
		return nil, fmt.Errorf("blob %s: only sha256 digests are supported: %w", d.Digest, errdefs.ErrInvalid)
	}
	rc, size, err := a.open("blobs/sha256/" + d.Digest.Hex)
	if err != nil {
		return nil, err
	}
	if size != d.Size {
		rc.Close()
		return nil, fmt.Errorf("blob %s is %d bytes, its descriptor says %d: %w", d.Digest, size, d.Size, errdefs.ErrInvalid)
	}
	return &verifier{rc: rc, h: sha256.New(), want: d.Digest}, nil
}

// readBlob returns the content of a small blob, verified.
func (a *archive) readBlob(d v1.Descriptor) ([]byte, error) {
	if d.Size > maxMetadataBlob {
		return nil, fmt.Errorf("blob %s is %d bytes, over the %d allowed: %w", d.Digest, d.Size, maxMetadataBlob, errdefs.ErrInvalid)
	}
	rc, err := a.openBlob(d)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// index parses raw as an image index.
func (a *archive) index(raw []byte, mt types.MediaType) (*archiveIndex, error) {
	var m v1.IndexManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("parse index: %v: %w", err, errdefs.ErrInvalid)
	}
	if m.MediaType != "" {
		mt = m.MediaType
	}
	return &archiveIndex{a: a, raw: raw, m: &m, mediaType: mt}, nil
}

// descriptor returns the entry of m for h.
func descriptor(m *v1.IndexManifest, h v1.Hash) (v1.Descriptor, error) {
	for _, d := range m.Manifests {
		if d.Digest == h {
			return d, nil
		}
	}
	return v1.Descriptor{}, fmt.Errorf("index has no manifest %s: %w", h, errdefs.ErrNotFound)
}

// archiveIndex is an image index read from an archive.
type archiveIndex struct {
	a         *archive
	raw       []byte
	m         *v1.IndexManifest
	mediaType types.MediaType
}

var _ v1.ImageIndex = (*archiveIndex)(nil)

func (x *archiveIndex) MediaType() (types.MediaType, error) { return x.mediaType, nil }
func (x *archiveIndex) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(x.raw))
	return h, err
}
func (x *archiveIndex) Size() (int64, error) { return int64(len(x.raw)), nil }
func (x *archiveIndex) IndexManifest() (*v1.IndexManifest, error) {
	return x.m.DeepCopy(), nil
}
func (x *archiveIndex) RawManifest() ([]byte, error) { return x.raw, nil }

func (x *archiveIndex) Image(h v1.Hash) (v1.Image, error) {
	d, err := descriptor(x.m, h)
	if err != nil {
		return nil, err
	}
	raw, err := x.a.readBlob(d)
	if err != nil {
		return nil, err
	}
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("parse manifest %s: %v: %w", h, err, errdefs.ErrInvalid)
	}
	mt := d.MediaType
	if m.MediaType != "" {
		mt = m.MediaType
	}
	return partial.CompressedToImage(&archiveImage{a: x.a, raw: raw, m: &m, mediaType: mt})
}

func (x *archiveIndex) ImageIndex(h v1.Hash) (v1.ImageIndex, error) {
	d, err := descriptor(x.m, h)
	if err != nil {
		return nil, err
	}
	raw, err := x.a.readBlob(d)
	if err != nil {
		return nil, err
	}
	return x.a.index(raw, d.MediaType)
}

// archiveImage is an image manifest read from an archive; it implements
// partial.CompressedImageCore.
type archiveImage struct {
	a         *archive
	raw       []byte
	m         *v1.Manifest
	mediaType types.MediaType
}

func (i *archiveImage) RawConfigFile() ([]byte, error)      { return i.a.readBlob(i.m.Config) }
func (i *archiveImage) MediaType() (types.MediaType, error) { return i.mediaType, nil }
func (i *archiveImage) RawManifest() ([]byte, error)        { return i.raw, nil }

func (i *archiveImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == i.m.Config.Digest {
		return &archiveLayer{a: i.a, d: i.m.Config}, nil
	}
	for _, d := range i.m.Layers {
		if d.Digest == h {
			return &archiveLayer{a: i.a, d: d}, nil
		}
	}
	return nil, fmt.Errorf("manifest has no layer %s: %w", h, errdefs.ErrNotFound)
}

// archiveLayer is a blob of an archive; it implements
// partial.CompressedLayer.
type archiveLayer struct {
	a *archive
	d v1.Descriptor
}

func (l *archiveLayer) Digest() (v1.Hash, error)            { return l.d.Digest, nil }
func (l *archiveLayer) Compressed() (io.ReadCloser, error)  { return l.a.openBlob(l.d) }
func (l *archiveLayer) Size() (int64, error)                { return l.d.Size, nil }
func (l *archiveLayer) MediaType() (types.MediaType, error) { return l.d.MediaType, nil }

// readCloser joins a reader and the file under it.
type readCloser struct {
	io.Reader
	io.Closer
}

// verifier hashes what is read through it and fails at the end if the
// content does not match want.
type verifier struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want.Hex {
			return n, fmt.Errorf("blob %s: content has digest sha256:%s: %w", v.want, got, errdefs.ErrInvalid)
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }
