package vm

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// maxBackingDepth bounds a backing chain, against a chain that loops.
const maxBackingDepth = 16

// backingChain returns the files a qcow2 image reads through its backing
// chain, nearest first; the image itself is not in it. A raw image, or a
// qcow2 one without a backing file, ends the chain. Relative backing
// names resolve against the directory of the image that names them, as
// QEMU resolves them.
func backingChain(image string) ([]string, error) {
	var chain []string
	for cur := image; ; {
		next, err := backingFile(cur)
		if err != nil {
			return nil, err
		}
		if next == "" {
			return chain, nil
		}
		if !filepath.IsAbs(next) {
			next = filepath.Join(filepath.Dir(cur), next)
		}
		if len(chain) == maxBackingDepth {
			return nil, fmt.Errorf("%s: backing chain deeper than %d", image, maxBackingDepth)
		}
		chain = append(chain, next)
		cur = next
	}
}

// backingFile reads the backing file name from a qcow2 header ("" for a
// raw image or none).
func backingFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var h struct {
		Magic   uint32
		Version uint32
		Offset  uint64 // of the backing file name
		Size    uint32 // of the backing file name
	}
	if err := binary.Read(f, binary.BigEndian, &h); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return "", nil // too short to be qcow2: raw
		}
		return "", err
	}
	if h.Magic != 0x514649fb || h.Offset == 0 || h.Size == 0 {
		return "", nil
	}
	if h.Size > 1023 {
		return "", fmt.Errorf("%s: backing file name of %d bytes", path, h.Size)
	}
	name := make([]byte, h.Size)
	if _, err := f.ReadAt(name, int64(h.Offset)); err != nil {
		return "", fmt.Errorf("%s: read backing file name: %w", path, err)
	}
	return string(name), nil
}
