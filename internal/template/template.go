// Package template keeps the root filesystem templates sandboxes start from.
// A template is a read-only ext4 image, made with mkfs.ext4 -d from a
// directory tree, plus its default settings. It is addressed by the sha256
// of the image and named name:tag through refs:
//
//	templates/sha256-<hex>.ext4   the image, mode 0444
//	templates/sha256-<hex>.json   its settings
//	templates/refs/<name>/<tag>   the digest the name:tag points at
//
// Images are never removed or rewritten once written: sandbox disks are
// qcow2 overlays whose backing file is the image's path.
package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/textcheck"
)

// DefaultTag is the tag a ref without one means.
const DefaultTag = "latest"

// Settings are the defaults a sandbox made from a template starts with.
type Settings struct {
	// VCPUs is the number of virtual CPUs.
	VCPUs int `json:"vcpus"`
	// MemoryMiB is the guest memory in MiB.
	MemoryMiB int `json:"memory_mib"`
	// DiskMiB is the size in MiB the guest grows its root filesystem to.
	DiskMiB int `json:"disk_mib"`
	// StartCmd, if set, is a shell command the runtime starts in the
	// background in every sandbox of the template once the guest is
	// initialised (a server the template exists for, such as the code
	// interpreter's). Its output goes to StartLog in the guest.
	StartCmd string `json:"start_cmd,omitempty"`
	// ReadyPort, if set, is a guest TCP port on which an HTTP GET of
	// ReadyPath must answer 200 before a create returns.
	ReadyPort int `json:"ready_port,omitempty"`
	// ReadyPath is the path ReadyPort is probed at; default "/".
	ReadyPath string `json:"ready_path,omitempty"`
	// Recipe identifies how a built-in template was made (its packages
	// and files); setup rebuilds a built-in template whose recipe changed.
	Recipe string `json:"recipe,omitempty"`
	// ReadyCmd, if set, is a shell command run after StartCmd until it
	// exits 0: a create answers only once it has.
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// Config is the image configuration a built template keeps (also
	// written into the image for the guest agent: ImageConfigPath).
	Config *ImageConfig `json:"config,omitempty"`
	// Source says what a built template was made from.
	Source *Source `json:"source,omitempty"`
	// Parents are the stored images a built template was made through
	// (its base and each step's result): they stay, as the build cache,
	// while it does.
	Parents []string `json:"parents,omitempty"`
}

// ImageConfig is the part of an OCI image's configuration a template keeps:
// the default environment, working directory and user of every command.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// ImageConfigPath is where a template's ImageConfig is written in its image.
// The guest agent reads it at init for the defaults of every command.
const ImageConfigPath = agentproto.ImageConfigFile

// Source says what a built template was made from.
type Source struct {
	// From is the base as given: a template ref, docker://REF, oci-archive:ID,
	// or sandbox:ID for a saved sandbox.
	From string `json:"from"`
	// Resolved is the base pinned: the template or image digest.
	Resolved string `json:"resolved,omitempty"`
	// Steps is how many build steps were applied on top of it.
	Steps int `json:"steps"`
}

// StartLog is the file in the guest that a template's StartCmd writes
// its output to.
const StartLog = "/var/log/airlock-start.log"

// validate checks that every size is positive and the readiness probe is
// well formed.
func (s Settings) validate() error {
	if s.VCPUs <= 0 || s.MemoryMiB <= 0 || s.DiskMiB <= 0 {
		return fmt.Errorf("template settings %+v: vcpus, memory and disk must be positive: %w", s, errdefs.ErrInvalid)
	}
	if s.ReadyPort < 0 || s.ReadyPort > 65535 {
		return fmt.Errorf("template settings: ready_port %d is not a port number: %w", s.ReadyPort, errdefs.ErrInvalid)
	}
	if s.ReadyPath != "" && !strings.HasPrefix(s.ReadyPath, "/") {
		return fmt.Errorf("template settings: ready_path %q must start with /: %w", s.ReadyPath, errdefs.ErrInvalid)
	}
	if strings.ContainsRune(s.StartCmd, 0) || strings.ContainsRune(s.ReadyCmd, 0) {
		return fmt.Errorf("template settings: start_cmd and ready_cmd must not contain NUL bytes: %w", errdefs.ErrInvalid)
	}
	if s.ReadyCmd != "" && s.StartCmd == "" {
		return fmt.Errorf("template settings: ready_cmd needs a start_cmd whose readiness it checks: %w", errdefs.ErrInvalid)
	}
	if s.Config != nil {
		if err := s.Config.Validate(); err != nil {
			return fmt.Errorf("template settings: %w", err)
		}
	}
	return nil
}

// Validate checks what an image's configuration may hold: a working
// directory and a user without control characters (textcheck), and
// environment entries NAME=value whose names have none either. A pulled
// or uploaded image's configuration is the tenant's, so a build checks it
// before anything uses it; the error names the field.
func (c ImageConfig) Validate() error {
	if len(c.WorkingDir) > agentproto.MaxPath {
		return fmt.Errorf("image config WorkingDir is longer than %d bytes: %w", agentproto.MaxPath, errdefs.ErrInvalid)
	}
	if err := textcheck.Field("image config WorkingDir", c.WorkingDir); err != nil {
		return err
	}
	if c.WorkingDir != "" && !path.IsAbs(c.WorkingDir) {
		return fmt.Errorf("image config WorkingDir %q is not an absolute path: %w", c.WorkingDir, errdefs.ErrInvalid)
	}
	if len(c.User) > 256 {
		return fmt.Errorf("image config User is longer than 256 bytes: %w", errdefs.ErrInvalid)
	}
	if err := textcheck.Field("image config User", c.User); err != nil {
		return err
	}
	for i, kv := range c.Env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return fmt.Errorf("image config Env[%d] is not NAME=value: %w", i, errdefs.ErrInvalid)
		}
		if err := textcheck.Field(fmt.Sprintf("image config Env[%d] name", i), name); err != nil {
			return err
		}
		if strings.ContainsRune(kv, 0) {
			return fmt.Errorf("image config Env[%d] holds a NUL byte: %w", i, errdefs.ErrInvalid)
		}
	}
	return nil
}

// Template is one stored template.
type Template struct {
	// Name and Tag are the name it was asked for by, or the one it was last
	// imported as when it was asked for by digest.
	Name string
	Tag  string
	// Digest is "sha256:<hex>" of the image content.
	Digest string
	// Image is the absolute path of the read-only ext4 image.
	Image string
	// VCPUs, MemoryMiB and DiskMiB are the default sandbox settings.
	VCPUs     int
	MemoryMiB int
	DiskMiB   int
	// StartCmd, ReadyPort, ReadyPath and Recipe are as in Settings.
	StartCmd  string
	ReadyPort int
	ReadyPath string
	Recipe    string
	ReadyCmd  string
	// Config, Source and Parents are as in Settings.
	Config  *ImageConfig
	Source  *Source
	Parents []string
	// SizeBytes is the size of the image file.
	SizeBytes int64
	// CreatedAt is when the image was imported.
	CreatedAt time.Time
}

// Ref returns "name:tag", or the digest of an image no tag ever named.
func (t Template) Ref() string {
	if t.Name == "" {
		return t.Digest
	}
	return t.Name + ":" + t.Tag
}

// Settings returns the template's default sandbox settings.
func (t Template) Settings() Settings {
	return Settings{VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, DiskMiB: t.DiskMiB,
		StartCmd: t.StartCmd, ReadyPort: t.ReadyPort, ReadyPath: t.ReadyPath, Recipe: t.Recipe,
		ReadyCmd: t.ReadyCmd, Config: t.Config, Source: t.Source, Parents: t.Parents}
}

// record is the stored form of a template's settings, sha256-<hex>.json.
type record struct {
	Name      string    `json:"name"`
	Tag       string    `json:"tag"`
	Digest    string    `json:"digest"`
	VCPUs     int       `json:"vcpus"`
	MemoryMiB int       `json:"memory_mib"`
	DiskMiB   int       `json:"disk_mib"`
	StartCmd  string    `json:"start_cmd,omitempty"`
	ReadyPort int       `json:"ready_port,omitempty"`
	ReadyPath string    `json:"ready_path,omitempty"`
	Recipe    string    `json:"recipe,omitempty"`
	ReadyCmd  string    `json:"ready_cmd,omitempty"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`

	Config  *ImageConfig `json:"config,omitempty"`
	Source  *Source      `json:"source,omitempty"`
	Parents []string     `json:"parents,omitempty"`
}

// newRecord is the record of an image with the given digest, size and
// settings, created now.
func newRecord(dgst string, size int64, d Settings) record {
	return record{
		Digest: dgst, VCPUs: d.VCPUs, MemoryMiB: d.MemoryMiB, DiskMiB: d.DiskMiB,
		StartCmd: d.StartCmd, ReadyPort: d.ReadyPort, ReadyPath: d.ReadyPath, Recipe: d.Recipe,
		ReadyCmd: d.ReadyCmd, Config: d.Config, Source: d.Source, Parents: d.Parents,
		SizeBytes: size, CreatedAt: time.Now().UTC().Truncate(time.Second),
	}
}

// Store is the set of templates under a data directory. Its methods may be
// called concurrently: every file is replaced atomically.
type Store struct {
	dir string
}

// Open returns the store of templates under dir. Nothing is read until a
// method needs it, and the directory is created by the first Import.
func Open(dir datadir.Dir) *Store {
	root, err := filepath.Abs(dir.Templates())
	if err != nil {
		root = dir.Templates()
	}
	return &Store{dir: root}
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	tagRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ParseRef splits a template ref into name and tag. It accepts "name" (tag
// DefaultTag), "name:tag" and "sha256:<hex>" (returned as name "" and the
// digest as tag). A malformed ref is errdefs.ErrInvalid.
func ParseRef(ref string) (name, tag string, err error) {
	if strings.HasPrefix(ref, "sha256:") {
		if !digestRE.MatchString(ref) {
			return "", "", fmt.Errorf("template ref %q: a digest is sha256: and 64 lower-case hex digits: %w", ref, errdefs.ErrInvalid)
		}
		return "", ref, nil
	}
	name, tag, found := strings.Cut(ref, ":")
	if !found {
		tag = DefaultTag
	}
	if !nameRE.MatchString(name) {
		return "", "", fmt.Errorf("template ref %q: name must be 1-64 of a-z 0-9 . _ - starting with a letter or digit: %w", ref, errdefs.ErrInvalid)
	}
	if !tagRE.MatchString(tag) {
		return "", "", fmt.Errorf("template ref %q: tag must be 1-128 of A-Z a-z 0-9 . _ - not starting with . or -: %w", ref, errdefs.ErrInvalid)
	}
	return name, tag, nil
}

func (s *Store) imagePath(hex string) string { return filepath.Join(s.dir, "sha256-"+hex+".ext4") }
func (s *Store) recordPath(hex string) string {
	return filepath.Join(s.dir, "sha256-"+hex+".json")
}
func (s *Store) refPath(name, tag string) string { return filepath.Join(s.dir, "refs", name, tag) }

// Resolve returns the template a ref names: "name", "name:tag" or
// "sha256:<hex>". An unknown ref is errdefs.ErrNotFound, with the available
// templates in the message; a malformed one is errdefs.ErrInvalid.
func (s *Store) Resolve(ref string) (Template, error) {
	name, tag, err := ParseRef(ref)
	if err != nil {
		return Template{}, err
	}
	var t Template
	if name == "" {
		t, err = s.load(tag)
	} else {
		t, err = s.resolveName(name, tag)
	}
	if errors.Is(err, fs.ErrNotExist) {
		if name == "" {
			return Template{}, s.notFound(ref)
		}
		return Template{}, s.notFound(name + ":" + tag)
	}
	if err != nil {
		return Template{}, fmt.Errorf("resolve template %s: %w", ref, err)
	}
	return t, nil
}

// resolveName follows refs/<name>/<tag> to its template. A missing ref or
// image is an fs.ErrNotExist error.
func (s *Store) resolveName(name, tag string) (Template, error) {
	b, err := os.ReadFile(s.refPath(name, tag))
	if err != nil {
		return Template{}, err
	}
	target := strings.TrimSpace(string(b))
	if !digestRE.MatchString(target) {
		return Template{}, fmt.Errorf("ref file %s holds %q, not a digest", s.refPath(name, tag), target)
	}
	t, err := s.load(target)
	if err != nil {
		return Template{}, err
	}
	t.Name, t.Tag = name, tag
	return t, nil
}

// notFound is the error for an unknown ref; it lists what exists.
func (s *Store) notFound(ref string) error {
	all, _ := s.List()
	if len(all) == 0 {
		return fmt.Errorf("template %q not found and no templates exist: run `airlock setup`: %w", ref, errdefs.ErrNotFound)
	}
	refs := make([]string, len(all))
	for i, t := range all {
		refs[i] = t.Ref()
	}
	return fmt.Errorf("template %q not found (available: %s): %w", ref, strings.Join(refs, ", "), errdefs.ErrNotFound)
}

// load reads the template with the given digest and checks its image.
func (s *Store) load(ref string) (Template, error) {
	hex := strings.TrimPrefix(ref, "sha256:")
	b, err := os.ReadFile(s.recordPath(hex))
	if err != nil {
		return Template{}, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return Template{}, fmt.Errorf("read %s: %w", s.recordPath(hex), err)
	}
	img := s.imagePath(hex)
	fi, err := os.Stat(img)
	if err != nil {
		return Template{}, err
	}
	if r.Digest != ref || fi.Size() != r.SizeBytes {
		return Template{}, fmt.Errorf("template %s: settings say digest %s and %d bytes, image has %d bytes",
			ref, r.Digest, r.SizeBytes, fi.Size())
	}
	return Template{
		Name: r.Name, Tag: r.Tag, Digest: ref, Image: img,
		VCPUs: r.VCPUs, MemoryMiB: r.MemoryMiB, DiskMiB: r.DiskMiB,
		StartCmd: r.StartCmd, ReadyPort: r.ReadyPort, ReadyPath: r.ReadyPath, Recipe: r.Recipe,
		ReadyCmd: r.ReadyCmd, Config: r.Config, Source: r.Source, Parents: r.Parents,
		SizeBytes: r.SizeBytes, CreatedAt: r.CreatedAt,
	}, nil
}

// List returns every name:tag with a valid template, sorted by ref.
func (s *Store) List() ([]Template, error) {
	refs := filepath.Join(s.dir, "refs")
	names, err := os.ReadDir(refs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for _, n := range names {
		if !n.IsDir() || !nameRE.MatchString(n.Name()) {
			continue
		}
		tags, err := os.ReadDir(filepath.Join(refs, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		for _, tg := range tags {
			if !tg.Type().IsRegular() || !tagRE.MatchString(tg.Name()) {
				continue // temporary files start with '.'
			}
			t, err := s.resolveName(n.Name(), tg.Name())
			if err != nil {
				continue // a broken ref is not a template
			}
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b Template) int { return strings.Compare(a.Ref(), b.Ref()) })
	return out, nil
}

// Verify re-hashes a template's image and checks it against its digest.
func (s *Store) Verify(ctx context.Context, t Template) error {
	sum, _, err := digest.File(ctx, t.Image)
	if err != nil {
		return fmt.Errorf("verify template %s: %w", t.Ref(), err)
	}
	if got := "sha256:" + sum; got != t.Digest {
		return fmt.Errorf("verify template %s: image hashes to %s, want %s", t.Ref(), got, t.Digest)
	}
	return nil
}
