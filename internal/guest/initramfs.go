package guest

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/cavaliergopher/cpio"
)

// Paths inside the initramfs that the agent relies on.
const (
	// InitPath is where the agent binary sits; the kernel runs it as PID 1.
	InitPath = "/init"
	// ModuleListPath lists the modules to load, one path per line, in order.
	ModuleListPath = "/etc/airlock/modules"
	// ModuleDir holds the module files, named <name>.ko.
	ModuleDir = "/lib/modules"
)

// initramfsDirs are the empty directories the agent needs as mount points.
var initramfsDirs = []string{"/dev", "/proc", "/sys", "/tmp", "/mnt", "/etc", "/etc/airlock", "/lib", ModuleDir}

// modulePath is where a module sits inside the initramfs.
func modulePath(name string) string {
	return path.Join(ModuleDir, name+".ko")
}

// writeInitramfs writes an uncompressed newc cpio archive holding the agent
// as /init, the modules under /lib/modules, the list of modules in load
// order and the empty mount-point directories. All entries are owned by
// root and carry a zero time, so equal inputs give equal archives.
//
// /dev/console is not included: the cpio writer cannot record a device
// number, and the agent mounts devtmpfs itself.
func writeInitramfs(w io.Writer, agentPath string, mods []Module) error {
	cw := cpio.NewWriter(w)
	for _, d := range initramfsDirs {
		mode := cpio.FileMode(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		if err := cw.WriteHeader(&cpio.Header{Name: strings.TrimPrefix(d, "/"), Mode: cpio.TypeDir | mode, Links: 2}); err != nil {
			return fmt.Errorf("write initramfs dir %s: %w", d, err)
		}
	}
	if err := addFile(cw, InitPath, agentPath, 0o755); err != nil {
		return err
	}
	var list strings.Builder
	for _, m := range mods {
		p := modulePath(m.Name)
		if err := addFile(cw, p, m.Path, 0o644); err != nil {
			return err
		}
		list.WriteString(p + "\n")
	}
	if err := addBytes(cw, ModuleListPath, []byte(list.String()), 0o644); err != nil {
		return err
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("finish initramfs: %w", err)
	}
	return nil
}

// addFile copies the host file src into the archive as name.
func addFile(cw *cpio.Writer, name, src string, mode cpio.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("add %s to initramfs: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("add %s to initramfs: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("add %s to initramfs: %s is not a regular file", name, src)
	}
	hdr := &cpio.Header{Name: strings.TrimPrefix(name, "/"), Mode: cpio.TypeReg | mode, Size: fi.Size(), Links: 1}
	if err := cw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("add %s to initramfs: %w", name, err)
	}
	if n, err := io.Copy(cw, f); err != nil {
		return fmt.Errorf("add %s to initramfs: %w", name, err)
	} else if n != fi.Size() {
		return fmt.Errorf("add %s to initramfs: %s changed size while copying", name, src)
	}
	return nil
}

// addBytes stores b in the archive as name.
func addBytes(cw *cpio.Writer, name string, b []byte, mode cpio.FileMode) error {
	hdr := &cpio.Header{Name: strings.TrimPrefix(name, "/"), Mode: cpio.TypeReg | mode, Size: int64(len(b)), Links: 1}
	if err := cw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("add %s to initramfs: %w", name, err)
	}
	if _, err := cw.Write(b); err != nil {
		return fmt.Errorf("add %s to initramfs: %w", name, err)
	}
	return nil
}
