// Package datadir names the files airlock keeps under its data directory
// ($AIRLOCK_HOME), so every component agrees on one layout.
package datadir

import (
	"os"
	"path/filepath"
)

// Dir is the root of airlock's data directory.
//
//	boot/                 kernel (vmlinux), initramfs.cpio, manifest.json
//	templates/            sha256-<hex>.ext4 images, their .json settings, refs/<name>/<tag>
//	cache/                downloaded packages and other reusable inputs
//	sandboxes/<id>/       one directory per sandbox: overlay, sockets, console log
//	snapshots/<key>/      template snapshots: guest RAM file, device state, record
//	accel.json            the cached verdict of the accelerator probe
//	airlock.db            the server's store (with its -wal and -shm files)
//	admin.key             the server's first admin key, mode 0600
type Dir struct {
	Root string
}

// Default returns $AIRLOCK_HOME, else /var/lib/airlock for root, else
// ~/.local/share/airlock.
func Default() Dir {
	if h := os.Getenv("AIRLOCK_HOME"); h != "" {
		return Dir{Root: h}
	}
	if os.Geteuid() == 0 {
		return Dir{Root: "/var/lib/airlock"}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return Dir{Root: filepath.Join(home, ".local", "share", "airlock")}
}

// Boot is the directory of the guest boot artifacts.
func (d Dir) Boot() string { return filepath.Join(d.Root, "boot") }

// Kernel is the uncompressed ELF kernel the VMs boot through PVH.
func (d Dir) Kernel() string { return filepath.Join(d.Boot(), "vmlinux") }

// Initramfs is the cpio archive holding the guest agent as PID 1 and its modules.
func (d Dir) Initramfs() string { return filepath.Join(d.Boot(), "initramfs.cpio") }

// Templates is the directory of template images and refs.
func (d Dir) Templates() string { return filepath.Join(d.Root, "templates") }

// Cache holds downloads that later setup runs reuse.
func (d Dir) Cache() string { return filepath.Join(d.Root, "cache") }

// Sandboxes is the parent of the per-sandbox directories.
func (d Dir) Sandboxes() string { return filepath.Join(d.Root, "sandboxes") }

// Sandbox is the directory of one sandbox.
func (d Dir) Sandbox(id string) string { return filepath.Join(d.Sandboxes(), id) }

// Checkpoints is the parent of the checkpoint directories, one per
// checkpoint of a sandbox.
func (d Dir) Checkpoints() string { return filepath.Join(d.Root, "checkpoints") }

// Checkpoint is the directory of one checkpoint.
func (d Dir) Checkpoint(id string) string { return filepath.Join(d.Checkpoints(), id) }

// Snapshots is the parent of the template snapshot directories, one per
// template, vCPU count and memory size.
func (d Dir) Snapshots() string { return filepath.Join(d.Root, "snapshots") }

// Store is the server's SQLite database.
func (d Dir) Store() string { return filepath.Join(d.Root, "airlock.db") }

// AdminKey is the file the server writes its first admin key to (0600).
func (d Dir) AdminKey() string { return filepath.Join(d.Root, "admin.key") }

// AccelVerdict is the file caching which accelerator works on this host.
func (d Dir) AccelVerdict() string { return filepath.Join(d.Root, "accel.json") }

// SecretsKey is the key that seals stored secrets (mode 0600).
func (d Dir) SecretsKey() string { return filepath.Join(d.Root, "secrets.key") }

// E2BTokenKey is the key that signs the E2B envd access tokens.
func (d Dir) E2BTokenKey() string { return filepath.Join(d.Root, "e2b-token.key") }
