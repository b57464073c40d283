// Package atomicfile replaces files whole: content goes to a temporary file
// beside the target, is synced, and is renamed over it, so readers see the
// old file or the complete new one and a failure leaves no partial file.
package atomicfile

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write fills path through fill and returns the hex sha256 of what was
// written. The directory of path must exist.
func Write(path string, mode os.FileMode, fill func(io.Writer) error) (sum string, err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	if err := fill(io.MultiWriter(f, h)); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteBytes replaces path with data.
func WriteBytes(path string, data []byte, mode os.FileMode) error {
	_, err := Write(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	return err
}
