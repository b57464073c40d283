package vm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A clone maps its template's memory file private: its writes are its
// own. QEMU opens the file read-write all the same (QEMU 7.2 has no
// read-only file with a writable private mapping), and a jailed QEMU that
// could write the file would change the memory of every other clone of
// it. So a jailed clone maps a sealed copy instead: a memfd holding the
// file's content that nobody can write, shrink or grow (F_SEAL_WRITE
// still allows private writable mappings), made once per file and shared
// by every clone this process starts, which map its pages as they would
// the file's page cache.

// memImages holds one sealed copy per memory file.
var memImages = struct {
	sync.Mutex
	m map[string]*memImage
}{m: map[string]*memImage{}}

type memImage struct {
	f        *os.File
	dev, ino uint64
	size     int64
	mtime    int64
}

// sealedMemory returns the sealed copy of the memory file at path, made
// now if there is none or the file changed since. The caller must not
// close it.
func sealedMemory(path string) (*os.File, error) {
	memImages.Lock()
	defer memImages.Unlock()
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if im := memImages.m[path]; im != nil {
		if im.dev == st.Dev && im.ino == st.Ino && im.size == fi.Size() && im.mtime == fi.ModTime().UnixNano() {
			return im.f, nil
		}
		// Replaced: the old copy goes once the clones mapping it end.
		im.f.Close()
		delete(memImages.m, path)
	}
	f, err := sealedCopy(path, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("copy memory file %s: %w", path, err)
	}
	memImages.m[path] = &memImage{f: f, dev: st.Dev, ino: st.Ino, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	return f, nil
}

// ForgetMemory drops the sealed copy of the memory file at path, as when
// its snapshot is removed; clones that map it keep their mapping.
func ForgetMemory(path string) {
	memImages.Lock()
	defer memImages.Unlock()
	if im := memImages.m[path]; im != nil {
		im.f.Close()
		delete(memImages.m, path)
	}
}

// sealedCopy copies the file at path into a new memfd of size bytes,
// leaving holes and zero pages unwritten, and seals it.
func sealedCopy(path string, size int64) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("airlock-guest-memory", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, err
	}
	dst := os.NewFile(uintptr(fd), "memfd:"+path)
	if err := fillSparse(dst, src, size); err != nil {
		dst.Close()
		return nil, err
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(dst.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		dst.Close()
		return nil, fmt.Errorf("seal: %w", err)
	}
	return dst, nil
}

// fillSparse sizes dst and copies src's data extents into it, skipping
// zero chunks.
func fillSparse(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	const chunk = 1 << 20
	buf := make([]byte, chunk)
	zero := make([]byte, chunk)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for off = data; off < hole; {
			n, err := src.ReadAt(buf[:min(chunk, hole-off)], off)
			if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
				if _, werr := dst.WriteAt(buf[:n], off); werr != nil {
					return werr
				}
			}
			off += int64(n)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
