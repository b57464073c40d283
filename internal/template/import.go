package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Fixed filesystem identity, so images differ only where their trees do. Every
// sandbox disk is alone in its VM, so a shared UUID does no harm.
const (
	fsUUID     = "5a1c0c4e-2b8e-4c1a-9d3e-a1f0c0de0001"
	fsHashSeed = "5a1c0c4e-2b8e-4c1a-9d3e-a1f0c0de0002"
	fsLabel    = "airlock-root"
)

// Image sizing: the content, plus a fifth, plus fixed slack.
const (
	blockSize = 4096
	slackMiB  = 16
)

// Import makes an ext4 image of the tree at rootfsDir and stores it as
// name:tag with the given settings. The image is built in a temporary file,
// hashed and renamed into place; then its settings and the ref are written,
// each atomically. Importing the same content again only moves the ref.
func (s *Store) Import(ctx context.Context, name, tag, rootfsDir string, defaults Settings) (Template, error) {
	if tag == "" {
		tag = DefaultTag
	}
	ref := name + ":" + tag
	if _, _, err := ParseRef(ref); err != nil || strings.HasPrefix(ref, "sha256:") {
		return Template{}, fmt.Errorf("import template %s: bad name or tag: %w", ref, errdefs.ErrInvalid)
	}
	if err := defaults.validate(); err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	if fi, err := os.Stat(rootfsDir); err != nil || !fi.IsDir() {
		return Template{}, fmt.Errorf("import template %s: %s is not a directory: %w", ref, rootfsDir, errdefs.ErrInvalid)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return Template{}, fmt.Errorf("import template %s: mkfs.ext4 not found (install e2fsprogs): %w", ref, errdefs.ErrPrecondition)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "refs", name), 0o755); err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}

	usage, err := measureTree(rootfsDir)
	if err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	tmp, err := os.CreateTemp(s.dir, ".import-*.ext4")
	if err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	tmpName := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpName) // gone already when renamed into place
	if err := mkfs(ctx, rootfsDir, tmpName, usage); err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	sum, size, err := digest.File(ctx, tmpName)
	if err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	contentDigest := "sha256:" + sum
	img := s.imagePath(sum)
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := os.Chmod(tmpName, 0o444); err != nil {
			return Template{}, fmt.Errorf("import template %s: %w", ref, err)
		}
		if err := syncFile(tmpName); err != nil {
			return Template{}, fmt.Errorf("import template %s: %w", ref, err)
		}
		if err := os.Rename(tmpName, img); err != nil {
			return Template{}, fmt.Errorf("import template %s: %w", ref, err)
		}
	}

	r := record{
		Name: name, Tag: tag, Digest: contentDigest,
		VCPUs: defaults.VCPUs, MemoryMiB: defaults.MemoryMiB, DiskMiB: defaults.DiskMiB,
		StartCmd: defaults.StartCmd, ReadyPort: defaults.ReadyPort, ReadyPath: defaults.ReadyPath, Recipe: defaults.Recipe,
		SizeBytes: size, CreatedAt: time.Now().UTC().Truncate(time.Second),
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	if err := atomicfile.WriteBytes(s.recordPath(sum), append(b, '\n'), 0o644); err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	if err := atomicfile.WriteBytes(s.refPath(name, tag), []byte(contentDigest+"\n"), 0o644); err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	t, err := s.resolveName(name, tag)
	if err != nil {
		return Template{}, fmt.Errorf("import template %s: read back: %w", ref, err)
	}
	return t, nil
}

// treeUsage is what a directory tree needs on an ext4 filesystem.
type treeUsage struct {
	bytes  int64 // file data rounded up to whole blocks
	inodes int64
}

// measureTree adds up the blocks and inodes a tree needs.
func measureTree(root string) (treeUsage, error) {
	var u treeUsage
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		u.inodes++
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode().IsRegular(): // hard links counted each time: an overestimate
			u.bytes += (fi.Size() + blockSize - 1) / blockSize * blockSize
		case fi.IsDir():
			u.bytes += blockSize
		case fi.Mode()&fs.ModeSymlink != 0 && fi.Size() >= 60:
			u.bytes += blockSize // not a fast symlink
		}
		return nil
	})
	if err != nil {
		return treeUsage{}, fmt.Errorf("measure %s: %w", root, err)
	}
	return u, nil
}

// imageSize returns the image size in bytes for a tree: content plus 20%
// plus slack, rounded up to a MiB.
func imageSize(u treeUsage) int64 {
	size := u.bytes + u.bytes/5 + slackMiB<<20
	return (size + 1<<20 - 1) &^ (1<<20 - 1)
}

// mkfs runs mkfs.ext4 -d to make an image of the tree at dir in file. It
// keeps the default features (resize_inode among them, so the guest can grow
// the filesystem online), no reserved blocks, and a fixed identity and time.
func mkfs(ctx context.Context, dir, file string, u treeUsage) error {
	size := imageSize(u)
	inodes := max(size/16384, u.inodes+u.inodes/4+1024)
	args := []string{
		"-q", "-F", "-t", "ext4",
		"-T", "default", "-b", strconv.Itoa(blockSize), "-N", strconv.FormatInt(inodes, 10),
		"-m", "0", "-L", fsLabel, "-U", fsUUID,
		"-E", "root_owner=0:0,hash_seed=" + fsHashSeed,
		"-d", dir, file, strconv.FormatInt(size/1024, 10) + "k",
	}
	cmd := exec.CommandContext(ctx, "mkfs.ext4", args...)
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mkfs.ext4 -d %s (%d MiB, %d inodes): %s: %w", dir, size>>20, inodes, strings.TrimSpace(out.String()), err)
	}
	return nil
}

// syncFile flushes a file's data to disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
