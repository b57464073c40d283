package template

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// ImportImage stores the ready ext4 image at imagePath (a saved sandbox
// disk, say) as name:tag with the given settings, as Import does for a
// tree: the image is moved into the store (renamed, or copied and then
// removed when it is on another filesystem), hashed and stored under its
// digest (PutImage), and name:tag is pointed at it (Tag). Importing
// content that is stored already only replaces its settings and moves the
// ref. A file that is not an ext4 image is errdefs.ErrInvalid. If the
// import fails before the image is stored, the file is back at imagePath.
func (s *Store) ImportImage(ctx context.Context, name, tag, imagePath string, defaults Settings) (Template, error) {
	if tag == "" {
		tag = DefaultTag
	}
	ref := name + ":" + tag
	if n, _, err := ParseRef(ref); err != nil || n == "" {
		return Template{}, fmt.Errorf("import image as %s: bad name or tag: %w", ref, errdefs.ErrInvalid)
	}
	if err := defaults.validate(); err != nil {
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	fi, err := os.Stat(imagePath)
	if err != nil {
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	if err := checkExt4(imagePath); err != nil {
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	dir, err := s.TempDir("import-image")
	if err != nil {
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "image.ext4")
	moved := true
	if err := os.Rename(imagePath, tmp); errors.Is(err, syscall.EXDEV) {
		moved = false
		if err := copyImageFile(ctx, imagePath, tmp); err != nil {
			return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
		}
	} else if err != nil {
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	t, err := s.PutImage(ctx, tmp, defaults)
	if err != nil {
		if _, serr := os.Stat(tmp); moved && serr == nil {
			os.Chmod(tmp, fi.Mode().Perm())
			os.Rename(tmp, imagePath)
		}
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	if !moved {
		os.Remove(imagePath)
	}
	t, err = s.Tag(name, tag, t.Digest)
	if err != nil {
		return Template{}, fmt.Errorf("import image as %s: %w", ref, err)
	}
	return t, nil
}

// ext4Magic is the superblock's s_magic, at ext4MagicOffset in the image.
const (
	ext4Magic       = 0xef53
	ext4MagicOffset = 1024 + 0x38
)

// checkExt4 reports whether the file at p holds an ext2/3/4 filesystem.
func checkExt4(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [2]byte
	if _, err := f.ReadAt(b[:], ext4MagicOffset); err != nil || binary.LittleEndian.Uint16(b[:]) != ext4Magic {
		return fmt.Errorf("%s is not an ext4 image: %w", p, errdefs.ErrInvalid)
	}
	return nil
}

// copyImageFile copies src to the new file dst and syncs it.
func copyImageFile(ctx context.Context, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, cancelReader{ctx, in}); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// cancelReader stops a copy once its context ends.
type cancelReader struct {
	ctx context.Context
	r   io.Reader
}

func (c cancelReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
