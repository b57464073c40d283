package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// MaxFetchBytes is the largest image PutFetched takes: as much as a build
// unpacks.
const MaxFetchBytes int64 = 64 << 30

// Export is what one store gives another of an image: its settings and
// size, and the file to read it from.
type Export struct {
	Digest    string   `json:"digest"`
	SizeBytes int64    `json:"size_bytes"`
	Settings  Settings `json:"settings"`
}

// Export opens the stored image dgst ("sha256:<hex>") for another store to
// fetch. An image the store does not hold is errdefs.ErrNotFound; the
// caller closes the file.
func (s *Store) Export(dgst string) (Export, *os.File, error) {
	if !digestRE.MatchString(dgst) {
		return Export{}, nil, fmt.Errorf("template digest %q: a digest is sha256: and 64 lower-case hex digits: %w", dgst, errdefs.ErrInvalid)
	}
	t, err := s.load(dgst)
	if errors.Is(err, fs.ErrNotExist) {
		return Export{}, nil, fmt.Errorf("template %s is not stored here: %w", dgst, errdefs.ErrNotFound)
	}
	if err != nil {
		return Export{}, nil, err
	}
	f, err := os.Open(t.Image)
	if err != nil {
		return Export{}, nil, fmt.Errorf("template %s: %w", dgst, err)
	}
	return Export{Digest: dgst, SizeBytes: t.SizeBytes, Settings: t.Settings()}, f, nil
}

// PutFetched stores the image an Export described, read from r, without
// naming it: only if r gives exactly e.SizeBytes bytes, they hash to
// e.Digest and they hold an ext4 filesystem. Anything else is
// errdefs.ErrInvalid (or the read's error) and stores nothing. A digest
// stored already is not fetched again: r is left unread.
func (s *Store) PutFetched(ctx context.Context, e Export, r io.Reader) (Template, error) {
	if !digestRE.MatchString(e.Digest) {
		return Template{}, fmt.Errorf("fetch template: digest %q is not sha256: and 64 lower-case hex digits: %w", e.Digest, errdefs.ErrInvalid)
	}
	if t, err := s.load(e.Digest); err == nil {
		return t, nil
	}
	if e.SizeBytes <= 0 || e.SizeBytes > MaxFetchBytes {
		return Template{}, fmt.Errorf("fetch template %s: size %d is not between 1 byte and %d GiB: %w", e.Digest, e.SizeBytes, MaxFetchBytes>>30, errdefs.ErrInvalid)
	}
	if err := e.Settings.validate(); err != nil {
		return Template{}, fmt.Errorf("fetch template %s: %w", e.Digest, err)
	}
	dir, err := s.TempDir("fetch")
	if err != nil {
		return Template{}, fmt.Errorf("fetch template %s: %w", e.Digest, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "image.ext4")
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Template{}, fmt.Errorf("fetch template %s: %w", e.Digest, err)
	}
	h := sha256.New()
	// One byte past the size tells a longer stream from an exact one.
	n, err := io.Copy(io.MultiWriter(out, h), cancelReader{ctx, io.LimitReader(r, e.SizeBytes+1)})
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Template{}, fmt.Errorf("fetch template %s: after %d of %d bytes: %w", e.Digest, n, e.SizeBytes, err)
	}
	if n != e.SizeBytes {
		return Template{}, fmt.Errorf("fetch template %s: got %d bytes, want %d: %w", e.Digest, n, e.SizeBytes, errdefs.ErrInvalid)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want := strings.TrimPrefix(e.Digest, "sha256:"); sum != want {
		return Template{}, fmt.Errorf("fetch template %s: the bytes hash to sha256:%s: %w", e.Digest, sum, errdefs.ErrInvalid)
	}
	if err := checkExt4(tmp); err != nil {
		return Template{}, fmt.Errorf("fetch template %s: %w", e.Digest, err)
	}
	return s.install(tmp, sum, n, e.Settings)
}

// Described is the template that an image's settings describe, for an
// image stored elsewhere (a cluster's catalogue names it): its Image is
// "". Settings that no store would hold are errdefs.ErrInvalid.
func Described(name, tag string, e Export, created time.Time) (Template, error) {
	if !digestRE.MatchString(e.Digest) {
		return Template{}, fmt.Errorf("template %s:%s: digest %q is not sha256: and 64 lower-case hex digits: %w", name, tag, e.Digest, errdefs.ErrInvalid)
	}
	if err := e.Settings.validate(); err != nil {
		return Template{}, fmt.Errorf("template %s:%s: %w", name, tag, err)
	}
	d := e.Settings
	return Template{
		Name: name, Tag: tag, Digest: e.Digest,
		VCPUs: d.VCPUs, MemoryMiB: d.MemoryMiB, DiskMiB: d.DiskMiB,
		StartCmd: d.StartCmd, ReadyPort: d.ReadyPort, ReadyPath: d.ReadyPath, Recipe: d.Recipe,
		ReadyCmd: d.ReadyCmd, Config: d.Config, Source: d.Source, Parents: d.Parents,
		SizeBytes: e.SizeBytes, CreatedAt: created,
	}, nil
}
