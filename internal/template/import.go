package template

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

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
// name:tag with the given settings (PutTree, then Tag). Importing the same
// content again only moves the ref.
func (s *Store) Import(ctx context.Context, name, tag, rootfsDir string, defaults Settings) (Template, error) {
	if tag == "" {
		tag = DefaultTag
	}
	ref := name + ":" + tag
	if n, _, err := ParseRef(ref); err != nil || n == "" {
		return Template{}, fmt.Errorf("import template %s: bad name or tag: %w", ref, errdefs.ErrInvalid)
	}
	t, err := s.PutTree(ctx, rootfsDir, defaults)
	if err != nil {
		return Template{}, fmt.Errorf("import template %s: %w", ref, err)
	}
	return s.Tag(name, tag, t.Digest)
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

// mke2fsConf is e2fsprogs' configuration of new filesystems.
const mke2fsConf = "/etc/mke2fs.conf"

// mkfs runs mkfs.ext4 -d to make an image of the tree at dir in file. It
// keeps the default features (resize_inode among them, so the guest can grow
// the filesystem online), no reserved blocks, and a fixed identity and time.
func mkfs(ctx context.Context, dir, file string, u treeUsage, run ToolRunner) error {
	size := imageSize(u)
	inodes := max(size/16384, u.inodes+u.inodes/4+1024)
	args := []string{
		"-q", "-F", "-t", "ext4",
		"-T", "default", "-b", strconv.Itoa(blockSize), "-N", strconv.FormatInt(inodes, 10),
		"-m", "0", "-L", fsLabel, "-U", fsUUID,
		"-E", "root_owner=0:0,hash_seed=" + fsHashSeed,
		"-d", dir, file, strconv.FormatInt(size/1024, 10) + "k",
	}
	if run != nil {
		// mke2fs.conf decides the filesystem's features: the same file as
		// unjailed, so the same tree makes the same image (and digest).
		read := []string{dir}
		if _, err := os.Stat(mke2fsConf); err == nil {
			read = append(read, mke2fsConf)
		}
		if _, err := run(ctx, "mkfs.ext4", args, []string{"E2FSPROGS_FAKE_TIME=1"}, read, []string{file}); err != nil {
			return fmt.Errorf("mkfs.ext4 -d %s (%d MiB, %d inodes): %w", dir, size>>20, inodes, err)
		}
		return nil
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
