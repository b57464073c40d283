// Package imagebuild decides what a template build does, without running it:
// a Recipe is a base (a template, a registry image or an uploaded OCI
// archive) and the steps to run on it, given as JSON steps or as a Dockerfile
// (ParseDockerfile). It also keeps the uploaded build contexts that COPY
// steps read (Contexts), selects what one COPY takes from them (Select), and
// computes the cache key of each step (CacheKey). Running the steps in a VM
// is the caller's job.
package imagebuild

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/textcheck"
)

// Step is one build step. Exactly one of Run, Env, Workdir, User and Copy
// is set.
type Step struct {
	// Run is a shell command, run with /bin/sh -c in the working directory,
	// as the user and with the environment the steps before it set.
	Run string `json:"run,omitempty"`
	// Args, allowed only with Run, are variables set for this command alone
	// and not kept in the template: the ARG values of a Dockerfile. A
	// variable of the same name set by an Env step wins over an Arg.
	Args map[string]string `json:"args,omitempty"`
	// Env sets environment variables for the steps after it and for the
	// sandboxes made from the template.
	Env map[string]string `json:"env,omitempty"`
	// Workdir sets the working directory of the steps after it. A relative
	// one is taken against the current one, as Docker does (State.Apply).
	Workdir string `json:"workdir,omitempty"`
	// User sets the user the steps after it run as: a name or a uid,
	// optionally followed by ":" and a group name or gid.
	User string `json:"user,omitempty"`
	// Copy copies files from the build context into the filesystem.
	Copy *Copy `json:"copy,omitempty"`
}

// Copy copies a path of the build context into the filesystem.
type Copy struct {
	// Src is a path in the build context, whose root is "/" or ".". Of a
	// directory its contents are copied, not the directory itself. A
	// pattern with *, ? or [...] in its last components selects every match.
	// Symlinks on the way to Src are followed, within the context.
	Src string `json:"src"`
	// Dest is where the copy goes. A Dest ending in "/", or naming an
	// existing directory, receives the source inside it; otherwise a single
	// file is written as Dest. A relative Dest is taken against the working
	// directory (State.Resolve).
	Dest string `json:"dest"`
	// Chown, if set, is the user[:group] that owns the copied files;
	// without it they belong to root, as with Docker.
	Chown string `json:"chown,omitempty"`
}

// Kind names the field a step sets: "run", "env", "workdir", "user" or
// "copy", or "" for a step that sets none.
func (s Step) Kind() string {
	if k := s.kinds(); len(k) > 0 {
		return k[0]
	}
	return ""
}

// String renders the step as the Dockerfile instruction it is, for logs.
func (s Step) String() string {
	switch {
	case s.Run != "":
		return "RUN " + s.Run
	case s.Env != nil:
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			kv = append(kv, k+"="+shellQuote(s.Env[k]))
		}
		return "ENV " + strings.Join(kv, " ")
	case s.Workdir != "":
		return "WORKDIR " + s.Workdir
	case s.User != "":
		return "USER " + s.User
	case s.Copy != nil:
		chown := ""
		if s.Copy.Chown != "" {
			chown = "--chown=" + s.Copy.Chown + " "
		}
		return "COPY " + chown + s.Copy.Src + " " + s.Copy.Dest
	}
	return "(empty step)"
}

func (s Step) kinds() []string {
	var k []string
	if s.Run != "" {
		k = append(k, "run")
	}
	if s.Env != nil {
		k = append(k, "env")
	}
	if s.Workdir != "" {
		k = append(k, "workdir")
	}
	if s.User != "" {
		k = append(k, "user")
	}
	if s.Copy != nil {
		k = append(k, "copy")
	}
	return k
}

var (
	// envName is a name a POSIX shell can refer to.
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// userSpec is user[:group], each a name or a number.
	userSpec = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?$`)
)

// Validate checks that the step sets exactly one thing and that it is well
// formed. Its errors do not name the step; the caller does.
func (s Step) Validate() error {
	switch k := s.kinds(); len(k) {
	case 0:
		return fmt.Errorf("step sets none of run, env, workdir, user and copy: %w", errdefs.ErrInvalid)
	case 1:
	default:
		return fmt.Errorf("step sets %s; a step does exactly one thing: %w", strings.Join(k, " and "), errdefs.ErrInvalid)
	}
	if s.Args != nil && s.Run == "" {
		return fmt.Errorf("args are allowed only in a run step: %w", errdefs.ErrInvalid)
	}
	switch {
	case s.Run != "":
		if strings.TrimSpace(s.Run) == "" {
			return fmt.Errorf("run command is empty: %w", errdefs.ErrInvalid)
		}
		if strings.ContainsRune(s.Run, 0) {
			return fmt.Errorf("run command contains a NUL byte: %w", errdefs.ErrInvalid)
		}
		return checkVars("arg", s.Args)
	case s.Env != nil:
		if len(s.Env) == 0 {
			return fmt.Errorf("env step sets no variables: %w", errdefs.ErrInvalid)
		}
		return checkVars("env", s.Env)
	case s.Workdir != "":
		return checkPath("workdir", s.Workdir)
	case s.User != "":
		if !userSpec.MatchString(s.User) {
			return fmt.Errorf("user %q is not a user[:group] of names or numbers: %w", s.User, errdefs.ErrInvalid)
		}
		return nil
	default:
		return s.Copy.validate()
	}
}

func (c *Copy) validate() error {
	if c.Src == "" {
		return fmt.Errorf("copy source is empty: %w", errdefs.ErrInvalid)
	}
	if strings.ContainsRune(c.Src, 0) {
		return fmt.Errorf("copy source contains a NUL byte: %w", errdefs.ErrInvalid)
	}
	if err := textcheck.Field("copy source", c.Src); err != nil {
		return err
	}
	if _, _, err := sourcePath(c.Src); err != nil {
		return err
	}
	if c.Dest == "" {
		return fmt.Errorf("copy destination is empty: %w", errdefs.ErrInvalid)
	}
	if err := checkPath("copy destination", c.Dest); err != nil {
		return err
	}
	if c.Chown != "" && !userSpec.MatchString(c.Chown) {
		return fmt.Errorf("copy chown %q is not a user[:group] of names or numbers: %w", c.Chown, errdefs.ErrInvalid)
	}
	return nil
}

// checkVars checks the names and values of environment variables.
func checkVars(what string, vars map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if !envName.MatchString(k) {
			return fmt.Errorf("%s name %q is not valid: names are letters, digits and _, not starting with a digit: %w", what, k, errdefs.ErrInvalid)
		}
		if strings.ContainsRune(vars[k], 0) {
			return fmt.Errorf("%s %s contains a NUL byte: %w", what, k, errdefs.ErrInvalid)
		}
	}
	return nil
}

func checkPath(what, p string) error {
	if strings.TrimSpace(p) == "" {
		return fmt.Errorf("%s is empty: %w", what, errdefs.ErrInvalid)
	}
	if strings.ContainsRune(p, 0) {
		return fmt.Errorf("%s contains a NUL byte: %w", what, errdefs.ErrInvalid)
	}
	if len(p) > maxPathLen {
		return fmt.Errorf("%s is longer than %d bytes: %w", what, maxPathLen, errdefs.ErrInvalid)
	}
	return textcheck.Field(what, p)
}

// maxPathLen bounds a path in a step, as the guest's PATH_MAX does.
const maxPathLen = 4096

// sourcePath cleans a COPY source into a path relative to the context root
// ("" is the root) and reports whether it ended in "/". A source that climbs
// out of the root with ".." is refused.
func sourcePath(src string) (rel string, dirOnly bool, err error) {
	var parts []string
	for _, p := range strings.Split(src, "/") {
		switch p {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", false, fmt.Errorf("COPY source %s is outside the build context: %w", src, errdefs.ErrInvalid)
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), strings.HasSuffix(src, "/"), nil
}

// Recipe is what a build does: start from From and run Steps.
type Recipe struct {
	// From is the base: a template ref ("name", "name:tag" or
	// "sha256:<hex>"), "docker://REF" for a registry image, or
	// "oci-archive:<context id>" for an uploaded OCI archive. A Dockerfile's
	// FROM is kept verbatim; the caller resolves a template name first and
	// may then take it for an image.
	From string `json:"from"`
	// Steps run in order on From.
	Steps []Step `json:"steps,omitempty"`
	// StartCmd is the template's start command as one shell command, from a
	// Dockerfile's ENTRYPOINT and CMD; "" when it has neither.
	StartCmd string `json:"start_cmd,omitempty"`
	// Args are the ARG values in effect at the end of a Dockerfile, build
	// args applied; each Run step carries those in scope where it stands.
	Args map[string]string `json:"args,omitempty"`
	// Warnings say what of a Dockerfile was ignored: instructions without
	// effect here, build args it never declared.
	Warnings []string `json:"warnings,omitempty"`
}

// Validate checks the base and every step. A step's error names it by its
// index, as steps[i].
func (r Recipe) Validate() error {
	if err := validateFrom(r.From); err != nil {
		return err
	}
	for i, s := range r.Steps {
		if err := s.Validate(); err != nil {
			return fmt.Errorf("steps[%d]: %w", i, err)
		}
	}
	if strings.ContainsRune(r.StartCmd, 0) {
		return fmt.Errorf("start_cmd contains a NUL byte: %w", errdefs.ErrInvalid)
	}
	return nil
}

var sha256Ref = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func validateFrom(from string) error {
	if from == "" {
		return fmt.Errorf("from is empty: %w", errdefs.ErrInvalid)
	}
	if strings.IndexFunc(from, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("from %q contains spaces or control characters: %w", from, errdefs.ErrInvalid)
	}
	switch {
	case strings.HasPrefix(from, "docker://"):
		if from == "docker://" {
			return fmt.Errorf("from %q names no image: %w", from, errdefs.ErrInvalid)
		}
	case strings.HasPrefix(from, "oci-archive:"):
		if !contextID.MatchString(strings.TrimPrefix(from, "oci-archive:")) {
			return fmt.Errorf("from %q does not name a build context: %w", from, errdefs.ErrInvalid)
		}
	case strings.HasPrefix(from, "sha256:"):
		if !sha256Ref.MatchString(from) {
			return fmt.Errorf("from %q is not sha256: and 64 hex digits: %w", from, errdefs.ErrInvalid)
		}
	}
	return nil
}

// State is what the steps so far set for the next one.
type State struct {
	// Env holds the variables Env steps set.
	Env map[string]string `json:"env,omitempty"`
	// Workdir is the absolute working directory; "" means "/".
	Workdir string `json:"workdir,omitempty"`
	// User is the user steps run as; "" means the base's (root).
	User string `json:"user,omitempty"`
}

// Apply returns the state after step. It leaves s unchanged.
func (s State) Apply(step Step) State {
	switch {
	case step.Env != nil:
		env := maps.Clone(s.Env)
		if env == nil {
			env = make(map[string]string, len(step.Env))
		}
		maps.Copy(env, step.Env)
		s.Env = env
	case step.Workdir != "":
		s.Workdir = path.Clean(s.Resolve(step.Workdir))
	case step.User != "":
		s.User = step.User
	}
	return s
}

// Resolve returns p made absolute against the working directory and
// cleaned, keeping a final "/", which marks a COPY destination directory.
func (s State) Resolve(p string) string {
	wd := s.Workdir
	if wd == "" {
		wd = "/"
	}
	r := p
	if !path.IsAbs(r) {
		r = path.Join(wd, r)
	}
	r = path.Clean(r)
	if strings.HasSuffix(p, "/") && r != "/" {
		r += "/"
	}
	return r
}

// RunEnv returns the environment a Run step runs with: its Args under the
// state's Env, which wins on a shared name.
func (s State) RunEnv(step Step) map[string]string {
	env := make(map[string]string, len(step.Args)+len(s.Env))
	maps.Copy(env, step.Args)
	maps.Copy(env, s.Env)
	return env
}

// CacheKey returns the cache key of step: a sha256 over a canonical JSON
// encoding of the key of what it runs on (the previous step's key, or the
// base's digest for the first), the step, the state it runs with, and for a
// copy step the Selection's digest. Chaining keys step by step makes a
// rebuild with one changed step reuse everything before it.
func CacheKey(parent string, step Step, state State, copyDigest string) string {
	if state.Workdir == "" {
		state.Workdir = "/"
	}
	if len(state.Env) == 0 {
		state.Env = nil
	}
	b, err := json.Marshal(struct {
		Version int    `json:"v"`
		Parent  string `json:"parent"`
		Step    Step   `json:"step"`
		State   State  `json:"state"`
		Copy    string `json:"copy,omitempty"`
	}{1, parent, step, state, copyDigest})
	if err != nil {
		// Strings and maps of strings always encode.
		panic(fmt.Sprintf("encode cache key: %v", err))
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
