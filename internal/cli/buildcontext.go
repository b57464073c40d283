package cli

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// uploadContext sends the directory dir to the server as a build context:
// a tar stream built while it is sent, never held whole. The .dockerignore
// at its root leaves paths out. While it runs, a terminal stderr shows the
// bytes sent so far; unless quiet, a line with the size follows.
func uploadContext(ctx context.Context, env *Env, api *apiclient.Client, dir string, quiet bool) (apiv1.BuildContext, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return apiv1.BuildContext{}, fmt.Errorf("template build: context directory: %w", err)
	}
	defer root.Close()
	rules, err := readDockerignore(root)
	if err != nil {
		return apiv1.BuildContext{}, fmt.Errorf("template build: %w", err)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { // ends when the tree is written or the upload is over
		err := writeContextTar(pw, root, rules, env.Stderr)
		pw.CloseWithError(err)
		done <- err
	}()
	body := &countingReader{r: pr}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if !quiet && isTerminal(env.Stderr) {
		wg.Go(func() { showUpload(env.Stderr, &body.n, stop) }) // ends when stop is closed
	}
	bc, err := api.PutBuildContext(ctx, body)
	close(stop)
	wg.Wait()
	pr.CloseWithError(errUploadEnded)
	// A failure to read the tree ends the upload too: it is the one to tell.
	if terr := <-done; terr != nil && !errors.Is(terr, errUploadEnded) && !errors.Is(terr, io.ErrClosedPipe) {
		return bc, fmt.Errorf("template build: read the context: %w", terr)
	}
	if err != nil {
		return bc, err
	}
	if !quiet {
		fmt.Fprintf(env.Stderr, "airlock: uploaded a build context of %s (%s)\n", formatBytes(bc.Size), bc.ID)
	}
	return bc, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// showUpload shows the bytes sent so far on the terminal w, in place,
// until stop is closed.
func showUpload(w io.Writer, sent *atomic.Int64, stop <-chan struct{}) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	shown := false
	for {
		select {
		case <-stop:
			if shown {
				fmt.Fprint(w, "\r\033[K")
			}
			return
		case <-tick.C:
			fmt.Fprintf(w, "\r\033[Kairlock: uploading the build context: %s", formatBytes(sent.Load()))
			shown = true
		}
	}
}

// formatBytes is n in the largest binary unit that keeps it at 1 or more.
func formatBytes(n int64) string {
	if n < 1<<10 {
		return fmt.Sprintf("%d B", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	v := float64(n) / (1 << 10)
	i := 0
	for v >= 1<<10 && i < len(units)-1 {
		v /= 1 << 10
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// writeContextTar writes the tree under root to w as a tar stream, names
// relative to root in lexical order: directories, regular files and
// symlinks with their permission bits and modification times, owned by
// root. Symlinks are stored as links, never followed, wherever they point;
// files are opened through root, so nothing outside it is read. Paths the
// rules exclude are left out; sockets, named pipes and devices are skipped
// with a notice to warn.
func writeContextTar(w io.Writer, root *os.Root, rules ignoreRules, warn io.Writer) error {
	tw := tar.NewWriter(w)
	err := fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		if rules.excluded(name) {
			if d.IsDir() && !rules.hasExceptions() {
				return fs.SkipDir
			}
			return nil // a directory is still walked for what an exception brings back
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch mode := info.Mode(); {
		case mode.IsRegular(), mode.IsDir():
		case mode&fs.ModeSymlink != 0:
			if link, err = root.Readlink(name); err != nil {
				return err
			}
		default:
			fmt.Fprintf(warn, "airlock: template build: skipping %s: a %s is not a file, directory or symlink\n", name, fileKind(mode))
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := root.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s became shorter while it was read", name)
			}
			return fmt.Errorf("read %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// fileKind names the type of a special file.
func fileKind(mode fs.FileMode) string {
	switch {
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeNamedPipe != 0:
		return "named pipe"
	case mode&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// ignoreRule is one pattern of a .dockerignore.
type ignoreRule struct {
	segs   []string // the pattern's path segments; "**" stands for any number of them
	except bool     // the line began with '!': what it matches is put back
}

// ignoreRules are the patterns of a .dockerignore, in order: the last
// one that matches a path decides whether it is left out.
type ignoreRules []ignoreRule

// maxDockerignore bounds the .dockerignore read.
const maxDockerignore = 1 << 20

// readDockerignore reads the .dockerignore at the root of a context; none
// is no rules.
func readDockerignore(root *os.Root) (ignoreRules, error) {
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDockerignore+1))
	if err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	if len(b) > maxDockerignore {
		return nil, fmt.Errorf(".dockerignore is larger than 1 MiB: %w", errdefs.ErrInvalid)
	}
	return parseDockerignore(b)
}

// parseDockerignore reads .dockerignore lines as Docker does: a line
// starting with '#' is a comment; surrounding space is trimmed; '!' makes
// an exception; the pattern is cleaned, relative to the context root (a
// leading '/' is dropped), and written with '*', '?', '[...]' and '\' as
// path.Match has them, and "**" as a whole segment for any number of
// directories.
func parseDockerignore(b []byte) (ignoreRules, error) {
	var rules ignoreRules
	sc := bufio.NewScanner(bytes.NewReader(bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))))
	sc.Buffer(nil, maxDockerignore)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimSpace(line)
		var r ignoreRule
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			r.except, line = true, strings.TrimSpace(rest)
		}
		if line == "" {
			continue
		}
		line = strings.TrimPrefix(path.Clean(filepath.ToSlash(line)), "/")
		if line == "" || line == "." {
			continue
		}
		r.segs = strings.Split(line, "/")
		for _, s := range r.segs {
			if _, err := path.Match(s, ""); err != nil {
				return nil, fmt.Errorf(".dockerignore line %d: %q is not a valid pattern: %w", n, sc.Text(), errdefs.ErrInvalid)
			}
		}
		rules = append(rules, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	return rules, nil
}

// excluded reports whether the rules leave out name, a slash-separated
// path relative to the context root. A rule that matches a directory
// matches what is under it too.
func (rs ignoreRules) excluded(name string) bool {
	segs := strings.Split(name, "/")
	out := false
	for _, r := range rs {
		for i := 1; i <= len(segs); i++ {
			if matchSegs(r.segs, segs[:i]) {
				out = !r.except
				break
			}
		}
	}
	return out
}

// hasExceptions reports whether a rule puts paths back, so that an
// excluded directory may still hold something to send.
func (rs ignoreRules) hasExceptions() bool {
	for _, r := range rs {
		if r.except {
			return true
		}
	}
	return false
}

// matchSegs matches path segments against pattern segments. A "**" in the
// middle or at the start stands for zero or more segments, one at the end
// for one or more.
func matchSegs(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			rest := pat[1:]
			if len(rest) == 0 {
				return len(name) > 0
			}
			for i := 0; i <= len(name); i++ {
				if matchSegs(rest, name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}
