package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func templateCommands() []command {
	return []command{
		{"build", "build a template from a Dockerfile", runTemplateBuild},
		{"ls", "list templates", runTemplateList},
		{"get", "show a template as JSON", runTemplateGet},
		{"rm", "remove template tags", runTemplateRemove},
		{"log", "show a template's build log, following a build in progress", runTemplateLog},
	}
}

func runTemplate(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "template",
		"Builds, lists and removes the templates of an airlock server (`airlock serve`): the\n"+
			"disk images sandboxes boot from. `airlock sandbox save` makes one of a sandbox.",
		templateCommands(), args)
}

// maxDockerfile is the largest Dockerfile the server takes.
const maxDockerfile = 1 << 20

const templateBuildAbout = `Builds the template NAME:TAG on the airlock server from a Dockerfile,
showing the build's log, and prints "NAME:TAG DIGEST" once it is ready.
Exits 1 with the server's reason if the build fails. A build replaces what
NAME:TAG named before, so -t is required: the name is never guessed.

The Dockerfile is -f (- reads stdin), by default CONTEXT_DIR/Dockerfile.
The server takes a single-stage Dockerfile: FROM, RUN, ENV, ARG, WORKDIR,
USER, COPY and ADD of context paths, CMD and ENTRYPOINT.

CONTEXT_DIR is sent to the server as the build context, which COPY and ADD
read. Without CONTEXT_DIR, the current directory is sent if the Dockerfile
has a COPY or ADD, else nothing. The context is sent as a tar stream of its
directories, regular files and symlinks with their permission bits; symlinks
are sent as links, never followed, and sockets, pipes and devices are skipped
with a warning. A .dockerignore at the context root leaves paths out: one
pattern a line, '#' comments, '!' exceptions, '*', '?' and '[...]' within a
path segment and "**" as a whole segment for any depth; a pattern that
matches a directory leaves out all under it. (A Dockerfile-specific
NAME.dockerignore is not read.)

Log lines show as "[step N] text" ("[build]" for the build's own work):
the output a step writes on stdout goes to stdout, its stderr to stderr,
and the server's notes about the build to stderr as "[step N] ==> text".
Interrupting the command leaves the build running on the server:
` + "`airlock template log NAME:TAG`" + ` follows it again.

  airlock template build -t myapp .
  airlock template build -f ci/Dockerfile -t myapp:v2 --build-arg PY=3.12 .
  airlock template build -t web --start-cmd 'python3 -m http.server 8000' \
      --ready-cmd 'curl -sf localhost:8000' .
  airlock template build -f - -t tools < Dockerfile.tools`

func runTemplateBuild(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("template build", "airlock template build [FLAGS] -t NAME[:TAG] [CONTEXT_DIR]", templateBuildAbout, env)
	sf := addServerFlags(fs)
	file := fs.String("f", "", "the `Dockerfile` to build; - reads it from stdin (default CONTEXT_DIR/Dockerfile)")
	ref := fs.String("t", "", "the template to make, `NAME[:TAG]` (required; TAG defaults to latest)")
	buildArgs := envFlags{}
	fs.Var(buildArgs, "build-arg", "value `KEY=VALUE` of an ARG of the Dockerfile (repeatable)")
	startCmd := fs.String("start-cmd", "", "shell `command` the template's sandboxes start with (default: the Dockerfile's ENTRYPOINT and CMD)")
	readyCmd := fs.String("ready-cmd", "", "shell `command` that succeeds once the start command is ready; a new sandbox is handed out then")
	vcpus := fs.Int("vcpus", 0, "virtual CPUs of the build and of the template's sandboxes (default: the server's)")
	memory := fs.Int("memory", 0, "memory in `MiB` of the build and of the template's sandboxes (default: the server's)")
	disk := fs.Int("disk", 0, "disk size in `MiB` of the template (default: the server's)")
	noWait := fs.Bool("no-wait", false, "print the build's operation ID once the server has accepted it, and return")
	quiet := fs.Bool("q", false, "show neither the build log nor the upload: print only NAME:TAG DIGEST")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("template build: give at most one CONTEXT_DIR, got %q: %w", pos, errdefs.ErrInvalid)
	}
	contextDir := ""
	if len(pos) == 1 {
		contextDir = pos[0]
	}
	if *ref == "" {
		return fmt.Errorf("template build: give the template to make with -t NAME[:TAG], e.g. -t %s: %w", suggestName(contextDir), errdefs.ErrInvalid)
	}
	name, tag, err := splitTemplateName(*ref)
	if err != nil {
		return fmt.Errorf("template build: -t %w", err)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"vcpus", *vcpus}, {"memory", *memory}, {"disk", *disk}} {
		if f.v < 0 {
			return fmt.Errorf("template build: --%s must not be negative: %w", f.name, errdefs.ErrInvalid)
		}
	}
	if contextDir != "" {
		if err := checkContextDir(contextDir); err != nil {
			return err
		}
	}
	text, err := readDockerfile(env, *file, contextDir)
	if err != nil {
		return err
	}
	if contextDir == "" {
		copies, err := dockerfileCopies(text)
		if err != nil {
			return fmt.Errorf("template build: Dockerfile: %v: %w", err, errdefs.ErrInvalid)
		}
		if copies {
			contextDir = "."
		}
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	req := apiv1.CreateTemplate{Name: name, Tag: tag, Dockerfile: text, StartCmd: *startCmd, ReadyCmd: *readyCmd,
		VCPUs: *vcpus, MemoryMiB: *memory, DiskMiB: *disk}
	if len(buildArgs) > 0 {
		req.BuildArgs = buildArgs
	}
	if contextDir != "" {
		bc, err := uploadContext(ctx, env, c, contextDir, *quiet)
		if err != nil {
			return err
		}
		req.Context = bc.ID
	}
	to, err := c.CreateTemplate(ctx, req)
	if err != nil {
		return err
	}
	built := templateRef(to.Template, name, tag)
	if *noWait {
		fmt.Fprintln(env.Stdout, to.Operation.ID)
		if !*quiet {
			fmt.Fprintf(env.Stderr, "airlock: building %s; `airlock template log %s` follows the build, `airlock op get --wait %s` waits for it\n",
				built, built, to.Operation.ID)
		}
		return nil
	}
	return followBuild(ctx, env, c, built, *quiet)
}

// suggestName is a template name made of a directory's name, for the
// message that asks for -t.
func suggestName(dir string) string {
	if dir == "" {
		dir = "."
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "myapp"
	}
	var b strings.Builder
	for _, r := range strings.ToLower(filepath.Base(abs)) {
		switch {
		case r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)), r == '.', r == '_', r == '-':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := strings.TrimLeft(b.String(), "._-")
	s = strings.TrimRight(s[:min(len(s), 64)], "-")
	if s == "" {
		return "myapp"
	}
	return s
}

// splitTemplateName reads NAME[:TAG], catching what is plainly wrong; the
// server checks the rest. An empty tag leaves it to the server (latest).
func splitTemplateName(s string) (name, tag string, err error) {
	name, tag, hasTag := strings.Cut(s, ":")
	switch {
	case strings.TrimSpace(s) == "":
		return "", "", fmt.Errorf("NAME[:TAG] is empty: %w", errdefs.ErrInvalid)
	case strings.ContainsFunc(s, unicode.IsSpace):
		return "", "", fmt.Errorf("%q: a template name has no spaces: %w", s, errdefs.ErrInvalid)
	case name == "":
		return "", "", fmt.Errorf("%q has no name before the ':': %w", s, errdefs.ErrInvalid)
	case hasTag && tag == "":
		return "", "", fmt.Errorf("%q has an empty tag after the ':': %w", s, errdefs.ErrInvalid)
	}
	return name, tag, nil
}

// templateRef is NAME:TAG of a template the server answered with, or of
// what was asked for when the answer lacks it.
func templateRef(t apiv1.Template, name, tag string) string {
	if t.Name != "" {
		name = t.Name
	}
	if t.Tag != "" {
		tag = t.Tag
	}
	if tag == "" {
		tag = "latest"
	}
	return name + ":" + tag
}

// checkContextDir checks that dir is a directory.
func checkContextDir(dir string) error {
	info, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("template build: context directory %s does not exist: %w", dir, errdefs.ErrNotFound)
	case err != nil:
		return fmt.Errorf("template build: context directory: %v: %w", err, errdefs.ErrInvalid)
	case !info.IsDir():
		return fmt.Errorf("template build: context %s is not a directory: %w", dir, errdefs.ErrInvalid)
	}
	return nil
}

// readDockerfile reads the Dockerfile -f names: file, stdin for "-", or
// Dockerfile in the context directory (the current one if none).
func readDockerfile(env *Env, file, contextDir string) (string, error) {
	var (
		b    []byte
		err  error
		name = file
	)
	switch file {
	case "-":
		name = "on stdin"
		if env.Stdin == nil {
			return "", fmt.Errorf("template build: -f -: there is no stdin: %w", errdefs.ErrInvalid)
		}
		b, err = io.ReadAll(io.LimitReader(env.Stdin, maxDockerfile+1))
	case "":
		if contextDir == "" {
			contextDir = "."
		}
		name = filepath.Join(contextDir, "Dockerfile")
		fallthrough
	default:
		var f *os.File
		if f, err = os.Open(name); err == nil {
			defer f.Close()
			b, err = io.ReadAll(io.LimitReader(f, maxDockerfile+1))
		}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist) && file == "":
		return "", fmt.Errorf("template build: there is no %s: name the Dockerfile with -f: %w", name, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("template build: Dockerfile %s does not exist: %w", name, errdefs.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("template build: read the Dockerfile: %v: %w", err, errdefs.ErrInvalid)
	case len(b) > maxDockerfile:
		return "", fmt.Errorf("template build: the Dockerfile %s is larger than the server's 1 MiB: %w", name, errdefs.ErrTooLarge)
	case len(strings.TrimSpace(string(b))) == 0:
		return "", fmt.Errorf("template build: the Dockerfile %s is empty: %w", name, errdefs.ErrInvalid)
	}
	return string(b), nil
}

// dockerfileCopies reports whether a Dockerfile has a COPY or ADD that
// reads the build context.
func dockerfileCopies(text string) (bool, error) {
	res, err := parser.Parse(strings.NewReader(text))
	if err != nil {
		return false, err
	}
	for _, n := range res.AST.Children {
		switch strings.ToLower(n.Value) {
		case "copy", "add":
			if !slices.ContainsFunc(n.Flags, func(f string) bool { return strings.HasPrefix(f, "--from") }) {
				return true, nil
			}
		}
	}
	return false, nil
}

// followBuild follows the build log of ref to its end and prints "REF
// DIGEST" on stdout when the build is ready; a failed build is an error
// with the server's reason, exit status 1.
func followBuild(ctx context.Context, env *Env, c *apiclient.Client, ref string, quiet bool) error {
	end, err := followBuildLog(ctx, env, c, ref, quiet)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stopped following the build of %s, which goes on on the server (`airlock template log %s` follows it): %w", ref, ref, err)
		}
		return err
	}
	if end.Status != apiv1.TemplateReady {
		msg := "no reason given"
		if end.Error != nil && end.Error.Message != "" {
			msg = end.Error.Message
		}
		return &ExitError{Code: 1, Err: fmt.Errorf("build of %s failed: %s", ref, msg)}
	}
	digest := end.Digest
	if digest == "" {
		t, err := c.GetTemplate(ctx, ref)
		if err != nil {
			return err
		}
		digest = t.Digest
	}
	fmt.Fprintln(env.Stdout, ref, digest)
	return nil
}

// Following a build log: a stream that breaks before its end is opened
// again, up to logRetries times in a row without a new line, logRetryWait
// apart; the lines it replays that were shown already are skipped.
const (
	logRetries   = 5
	logRetryWait = time.Second
)

// errLogCut says a build log stream ended before its end event.
var errLogCut = errors.New("the build log ended before the build did")

// followBuildLog shows the build log of ref from its first line, unless
// quiet, and returns how the build ended.
func followBuildLog(ctx context.Context, env *Env, api *apiclient.Client, ref string, quiet bool) (apiv1.BuildEnd, error) {
	shown := 0
	var lastErr error
	for failures := 0; failures <= logRetries; failures++ {
		if failures > 0 {
			select {
			case <-ctx.Done():
				return apiv1.BuildEnd{}, ctx.Err()
			case <-time.After(logRetryWait):
			}
		}
		end, n, err := readBuildLog(ctx, env, api, ref, shown, quiet)
		if err == nil {
			return end, nil
		}
		var apiErr *apiclient.Error
		if ctx.Err() != nil || errors.As(err, &apiErr) || errors.Is(err, errdefs.ErrUnavailable) {
			return end, err // the server said no, or is not there: asking again will not help
		}
		if n > shown {
			failures = 0
		}
		shown, lastErr = n, err
	}
	return apiv1.BuildEnd{}, fmt.Errorf("follow the build log of %s: %w", ref, lastErr)
}

// readBuildLog reads one stream of ref's build log to its end event,
// showing the lines after the first skip (shown by an earlier stream), and
// returns the end and how many lines have been shown, this stream's and
// the earlier ones.
func readBuildLog(ctx context.Context, env *Env, api *apiclient.Client, ref string, skip int, quiet bool) (apiv1.BuildEnd, int, error) {
	s, err := api.BuildLog(ctx, ref)
	if err != nil {
		return apiv1.BuildEnd{}, skip, err
	}
	defer s.Close()
	n := 0
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return apiv1.BuildEnd{}, max(n, skip), errLogCut
		}
		if err != nil {
			return apiv1.BuildEnd{}, max(n, skip), err
		}
		switch ev.Name {
		case "log":
			var ln apiv1.BuildLogLine
			if err := json.Unmarshal(ev.Data, &ln); err != nil {
				return apiv1.BuildEnd{}, max(n, skip), fmt.Errorf("build log of %s: a bad line %q: %w", ref, ev.Data, err)
			}
			n++
			if n > skip && !quiet {
				printLogLine(env, ln)
			}
		case "end":
			var end apiv1.BuildEnd
			if err := json.Unmarshal(ev.Data, &end); err != nil {
				return end, max(n, skip), fmt.Errorf("build log of %s: a bad end %q: %w", ref, ev.Data, err)
			}
			return end, max(n, skip), nil
		}
	}
}

// printLogLine shows one line of a build log: a step's stdout on stdout,
// its stderr and the server's notes on stderr.
func printLogLine(env *Env, ln apiv1.BuildLogLine) {
	prefix := "[build]"
	if ln.Step > 0 {
		prefix = fmt.Sprintf("[step %d]", ln.Step)
	}
	switch ln.Stream {
	case "stdout":
		fmt.Fprintf(env.Stdout, "%s %s\n", prefix, ln.Text)
	case "stderr":
		fmt.Fprintf(env.Stderr, "%s %s\n", prefix, ln.Text)
	default:
		fmt.Fprintf(env.Stderr, "%s ==> %s\n", prefix, ln.Text)
	}
}

const templateListAbout = `Lists the templates, as a table or as a JSON array: each tag with its
status (building, ready or failed), digest, size, and what it was made from.

  airlock template ls
  airlock template ls --json | jq -r '.[] | select(.status == "ready") | .name + ":" + .tag'`

func runTemplateList(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("template ls", "airlock template ls [FLAGS]", templateListAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("template ls: unexpected arguments %q: %w", pos, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	items, err := listAll(ctx, "templates", func(lo apiclient.ListOptions) (apiv1.List[apiv1.Template], error) {
		return c.ListTemplates(ctx, lo)
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, items)
	}
	return printTemplateTable(env.Stdout, items, time.Now())
}

func printTemplateTable(w io.Writer, items []apiv1.Template, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "REF\tSTATUS\tDIGEST\tSIZE\tCREATED\tSOURCE")
	for _, t := range items {
		digest := "-"
		if hex, ok := strings.CutPrefix(t.Digest, "sha256:"); ok && hex != "" {
			digest = hex[:min(len(hex), 12)]
		}
		size := "-"
		if t.SizeBytes > 0 {
			size = formatBytes(t.SizeBytes)
		}
		created := "-"
		if !t.CreatedAt.IsZero() {
			created = age(now, t.CreatedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", templateRef(t, "", ""), t.Status, digest, size, created, templateSource(t.Source))
	}
	return tw.Flush()
}

// templateSource says in a few words what a template was made from.
func templateSource(s *apiv1.TemplateSource) string {
	switch {
	case s == nil || s.From == "":
		return "-"
	case s.Steps == 1:
		return s.From + " +1 step"
	case s.Steps > 1:
		return fmt.Sprintf("%s +%d steps", s.From, s.Steps)
	}
	return s.From
}

const templateGetAbout = `Shows a template as JSON: its status, digest, size and sandbox defaults,
what it was built from, and the error of a failed build. REF is NAME,
NAME:TAG or sha256:DIGEST.

  airlock template get myapp:v2
  airlock template get myapp | jq -r .digest`

func runTemplateGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("template get", "airlock template get [FLAGS] REF", templateGetAbout, env)
	sf := addServerFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("template get: give one template ref, e.g. `airlock template get myapp:latest`: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	t, err := c.GetTemplate(ctx, pos[0])
	if err != nil {
		return err
	}
	return printJSON(env.Stdout, t)
}

const templateRemoveAbout = `Removes template tags and prints each one removed; a tag's image goes once
nothing refers to it. A user key may remove only what it built.

  airlock template rm myapp:v1
  airlock template ls --json | jq -r '.[] | select(.status == "failed") | .name + ":" + .tag' | xargs airlock template rm`

func runTemplateRemove(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("template rm", "airlock template rm [FLAGS] NAME:TAG...", templateRemoveAbout, env)
	sf := addServerFlags(fs)
	refs, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(refs) == 0 {
		return fmt.Errorf("template rm: give the NAME:TAG of each template to remove: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	return removeEach(env, "template rm", refs, func(x string) error { return c.DeleteTemplate(ctx, x) })
}

const templateLogAbout = `Shows the log of the build that made (or is making) a template, from its
first line, as ` + "`airlock template build`" + ` does, following a build in progress to
its end. Then prints "NAME:TAG DIGEST" if the build is ready, or exits 1 with
the server's reason if it failed.

  airlock template log myapp:v2`

func runTemplateLog(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("template log", "airlock template log [FLAGS] REF", templateLogAbout, env)
	sf := addServerFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("template log: give one template ref, e.g. `airlock template log myapp:latest`: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	return followBuild(ctx, env, c, pos[0], false)
}

const sandboxSaveAbout = `Saves a running, paused or suspended sandbox's disk as it is now as the
template NAME:TAG (TAG defaults to latest), waits until the template is
ready and prints "NAME:TAG DIGEST". The sandbox stays as it was; a running
one is frozen while its disk is copied. With --no-wait it prints the
operation ID as soon as the server has accepted the request.

  airlock sandbox save sbx7k2m9q4w8e1r5t3y6u myenv:v1
  airlock sandbox create --template myenv:v1`

func runSandboxSave(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox save", "airlock sandbox save [FLAGS] SBX NAME[:TAG]", sandboxSaveAbout, env)
	sf := addServerFlags(fs)
	noWait := fs.Bool("no-wait", false, "do not wait until the template is ready")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("sandbox save: give a sandbox ID and NAME[:TAG], e.g. `airlock sandbox save sbx… myenv:v1`: %w", errdefs.ErrInvalid)
	}
	name, tag, err := splitTemplateName(pos[1])
	if err != nil {
		return fmt.Errorf("sandbox save: %w", err)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	to, err := c.SaveSandbox(ctx, pos[0], apiv1.SaveTemplate{Name: name, Tag: tag})
	if err != nil {
		return err
	}
	ref := templateRef(to.Template, name, tag)
	if *noWait {
		fmt.Fprintln(env.Stdout, to.Operation.ID)
		return nil
	}
	if _, err := waitOperation(ctx, env, c, to.Operation, "saving "+pos[0]+" as "+ref+", build"); err != nil {
		return err
	}
	t, err := c.GetTemplate(ctx, ref)
	if err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, templateRef(t, name, tag), t.Digest)
	return nil
}
