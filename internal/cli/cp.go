package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const cpAbout = `Copies a file or a directory between this machine and a sandbox of the
airlock server. Exactly one of SRC and DST is in the sandbox, written
SBX:/absolute/path; the other is a local path, or - for stdin or stdout.

Like cp -r: a directory is copied whole, into DST when DST is an existing
directory, else as DST; a file into DST when DST is a directory, else as
DST. Files keep their permission bits. With - as SRC, stdin is written to
the file DST. With - as DST, a file's bytes go to stdout, and a directory
goes as a tar stream of its contents.

  airlock cp ./train.py sbx7k2m9q4w8e1r5t3y6u:/root/
  airlock cp ./project sbx7k2m9q4w8e1r5t3y6u:/root/project
  airlock cp sbx7k2m9q4w8e1r5t3y6u:/root/out ./results
  airlock cp sbx7k2m9q4w8e1r5t3y6u:/etc/os-release -`

func runCp(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("cp", "airlock cp [FLAGS] SRC DST", cpAbout, env)
	sf := addServerFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("cp: give SRC and DST, one of them SBX:/path, e.g. `airlock cp ./file sbx…:/root/`: %w", errdefs.ErrInvalid)
	}
	src, dst, err := parseCpArgs(pos[0], pos[1])
	if err != nil {
		return err
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	if dst.sandbox != "" {
		return copyIn(ctx, env, c, src, dst)
	}
	return copyOut(ctx, env, c, src, dst)
}

// cpSpec is one side of a copy.
type cpSpec struct {
	sandbox string // "" for this machine
	path    string // clean: a local path, "-" for stdio, or an absolute path in the sandbox
	dirHint bool   // the path was written with a trailing slash: it names a directory
}

// parseCpSpec reads "SBX:/path" as a path in a sandbox and anything else as
// a local path. Sandbox IDs are lowercase letters and digits, so "./a:b"
// or "C:/x" stay local.
func parseCpSpec(s string) (cpSpec, error) {
	if s == "" {
		return cpSpec{}, fmt.Errorf("cp: an empty path: %w", errdefs.ErrInvalid)
	}
	if s == "-" {
		return cpSpec{path: "-"}, nil
	}
	if id, p, ok := strings.Cut(s, ":"); ok && isSandboxID(id) {
		if !path.IsAbs(p) {
			return cpSpec{}, fmt.Errorf("cp: %q: the path in the sandbox must be absolute, as in %s:/root/file: %w", s, id, errdefs.ErrInvalid)
		}
		return cpSpec{sandbox: id, path: path.Clean(p), dirHint: len(p) > 1 && strings.HasSuffix(p, "/")}, nil
	}
	return cpSpec{path: filepath.Clean(s), dirHint: len(s) > 1 && strings.HasSuffix(s, string(filepath.Separator))}, nil
}

func isSandboxID(s string) bool {
	return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789") == ""
}

// parseCpArgs checks that exactly one side of a copy is in a sandbox.
func parseCpArgs(src, dst string) (from, to cpSpec, err error) {
	if from, err = parseCpSpec(src); err != nil {
		return from, to, err
	}
	if to, err = parseCpSpec(dst); err != nil {
		return from, to, err
	}
	switch {
	case from.sandbox != "" && to.sandbox != "":
		return from, to, fmt.Errorf("cp: both sides are in sandboxes: copy through this machine, one side at a time: %w", errdefs.ErrInvalid)
	case from.sandbox == "" && to.sandbox == "":
		return from, to, fmt.Errorf("cp: neither side is in a sandbox: write one as SBX:/path: %w", errdefs.ErrInvalid)
	}
	return from, to, nil
}

// copyIn copies a local file or directory, or stdin, into a sandbox.
func copyIn(ctx context.Context, env *Env, c *apiclient.Client, src, dst cpSpec) error {
	if src.path == "-" {
		st, err := c.Stat(ctx, dst.sandbox, dst.path)
		switch {
		case dst.dirHint || err == nil && st.Type == "dir":
			return fmt.Errorf("cp: %s:%s is a directory: name the file to write stdin to: %w", dst.sandbox, dst.path, errdefs.ErrInvalid)
		case err != nil && !errors.Is(err, errdefs.ErrNotFound):
			return err
		}
		return c.WriteFile(ctx, dst.sandbox, dst.path, 0, env.Stdin)
	}
	info, err := os.Stat(src.path)
	if err != nil {
		return localError(err)
	}
	abs, err := filepath.Abs(src.path)
	if err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	if !info.IsDir() && !info.Mode().IsRegular() {
		return fmt.Errorf("cp: %s is not a regular file or a directory: %w", src.path, errdefs.ErrInvalid)
	}
	target, err := remoteTarget(ctx, c, dst, filepath.Base(abs), info.IsDir())
	if err != nil {
		return err
	}
	if info.IsDir() {
		return uploadDir(ctx, env, c, dst.sandbox, abs, target)
	}
	f, err := os.Open(src.path)
	if err != nil {
		return localError(err)
	}
	defer f.Close()
	return c.WriteFile(ctx, dst.sandbox, target, info.Mode().Perm(), f)
}

// remoteTarget is where a copy of the local base goes in the sandbox: into
// dst when it is a directory, else dst itself.
func remoteTarget(ctx context.Context, c *apiclient.Client, dst cpSpec, base string, isDir bool) (string, error) {
	st, err := c.Stat(ctx, dst.sandbox, dst.path)
	switch {
	case err == nil && st.Type == "dir":
		return path.Join(dst.path, base), nil
	case err == nil && (isDir || dst.dirHint):
		return "", fmt.Errorf("cp: %s:%s is not a directory: %w", dst.sandbox, dst.path, errdefs.ErrInvalid)
	case err == nil:
		return dst.path, nil
	case errors.Is(err, errdefs.ErrNotFound):
		if dst.dirHint && !isDir {
			return path.Join(dst.path, base), nil // the server makes the parents
		}
		return dst.path, nil
	}
	return "", err
}

// errUploadEnded ends the tar writer of an upload that is over.
var errUploadEnded = errors.New("the upload ended")

// uploadDir sends the local directory dir to target in a sandbox as a tar
// stream, built while it is sent.
func uploadDir(ctx context.Context, env *Env, c *apiclient.Client, sbx, dir, target string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { // ends when the tree is written or the upload is over
		err := writeTar(pw, dir, env.Stderr)
		pw.CloseWithError(err)
		done <- err
	}()
	err := c.ArchiveIn(ctx, sbx, target, pr)
	pr.CloseWithError(errUploadEnded)
	if terr := <-done; terr != nil && !errors.Is(terr, errUploadEnded) {
		return fmt.Errorf("cp: %w", terr)
	}
	return err
}

// writeTar writes the tree under dir to w as a tar stream of its contents
// (names relative to dir), owned by root. Symlinks are kept as links;
// special files are skipped with a notice to warn.
func writeTar(w io.Writer, dir string, warn io.Writer) error {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case info.Mode().IsRegular(), info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			fmt.Fprintf(warn, "airlock: cp: skipping %s: not a file, directory or symlink\n", p)
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// copyOut copies a file or directory of a sandbox to this machine or to
// stdout.
func copyOut(ctx context.Context, env *Env, c *apiclient.Client, src, dst cpSpec) error {
	st, err := c.Stat(ctx, src.sandbox, src.path)
	if err != nil {
		return err
	}
	isDir := st.Type == "dir"
	if !isDir && st.Type != "file" && st.Type != "symlink" {
		return fmt.Errorf("cp: %s:%s is of type %s: only files and directories can be copied: %w", src.sandbox, src.path, st.Type, errdefs.ErrInvalid)
	}
	if dst.path == "-" {
		var rc io.ReadCloser
		if isDir {
			rc, err = c.ArchiveOut(ctx, src.sandbox, src.path)
		} else {
			rc, err = c.ReadFile(ctx, src.sandbox, src.path)
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(env.Stdout, rc)
		return err
	}
	target, err := localTarget(dst, path.Base(src.path), isDir)
	if err != nil {
		return err
	}
	if isDir {
		rc, err := c.ArchiveOut(ctx, src.sandbox, src.path)
		if err != nil {
			return err
		}
		defer rc.Close()
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return localError(err)
		}
		return extractTar(rc, target, env.Stderr)
	}
	rc, err := c.ReadFile(ctx, src.sandbox, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = atomicfile.Write(target, parseMode(st.Mode, 0o644), func(w io.Writer) error {
		_, err := io.Copy(w, rc)
		return err
	})
	if err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	return nil
}

// localTarget is where a copy of the sandbox's base goes on this machine:
// into dst when it is a directory, else dst itself.
func localTarget(dst cpSpec, base string, isDir bool) (string, error) {
	info, err := os.Stat(dst.path)
	switch {
	case err == nil && info.IsDir():
		return filepath.Join(dst.path, base), nil
	case err == nil && (isDir || dst.dirHint):
		return "", fmt.Errorf("cp: %s is not a directory: %w", dst.path, errdefs.ErrInvalid)
	case err == nil:
		return dst.path, nil
	case errors.Is(err, fs.ErrNotExist):
		if dst.dirHint && !isDir {
			return "", fmt.Errorf("cp: directory %s does not exist: %w", dst.path, errdefs.ErrNotFound)
		}
		return dst.path, nil
	}
	return "", localError(err)
}

// localError is a failure on a local path, classed for the exit status.
func localError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("cp: %w: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("cp: %w: %w", err, errdefs.ErrPrecondition)
	}
	return fmt.Errorf("cp: %w", err)
}

// parseMode reads an octal mode such as "0755"; def when it cannot.
func parseMode(s string, def fs.FileMode) fs.FileMode {
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return def
	}
	return fs.FileMode(n).Perm()
}

// extractTar unpacks a tar stream into the directory dest. Every entry
// must stay inside dest: names that are absolute or climb out with "..",
// hard links to outside, and writes through symlinks that lead out are
// refused. Special files are skipped with a notice to warn.
func extractTar(r io.Reader, dest string, warn io.Writer) error {
	root, err := os.OpenRoot(dest)
	if err != nil {
		return localError(err)
	}
	defer root.Close()
	type dirMeta struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirMeta // set last: a read-only directory must first be filled
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("cp: read the archive: %w", err)
		}
		name, err := archiveName(h.Name)
		if err != nil {
			return fmt.Errorf("cp: refusing archive entry %q: %w", h.Name, err)
		}
		if name == "." {
			continue
		}
		if parent := filepath.Dir(name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("cp: %w", err)
			}
		}
		mode := h.FileInfo().Mode().Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cp: %w", err)
			}
			dirs = append(dirs, dirMeta{name, mode, h.ModTime})
		case tar.TypeReg:
			_ = root.Remove(name) // replace, never write through a link
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("cp: write %s: %w", filepath.Join(dest, name), err)
			}
			_ = root.Chtimes(name, h.ModTime, h.ModTime)
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("cp: %w", err)
			}
		case tar.TypeLink:
			old, err := archiveName(h.Linkname)
			if err != nil {
				return fmt.Errorf("cp: refusing hard link %q to %q: %w", h.Name, h.Linkname, err)
			}
			_ = root.Remove(name)
			if err := root.Link(old, name); err != nil {
				return fmt.Errorf("cp: %w", err)
			}
		default:
			fmt.Fprintf(warn, "airlock: cp: skipping %s: not a file, directory or link\n", h.Name)
		}
	}
	for _, d := range slices.Backward(dirs) {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		_ = root.Chtimes(d.name, d.mtime, d.mtime)
	}
	return nil
}

// archiveName is a tar entry's name as a clean local path relative to the
// destination, or an error when it would leave it.
func archiveName(name string) (string, error) {
	if path.IsAbs(name) || filepath.IsAbs(name) {
		return "", errors.New("it is an absolute path")
	}
	clean := path.Clean(name)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", errors.New("it leads outside the destination")
	}
	return filepath.FromSlash(clean), nil
}
