package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Content that no tag names stays in the store until Reclaim removes it:
// built templates keep the intermediate images of their steps as a cache
// (templates/cache/<key> names the image a step made), and a sandbox's disk
// is an overlay whose backing file is its template's image.

// PutTree makes an ext4 image of the tree at rootfsDir and stores it with
// the given settings, without naming it: the result is found by its digest
// until Tag gives it a name.
func (s *Store) PutTree(ctx context.Context, rootfsDir string, defaults Settings) (Template, error) {
	return s.PutTreeWith(ctx, rootfsDir, defaults, nil)
}

// ToolRunner runs the host tool name (mkfs.ext4) with args and env on a
// tenant's content: read and write are the paths it may read and write.
// The tree it reads keeps the owners and modes of an image's files, so it
// must read any file there whatever its owner. It returns what the tool
// printed.
type ToolRunner func(ctx context.Context, name string, args, env, read, write []string) ([]byte, error)

// PutTreeWith is PutTree with mkfs.ext4 run by run: jailed, for a tree
// that came from a tenant's image (sandbox.ImageTools.TreeRunner). A nil
// run runs it as this process, for trees the host made itself.
func (s *Store) PutTreeWith(ctx context.Context, rootfsDir string, defaults Settings, run ToolRunner) (Template, error) {
	if err := defaults.validate(); err != nil {
		return Template{}, fmt.Errorf("store template: %w", err)
	}
	if fi, err := os.Stat(rootfsDir); err != nil || !fi.IsDir() {
		return Template{}, fmt.Errorf("store template: %s is not a directory: %w", rootfsDir, errdefs.ErrInvalid)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return Template{}, fmt.Errorf("store template: mkfs.ext4 not found (install e2fsprogs): %w", errdefs.ErrPrecondition)
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return Template{}, fmt.Errorf("store template: %w", err)
	}
	usage, err := measureTree(rootfsDir)
	if err != nil {
		return Template{}, fmt.Errorf("store template: %w", err)
	}
	tmp, err := os.CreateTemp(s.dir, ".import-*.ext4")
	if err != nil {
		return Template{}, fmt.Errorf("store template: %w", err)
	}
	tmpName := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpName)
	if err := mkfs(ctx, rootfsDir, tmpName, usage, run); err != nil {
		return Template{}, fmt.Errorf("store template: %w", err)
	}
	return s.PutImage(ctx, tmpName, defaults)
}

// TempDir makes a directory for work on the way into the store (a tree to
// flatten an image into, a disk being saved), on the store's filesystem so
// that results are renamed into place, not copied.
func (s *Store) TempDir(pattern string) (string, error) {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(s.dir, "."+pattern+"-*")
}

// Tag points name:tag at the stored image dgst, replacing what it named
// before. The template's settings are those stored with the image.
func (s *Store) Tag(name, tag, dgst string) (Template, error) {
	if tag == "" {
		tag = DefaultTag
	}
	ref := name + ":" + tag
	if n, _, err := ParseRef(ref); err != nil || n == "" {
		return Template{}, fmt.Errorf("tag template %s: bad name or tag: %w", ref, errdefs.ErrInvalid)
	}
	if _, err := s.load(dgst); err != nil {
		return Template{}, fmt.Errorf("tag template %s: image %s: %w", ref, dgst, err)
	}
	// The image's record names the tag it was last given, for a template
	// asked for by digest.
	if err := s.nameRecord(dgst, name, tag); err != nil {
		return Template{}, fmt.Errorf("tag template %s: %w", ref, err)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "refs", name), 0o755); err != nil {
		return Template{}, fmt.Errorf("tag template %s: %w", ref, err)
	}
	if err := atomicfile.WriteBytes(s.refPath(name, tag), []byte(dgst+"\n"), 0o644); err != nil {
		return Template{}, fmt.Errorf("tag template %s: %w", ref, err)
	}
	t, err := s.resolveName(name, tag)
	if err != nil {
		return Template{}, fmt.Errorf("tag template %s: read back: %w", ref, err)
	}
	return t, nil
}

// Untag removes name:tag. The image stays until Reclaim finds nothing
// refers to it. An unknown tag is errdefs.ErrNotFound.
func (s *Store) Untag(name, tag string) error {
	ref := name + ":" + tag
	if n, _, err := ParseRef(ref); err != nil || n == "" {
		return fmt.Errorf("remove template %s: a tag is removed by name:tag: %w", ref, errdefs.ErrInvalid)
	}
	err := os.Remove(s.refPath(name, tag))
	if errors.Is(err, fs.ErrNotExist) {
		return s.notFound(ref)
	}
	if err != nil {
		return fmt.Errorf("remove template %s: %w", ref, err)
	}
	os.Remove(filepath.Join(s.dir, "refs", name)) // only when it was the last tag
	return nil
}

// Tagged returns the digest of every image some name:tag points at.
func (s *Store) Tagged() (map[string]bool, error) {
	ts, err := s.List()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, t := range ts {
		out[t.Digest] = true
	}
	return out, nil
}

var imageFileRE = regexp.MustCompile(`^sha256-([0-9a-f]{64})\.ext4$`)

// Images returns every stored image, named or not.
func (s *Store) Images() ([]Template, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	var out []Template
	for _, e := range ents {
		m := imageFileRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		t, err := s.load("sha256:" + m[1])
		if err != nil {
			continue // half-written; Reclaim's leftovers pass removes it
		}
		out = append(out, t)
	}
	return out, nil
}

// RemoveImage deletes a stored image and its settings. The caller makes
// sure that no tag, sandbox or build still needs it.
func (s *Store) RemoveImage(dgst string) error {
	if !digestRE.MatchString(dgst) {
		return fmt.Errorf("remove image %q: not a digest: %w", dgst, errdefs.ErrInvalid)
	}
	hex := strings.TrimPrefix(dgst, "sha256:")
	for _, p := range []string{s.imagePath(hex), s.recordPath(hex)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove image %s: %w", dgst, err)
		}
	}
	return nil
}

// RemoveLeftovers deletes the temporary files and directories of imports
// and builds that a crash cut short. Call it only while none runs.
func (s *Store) RemoveLeftovers() error {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			errs = append(errs, os.RemoveAll(filepath.Join(s.dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

var cacheKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (s *Store) cachePath(key string) string { return filepath.Join(s.dir, "cache", key) }

// Cached returns the image a build step with the given key made, if it is
// still stored.
func (s *Store) Cached(key string) (Template, bool) {
	if !cacheKeyRE.MatchString(key) {
		return Template{}, false
	}
	b, err := os.ReadFile(s.cachePath(key))
	if err != nil {
		return Template{}, false
	}
	t, err := s.load(strings.TrimSpace(string(b)))
	if err != nil {
		return Template{}, false
	}
	return t, true
}

// Cache records that the build step with the given key made image dgst.
func (s *Store) Cache(key, dgst string) error {
	if !cacheKeyRE.MatchString(key) || !digestRE.MatchString(dgst) {
		return fmt.Errorf("cache step %q -> %q: %w", key, dgst, errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "cache"), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteBytes(s.cachePath(key), []byte(dgst+"\n"), 0o644)
}

// CacheEntries returns every cached step key and the image it names.
func (s *Store) CacheEntries() (map[string]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "cache"))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list build cache: %w", err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if !cacheKeyRE.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(s.cachePath(e.Name()))
		if err != nil {
			continue
		}
		out[e.Name()] = strings.TrimSpace(string(b))
	}
	return out, nil
}

// Uncache forgets a cached step.
func (s *Store) Uncache(key string) error {
	if !cacheKeyRE.MatchString(key) {
		return nil
	}
	if err := os.Remove(s.cachePath(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// PutImage stores the ext4 image at path with the given settings, without
// naming it. The file is moved into the store (it must be on the store's
// filesystem: see TempDir) or, when that content is stored already,
// removed. Storing the same content again replaces its settings.
func (s *Store) PutImage(ctx context.Context, path string, defaults Settings) (Template, error) {
	if err := defaults.validate(); err != nil {
		return Template{}, fmt.Errorf("store image: %w", err)
	}
	sum, size, err := digest.File(ctx, path)
	if err != nil {
		return Template{}, fmt.Errorf("store image: %w", err)
	}
	return s.install(path, sum, size, defaults)
}

// install moves the image at path, whose content hashes to sum and is
// size bytes, into the store with its settings (see PutImage).
func (s *Store) install(path, sum string, size int64, defaults Settings) (Template, error) {
	dgst := "sha256:" + sum
	img := s.imagePath(sum)
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := os.Chmod(path, 0o444); err != nil {
			return Template{}, fmt.Errorf("store image: %w", err)
		}
		if err := syncFile(path); err != nil {
			return Template{}, fmt.Errorf("store image: %w", err)
		}
		if err := os.Rename(path, img); err != nil {
			return Template{}, fmt.Errorf("store image: %w", err)
		}
	} else {
		os.Remove(path)
	}
	r := newRecord(dgst, size, defaults)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return Template{}, fmt.Errorf("store image: %w", err)
	}
	if err := atomicfile.WriteBytes(s.recordPath(sum), append(b, '\n'), 0o644); err != nil {
		return Template{}, fmt.Errorf("store image: %w", err)
	}
	return s.load(dgst)
}

// nameRecord sets the name and tag in the record of image dgst.
func (s *Store) nameRecord(dgst, name, tag string) error {
	hex := strings.TrimPrefix(dgst, "sha256:")
	b, err := os.ReadFile(s.recordPath(hex))
	if err != nil {
		return err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("read %s: %w", s.recordPath(hex), err)
	}
	if r.Name == name && r.Tag == tag {
		return nil
	}
	r.Name, r.Tag = name, tag
	if b, err = json.MarshalIndent(r, "", "  "); err != nil {
		return err
	}
	return atomicfile.WriteBytes(s.recordPath(hex), append(b, '\n'), 0o644)
}

// Link makes the template ref of another store one of this store's too,
// by reference: its image a symlink to the other's file, its settings and
// tag copies. For a data directory that shares another's templates but
// must reclaim only its own (tests, the bench). Removing the link later
// leaves the other's image alone.
func (s *Store) Link(from *Store, ref string) (Template, error) {
	t, err := from.Resolve(ref)
	if err != nil {
		return Template{}, err
	}
	hex := strings.TrimPrefix(t.Digest, "sha256:")
	rec, err := os.ReadFile(from.recordPath(hex))
	if err != nil {
		return Template{}, fmt.Errorf("link template %s: %w", t.Ref(), err)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "refs", t.Name), 0o755); err != nil {
		return Template{}, fmt.Errorf("link template %s: %w", t.Ref(), err)
	}
	if err := os.Symlink(t.Image, s.imagePath(hex)); err != nil && !errors.Is(err, fs.ErrExist) {
		return Template{}, fmt.Errorf("link template %s: %w", t.Ref(), err)
	}
	if err := atomicfile.WriteBytes(s.recordPath(hex), rec, 0o644); err != nil {
		return Template{}, fmt.Errorf("link template %s: %w", t.Ref(), err)
	}
	if err := atomicfile.WriteBytes(s.refPath(t.Name, t.Tag), []byte(t.Digest+"\n"), 0o644); err != nil {
		return Template{}, fmt.Errorf("link template %s: %w", t.Ref(), err)
	}
	return s.resolveName(t.Name, t.Tag)
}
