package imagebuild

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
	"regexp"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Contexts keeps uploaded build contexts in a directory: each a tar archive
// stored whole as <id>.tar, beside <id>.sha256 holding its digest. An ID is
// "ctx" and the first 24 hex digits of the archive's sha256, so the same
// upload always gets the same ID. A Contexts holds no state of its own and
// is safe for concurrent use.
type Contexts struct {
	dir string
}

var contextID = regexp.MustCompile(`^ctx[0-9a-f]{24}$`)

// tempPattern names the files Put writes before they are complete.
const tempPattern = ".put-*.tmp"

// OpenContexts returns the store of build contexts in dir. The directory
// is made by the first Put.
func OpenContexts(dir string) *Contexts {
	return &Contexts{dir: dir}
}

// Put stores the tar archive read from r and returns its ID and its digest,
// "sha256:<hex>" of its bytes. It refuses a body over limit bytes
// (ErrTooLarge) and one that is not an uncompressed tar archive of
// directories, regular files, symlinks and hard links to earlier files,
// named by relative paths without ".." or NUL, none under a name that is
// not a directory (ErrInvalid). Symlinks may point anywhere: Select checks
// the ones a COPY follows. Storing the same bytes again returns the same ID.
func (c *Contexts) Put(ctx context.Context, r io.Reader, limit int64) (id, digest string, err error) {
	if limit <= 0 {
		return "", "", fmt.Errorf("store build context: limit %d is not positive: %w", limit, errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return "", "", fmt.Errorf("store build context: %w", err)
	}
	f, err := os.CreateTemp(c.dir, tempPattern)
	if err != nil {
		return "", "", fmt.Errorf("store build context: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), ctxReader{ctx, io.LimitReader(r, limit+1)})
	if err != nil {
		return "", "", fmt.Errorf("store build context: %w", err)
	}
	if n > limit {
		return "", "", fmt.Errorf("build context is over the limit of %d bytes: %w", limit, errdefs.ErrTooLarge)
	}
	if err := checkArchive(f); err != nil {
		return "", "", fmt.Errorf("build context %w", err)
	}
	if err := f.Sync(); err != nil {
		return "", "", fmt.Errorf("store build context: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", "", fmt.Errorf("store build context: %w", err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	id, digest = "ctx"+sum[:24], "sha256:"+sum
	// The digest goes first: an archive in place always has it beside.
	if err := atomicfile.WriteBytes(c.digestFile(id), []byte(digest+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("store build context %s: %w", id, err)
	}
	if err := os.Rename(f.Name(), c.file(id)); err != nil {
		return "", "", fmt.Errorf("store build context %s: %w", id, err)
	}
	if d, err := os.Open(c.dir); err == nil {
		d.Sync()
		d.Close()
	}
	return id, digest, nil
}

// checkArchive tells a gzip body apart from other garbage, then indexes
// the archive to check it.
func checkArchive(f *os.File) error {
	magic := make([]byte, 2)
	if _, err := f.ReadAt(magic, 0); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		return fmt.Errorf("is gzip-compressed; send an uncompressed tar: %w", errdefs.ErrInvalid)
	}
	if fi, err := f.Stat(); err != nil {
		return fmt.Errorf("is unreadable: %w", err)
	} else if fi.Size() == 0 {
		return fmt.Errorf("is empty, not a tar archive: %w", errdefs.ErrInvalid)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("is unreadable: %w", err)
	}
	_, err := readIndex(f)
	return err
}

// Open opens the archive of build context id.
func (c *Contexts) Open(id string) (*os.File, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	f, err := os.Open(c.file(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("build context %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open build context %s: %w", id, err)
	}
	return f, nil
}

// Path returns the path of build context id's archive and its digest.
func (c *Contexts) Path(id string) (string, string, error) {
	if err := checkID(id); err != nil {
		return "", "", err
	}
	p := c.file(id)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("build context %s: %w", id, errdefs.ErrNotFound)
	} else if err != nil {
		return "", "", fmt.Errorf("build context %s: %w", id, err)
	}
	b, err := os.ReadFile(c.digestFile(id))
	if err != nil {
		return "", "", fmt.Errorf("build context %s: read its digest: %w", id, err)
	}
	d := strings.TrimSpace(string(b))
	if !strings.HasPrefix(d, "sha256:"+strings.TrimPrefix(id, "ctx")) {
		return "", "", fmt.Errorf("build context %s: its digest file holds %q: %w", id, d, errdefs.ErrInvalid)
	}
	return p, d, nil
}

// Remove deletes build context id.
func (c *Contexts) Remove(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	err := os.Remove(c.file(id))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("build context %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("remove build context %s: %w", id, err)
	}
	if err := os.Remove(c.digestFile(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove build context %s: %w", id, err)
	}
	return nil
}

func checkID(id string) error {
	if !contextID.MatchString(id) {
		return fmt.Errorf("build context id %q is not ctx and 24 hex digits: %w", strings.ToValidUTF8(id, "?"), errdefs.ErrInvalid)
	}
	return nil
}

// file is the path of a valid id's archive.
func (c *Contexts) file(id string) string {
	return filepath.Join(c.dir, id+".tar")
}

// digestFile is the path of the file holding a valid id's digest.
func (c *Contexts) digestFile(id string) string {
	return filepath.Join(c.dir, id+".sha256")
}

// ctxReader stops a long read when its context ends.
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

// Prune removes the contexts uploaded more than age ago that inUse does
// not name, and what uploads cut short by a crash left that long ago. It
// returns how many contexts it removed.
func (c *Contexts) Prune(age time.Duration, inUse map[string]bool) (int, error) {
	ents, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("prune build contexts: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < age {
			continue
		}
		name := e.Name()
		if ok, _ := filepath.Match(tempPattern, name); ok {
			errs = append(errs, os.Remove(filepath.Join(c.dir, name)))
			continue
		}
		id, isTar := strings.CutSuffix(name, ".tar")
		if !isTar || !contextID.MatchString(id) || inUse[id] {
			continue
		}
		if err := c.Remove(id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
