package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/textcheck"
)

// ext4Image reads and edits an ext4 image file that nothing has mounted,
// through e2fsprogs' debugfs (there is no loop mount: the host may not
// allow one, and a saved disk is never mounted on the host).
type ext4Image struct {
	path  string
	tools ImageTools // how debugfs runs on it
	// cache, when set, keeps what stat and readFile found, for an image
	// that does not change meanwhile: each debugfs run is a jailed
	// process, and resolving paths stats the same directories again and
	// again.
	cache *ext4Cache
}

// ext4Cache is what an ext4Image read, by path.
type ext4Cache struct {
	stats map[string]ext4Entry
	files map[string][]byte
}

func newExt4Cache() *ext4Cache {
	return &ext4Cache{stats: map[string]ext4Entry{}, files: map[string][]byte{}}
}

// ext4Entry is what an image holds at a path. The zero value is a path
// with nothing there.
type ext4Entry struct {
	// Type is debugfs's name of the inode's type ("regular", "directory",
	// "symlink", ...), or "" when nothing is there.
	Type string
	// Perm is the permission bits (with setuid, setgid and sticky).
	Perm     uint32
	UID, GID uint32
	// Target is a symlink's target.
	Target string
}

func (e ext4Entry) exists() bool  { return e.Type != "" }
func (e ext4Entry) regular() bool { return e.Type == "regular" }

// debugfs runs debugfs commands on img, writable with write, and returns
// what they printed. debugfs exits 0 whatever failed and says what on
// stderr, after its banner: any other line there fails the call, and
// notFound is true when every one says a path leads nowhere (nothing by
// that name, a file or a symlink loop on the way).
//
// Every command is one line: a command name of this file's and arguments
// quoted by debugfsArg, which refuses the characters that could end a
// line or a quoted argument, so no line can start with "!" (a shell
// escape in debugfs's script reader) or carry a second command. The run
// is jailed (ImageTools) and sees img and the host files in read only.
func debugfs(ctx context.Context, im ext4Image, write bool, read []string, cmds ...string) (out []byte, notFound bool, err error) {
	img := im.path
	var args []string
	rw := []string{img}
	if write {
		args = append(args, "-w")
	} else {
		read, rw = append(read, img), nil
	}
	if len(cmds) == 1 {
		args = append(args, "-R", cmds[0], img)
	} else {
		args = append(args, "-f", "-", img)
	}
	var stdin io.Reader
	if len(cmds) > 1 {
		stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	}
	var stdout, stderr bytes.Buffer
	env := []string{"DEBUGFS_PAGER=__none__", "PAGER=__none__"}
	if err := im.tools.run(ctx, "debugfs", read, rw, env, stdin, &stdout, &stderr, args...); err != nil {
		return nil, false, fmt.Errorf("debugfs %s: %w: %s", img, err, strings.TrimSpace(stderr.String()))
	}
	var complaints []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "debugfs ") {
			continue
		}
		complaints = append(complaints, line)
	}
	if len(complaints) > 0 {
		notFound = true
		for _, c := range complaints {
			if !strings.Contains(c, "File not found by ext2_lookup") && !strings.Contains(c, "Ext2 inode is not a directory") &&
				!strings.Contains(c, "Too many symbolic links encountered") {
				notFound = false
			}
		}
		return stdout.Bytes(), notFound, fmt.Errorf("debugfs %s: %s", img, strings.Join(complaints, "; "))
	}
	return stdout.Bytes(), false, nil
}

// debugfsArg quotes s as one argument of a debugfs command line. A
// control character (a newline would start another command) or a double
// quote (it would end the quoting) cannot be given to debugfs at all.
func debugfsArg(s string) (string, error) {
	if strings.ContainsRune(s, '"') || textcheck.Control(s) >= 0 {
		return "", fmt.Errorf("path %q cannot be given to debugfs: it holds a double quote or a control character", s)
	}
	return `"` + s + `"`, nil
}

var (
	statTypeRE  = regexp.MustCompile(`Type: (.+?)\s+Mode:\s+([0-7]+)`)
	statOwnerRE = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)`)
	statLinkRE  = regexp.MustCompile(`Fast link dest: "(.*)"`)
)

// stat describes what is at p, a symlink itself rather than its target
// (directories on the way are followed).
func (im ext4Image) stat(ctx context.Context, p string) (ext4Entry, error) {
	if im.cache != nil {
		if e, ok := im.cache.stats[p]; ok {
			return e, nil
		}
	}
	e, err := im.statUncached(ctx, p)
	if err == nil && im.cache != nil {
		im.cache.stats[p] = e
	}
	return e, err
}

func (im ext4Image) statUncached(ctx context.Context, p string) (ext4Entry, error) {
	arg, err := debugfsArg(p)
	if err != nil {
		return ext4Entry{}, err
	}
	out, notFound, err := debugfs(ctx, im, false, nil, "stat "+arg)
	if notFound {
		return ext4Entry{}, nil
	}
	if err != nil {
		return ext4Entry{}, err
	}
	m := statTypeRE.FindSubmatch(out)
	o := statOwnerRE.FindSubmatch(out)
	if m == nil || o == nil {
		return ext4Entry{}, fmt.Errorf("debugfs stat %s: cannot read %q", p, firstLine(out))
	}
	perm, _ := strconv.ParseUint(string(m[2]), 8, 32)
	uid, _ := strconv.ParseUint(string(o[1]), 10, 32)
	gid, _ := strconv.ParseUint(string(o[2]), 10, 32)
	e := ext4Entry{Type: string(m[1]), Perm: uint32(perm), UID: uint32(uid), GID: uint32(gid)}
	if e.Type == "symlink" {
		if l := statLinkRE.FindSubmatch(out); l != nil {
			e.Target = string(l[1])
		} else if e.Target, err = im.catString(ctx, p); err != nil { // a long target has a block of its own
			return ext4Entry{}, err
		}
	}
	return e, nil
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return string(line)
}

// readFile returns the content of the regular file at p.
func (im ext4Image) readFile(ctx context.Context, p string) ([]byte, error) {
	if im.cache != nil {
		if b, ok := im.cache.files[p]; ok {
			return b, nil
		}
	}
	arg, err := debugfsArg(p)
	if err != nil {
		return nil, err
	}
	out, _, err := debugfs(ctx, im, false, nil, "cat "+arg)
	if err == nil && im.cache != nil {
		im.cache.files[p] = out
	}
	return out, err
}

func (im ext4Image) catString(ctx context.Context, p string) (string, error) {
	b, err := im.readFile(ctx, p)
	return string(b), err
}

// empty reports whether the directory at p holds nothing.
func (im ext4Image) empty(ctx context.Context, p string) (bool, error) {
	arg, err := debugfsArg(p)
	if err != nil {
		return false, err
	}
	out, _, err := debugfs(ctx, im, false, nil, "ls -p "+arg)
	if err != nil {
		return false, err
	}
	// One line per entry: /inode/mode/uid/gid/name/size/.
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "/")
		if len(f) >= 6 && f[5] != "." && f[5] != ".." {
			return false, nil
		}
	}
	return true, nil
}

// maxSymlinks bounds the symlinks followed while resolving one path.
const maxSymlinks = 40

// errSymlinkLoop is a path that leads through more than maxSymlinks
// symlinks: nowhere.
var errSymlinkLoop = errors.New("too many symlinks")

// resolveDir returns p with every symlink among its directories followed
// within the image, as the guest's kernel would; its last element is kept
// as it is. debugfs follows such symlinks when it reads a path, but not
// when it makes or removes an entry in a directory.
func (im ext4Image) resolveDir(ctx context.Context, p string) (string, error) {
	dir, base := path.Split(path.Clean(p))
	real := "/"
	parts := strings.Split(strings.Trim(dir, "/"), "/")
	hops := 0
	for len(parts) > 0 {
		el := parts[0]
		parts = parts[1:]
		switch el {
		case "", ".":
			continue
		case "..":
			real = path.Dir(real)
			continue
		}
		next := path.Join(real, el)
		e, err := im.stat(ctx, next)
		if err != nil {
			return "", err
		}
		if e.Type != "symlink" {
			real = next
			continue
		}
		if hops++; hops > maxSymlinks {
			return "", fmt.Errorf("resolve %s in %s: %w", p, im.path, errSymlinkLoop)
		}
		if path.IsAbs(e.Target) {
			real = "/"
		}
		parts = append(strings.Split(strings.Trim(e.Target, "/"), "/"), parts...)
	}
	return path.Join(real, base), nil
}

// resolve returns p with every symlink followed within the image, the
// last element's too.
func (im ext4Image) resolve(ctx context.Context, p string) (string, error) {
	for range maxSymlinks {
		real, err := im.resolveDir(ctx, p)
		if err != nil {
			return "", err
		}
		e, err := im.stat(ctx, real)
		if err != nil || e.Type != "symlink" {
			return real, err
		}
		p = e.Target
		if !path.IsAbs(p) {
			p = path.Join(path.Dir(real), p)
		}
	}
	return "", fmt.Errorf("resolve %s in %s: %w", p, im.path, errSymlinkLoop)
}

// ext4Edits is a list of changes to an image, made at once by apply.
// Their paths hold no symlink among their directories (resolveDir).
type ext4Edits struct {
	ops []ext4Op
}

// ext4Op is one change: rm, rmdir, write or symlink at path.
type ext4Op struct {
	kind    string
	path    string
	content []byte    // write: the file's content
	like    ext4Entry // write: its permission bits and owner
	target  string    // symlink: its target
}

// remove removes the file or symlink at p.
func (e *ext4Edits) remove(p string) { e.ops = append(e.ops, ext4Op{kind: "rm", path: p}) }

// rmdir removes the empty directory at p.
func (e *ext4Edits) rmdir(p string) { e.ops = append(e.ops, ext4Op{kind: "rmdir", path: p}) }

// replace replaces the file or symlink at p by a regular file holding
// content, with the permission bits and owner of like.
func (e *ext4Edits) replace(p string, content []byte, like ext4Entry) {
	e.remove(p)
	e.ops = append(e.ops, ext4Op{kind: "write", path: p, content: content, like: like})
}

// replaceByLink replaces the file or symlink at p by a symlink to target.
func (e *ext4Edits) replaceByLink(p, target string) {
	e.remove(p)
	e.ops = append(e.ops, ext4Op{kind: "symlink", path: p, target: target})
}

// apply makes the edits to the image, in one run of debugfs.
func (e *ext4Edits) apply(ctx context.Context, im ext4Image) error {
	if len(e.ops) == 0 {
		return nil
	}
	tmp, err := os.MkdirTemp("", "airlock-ext4-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var cmds, hostFiles []string
	for i, op := range e.ops {
		p, err := debugfsArg(op.path)
		if err != nil {
			return err
		}
		switch op.kind {
		case "rm", "rmdir":
			cmds = append(cmds, op.kind+" "+p)
		case "symlink":
			t, err := debugfsArg(op.target)
			if err != nil {
				return err
			}
			cmds = append(cmds, "symlink "+p+" "+t)
		case "write":
			// debugfs writes a host file into its current directory.
			dir, err := debugfsArg(path.Dir(op.path))
			if err != nil {
				return err
			}
			name, err := debugfsArg(path.Base(op.path))
			if err != nil {
				return err
			}
			host := filepath.Join(tmp, strconv.Itoa(i))
			if err := os.WriteFile(host, op.content, 0o600); err != nil {
				return err
			}
			if err := im.tools.Own(host); err != nil {
				return err
			}
			hostFiles = append(hostFiles, host)
			src, err := debugfsArg(host)
			if err != nil {
				return err
			}
			cmds = append(cmds, "cd "+dir, "write "+src+" "+name,
				fmt.Sprintf("sif %s mode 0%o", name, 0o100000|op.like.Perm),
				fmt.Sprintf("sif %s uid %d", name, op.like.UID),
				fmt.Sprintf("sif %s gid %d", name, op.like.GID),
				"cd /")
		}
	}
	if _, _, err := debugfs(ctx, im, true, hostFiles, cmds...); err != nil {
		return fmt.Errorf("edit %s: %w", im.path, err)
	}
	return nil
}
