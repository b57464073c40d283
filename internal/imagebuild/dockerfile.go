package imagebuild

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/airlockhq/airlock/internal/errdefs"
)

const (
	// maxDockerfileSize is the largest Dockerfile ParseDockerfile reads.
	maxDockerfileSize = 1 << 20
	// maxDockerfileLine is the longest physical line, the parser's limit.
	maxDockerfileLine = 64<<10 - 1
)

// ParseDockerfile turns a single-stage Dockerfile into a Recipe. buildArgs
// override the defaults of its ARGs, as docker build --build-arg does.
//
// Supported: the escape directive, comments and line continuations; ARG
// (before FROM for FROM itself, after it for the steps); one FROM; RUN in
// shell form, and in exec form as a command of shell-quoted words; ENV in
// both forms; WORKDIR; USER; COPY and ADD of build-context paths, with
// --chown (and --link, which changes nothing here); CMD and ENTRYPOINT,
// combined as Docker does into Recipe.StartCmd. $VAR, ${VAR} and the
// ${VAR:-word} family are substituted in FROM, ENV, WORKDIR, USER, COPY and
// ADD; RUN is left to the shell, which gets the ARGs in scope through the
// step's Args and the ENVs through the environment.
//
// Accepted and ignored, each with a warning, because they do not change the
// filesystem: EXPOSE, LABEL, MAINTAINER, STOPSIGNAL, HEALTHCHECK and VOLUME
// (the build keeps what later steps write under a volume path).
//
// Rejected with ErrInvalid and the line: multi-stage builds (a second FROM,
// COPY --from), FROM scratch, FROM --platform, ONBUILD, SHELL, here-documents,
// RUN flags (--mount, --network, ...), COPY and ADD flags other than --chown
// and --link, ADD of a URL or a git repository, and ADD of a local archive:
// Docker would unpack it and airlock does not, so a Dockerfile relying on
// that fails here rather than building something else (COPY the archive
// and unpack it in a RUN step). Archives are told by their file extension.
func ParseDockerfile(text string, buildArgs map[string]string) (Recipe, error) {
	if len(text) > maxDockerfileSize {
		return Recipe{}, fmt.Errorf("dockerfile is over the limit of %d bytes: %w", maxDockerfileSize, errdefs.ErrTooLarge)
	}
	if strings.ContainsRune(text, 0) {
		return Recipe{}, fmt.Errorf("dockerfile contains a NUL byte: %w", errdefs.ErrInvalid)
	}
	for i, line := range strings.Split(text, "\n") {
		if len(line) > maxDockerfileLine {
			return Recipe{}, fmt.Errorf("dockerfile line %d is longer than %d bytes: %w", i+1, maxDockerfileLine, errdefs.ErrInvalid)
		}
	}
	res, err := parser.Parse(strings.NewReader(text))
	if err != nil {
		return Recipe{}, parseError(err)
	}
	d := &dockerfile{
		lex:       shell.NewLex(res.EscapeToken),
		buildArgs: buildArgs,
		usedArgs:  map[string]bool{},
		metaArgs:  map[string]string{},
	}
	for _, w := range res.Warnings {
		d.warnings = append(d.warnings, "dockerfile: "+w.Short)
	}
	for _, n := range res.AST.Children {
		if err := d.instruction(n); err != nil {
			return Recipe{}, err
		}
	}
	if !d.sawFrom {
		return Recipe{}, fmt.Errorf("dockerfile has no FROM: %w", errdefs.ErrInvalid)
	}
	for _, k := range slices.Sorted(maps.Keys(buildArgs)) {
		if !d.usedArgs[k] {
			d.warnings = append(d.warnings, fmt.Sprintf("build arg %s is not declared by an ARG of the dockerfile", k))
		}
	}
	r := Recipe{From: d.from, Steps: d.steps, StartCmd: d.startCmd(), Warnings: d.warnings}
	if len(d.args) > 0 {
		r.Args = d.args
	}
	return r, nil
}

// parseError turns an error of the parser into ErrInvalid, naming the line
// when the parser knows it.
func parseError(err error) error {
	msg := err.Error()
	var le *parser.LocationError
	if errors.As(err, &le) {
		msg = le.Unwrap().Error()
		if msg == "file with no instructions" {
			return fmt.Errorf("dockerfile has no instructions: %w", errdefs.ErrInvalid)
		}
		if len(le.Locations) > 0 && len(le.Locations[0]) > 0 && le.Locations[0][0].Start.Line > 0 {
			return fmt.Errorf("dockerfile line %d: %s: %w", le.Locations[0][0].Start.Line, msg, errdefs.ErrInvalid)
		}
	}
	return fmt.Errorf("dockerfile: %s: %w", msg, errdefs.ErrInvalid)
}

// proxyArgs are the build args Docker passes to RUN without an ARG.
var proxyArgs = []string{
	"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
	"FTP_PROXY", "ftp_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy",
}

// ignored are the instructions accepted without effect.
var ignored = map[string]bool{
	"expose": true, "label": true, "maintainer": true,
	"stopsignal": true, "healthcheck": true, "volume": true,
}

// archiveExts are the names ADD would unpack.
var archiveExts = []string{
	".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz",
	".tar.zst", ".tzst", ".tar.lz", ".tar.lzma", ".tlz",
}

// dockerfile is the state of one parse.
type dockerfile struct {
	lex       *shell.Lex
	buildArgs map[string]string
	usedArgs  map[string]bool
	// metaArgs are the ARGs declared before FROM that have a value.
	metaArgs map[string]string
	// args are the ARGs in scope after FROM that have a value.
	args map[string]string
	// env are the variables ENV set.
	env      map[string]string
	sawFrom  bool
	from     string
	steps    []Step
	cmd      *command
	entry    *command
	warnings []string
}

// command is a CMD or ENTRYPOINT: exec form words, or shell form text.
type command struct {
	exec  bool
	words []string
	text  string
}

func lineError(n *parser.Node, format string, a ...any) error {
	return fmt.Errorf("dockerfile line %d: %s: %w", n.StartLine, fmt.Sprintf(format, a...), errdefs.ErrInvalid)
}

func (d *dockerfile) instruction(n *parser.Node) error {
	name := strings.ToLower(n.Value)
	upper := strings.ToUpper(n.Value)
	if !d.sawFrom && name != "arg" && name != "from" {
		return lineError(n, "%s before FROM: a dockerfile starts with FROM, after ARGs only", upper)
	}
	if len(n.Heredocs) > 0 {
		return lineError(n, "%s with a here-document is not supported", upper)
	}
	switch name {
	case "arg":
		return d.arg(n)
	case "from":
		return d.fromInstr(n)
	case "run":
		return d.run(n)
	case "env":
		return d.envInstr(n)
	case "workdir":
		w, err := d.single(n)
		if err != nil {
			return err
		}
		return d.add(n, Step{Workdir: w})
	case "user":
		u, err := d.single(n)
		if err != nil {
			return err
		}
		return d.add(n, Step{User: u})
	case "copy", "add":
		return d.copyInstr(n, upper)
	case "cmd", "entrypoint":
		if len(n.Flags) > 0 {
			return lineError(n, "%s %s is not supported", upper, n.Flags[0])
		}
		c := &command{exec: n.Attributes["json"]}
		for x := n.Next; x != nil; x = x.Next {
			c.words = append(c.words, x.Value)
		}
		if !c.exec {
			c.text = strings.Join(c.words, " ")
			if strings.TrimSpace(c.text) == "" {
				return lineError(n, "%s needs a command", upper)
			}
		}
		if name == "cmd" {
			d.cmd = c
		} else {
			d.entry = c
		}
		return nil
	case "onbuild", "shell":
		return lineError(n, "%s is not supported", upper)
	}
	if ignored[name] {
		d.warnings = append(d.warnings, fmt.Sprintf("dockerfile line %d: %s is ignored", n.StartLine, upper))
		return nil
	}
	return lineError(n, "unknown instruction %s", n.Value)
}

// add validates a step made from n and appends it.
func (d *dockerfile) add(n *parser.Node, s Step) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("dockerfile line %d: %w", n.StartLine, err)
	}
	d.steps = append(d.steps, s)
	return nil
}

// vars returns the variables substitution sees: the ARGs in scope, and the
// ENVs over them.
func (d *dockerfile) vars() map[string]string {
	if !d.sawFrom {
		return d.metaArgs
	}
	v := maps.Clone(d.args)
	if v == nil {
		v = map[string]string{}
	}
	maps.Copy(v, d.env)
	return v
}

func (d *dockerfile) expand(n *parser.Node, word string, vars map[string]string) (string, error) {
	out, _, err := d.lex.ProcessWord(word, envGetter(vars))
	if err != nil {
		return "", lineError(n, "%v", err)
	}
	return out, nil
}

// single expands the one argument of WORKDIR or USER.
func (d *dockerfile) single(n *parser.Node) (string, error) {
	if len(n.Flags) > 0 {
		return "", lineError(n, "%s %s is not supported", strings.ToUpper(n.Value), n.Flags[0])
	}
	if n.Next == nil || strings.TrimSpace(n.Next.Value) == "" {
		return "", lineError(n, "%s needs an argument", strings.ToUpper(n.Value))
	}
	v, err := d.expand(n, n.Next.Value, d.vars())
	if err != nil {
		return "", err
	}
	if v == "" {
		return "", lineError(n, "%s %s is empty after substitution", strings.ToUpper(n.Value), n.Next.Value)
	}
	return v, nil
}

func (d *dockerfile) arg(n *parser.Node) error {
	if n.Next == nil {
		return lineError(n, "ARG needs a name")
	}
	for x := n.Next; x != nil; x = x.Next {
		name, def, hasDef := strings.Cut(x.Value, "=")
		if !envName.MatchString(name) {
			return lineError(n, "ARG name %q is not valid", name)
		}
		value, ok := d.buildArgs[name]
		if ok {
			d.usedArgs[name] = true
		} else if hasDef {
			v, err := d.expand(n, def, d.vars())
			if err != nil {
				return err
			}
			value, ok = v, true
		} else if d.sawFrom {
			value, ok = d.metaArgs[name]
		}
		if strings.ContainsRune(value, 0) {
			return lineError(n, "ARG %s contains a NUL byte", name)
		}
		scope := d.metaArgs
		if d.sawFrom {
			if d.args == nil {
				d.args = map[string]string{}
			}
			scope = d.args
		}
		if ok {
			scope[name] = value
		} else {
			delete(scope, name)
		}
	}
	return nil
}

func (d *dockerfile) fromInstr(n *parser.Node) error {
	if d.sawFrom {
		return lineError(n, "a second FROM: multi-stage builds are not supported")
	}
	if len(n.Flags) > 0 {
		return lineError(n, "FROM %s is not supported", n.Flags[0])
	}
	var words []string
	for x := n.Next; x != nil; x = x.Next {
		words = append(words, x.Value)
	}
	if len(words) != 1 && (len(words) != 3 || !strings.EqualFold(words[1], "as")) {
		return lineError(n, "FROM takes an image and optionally AS and a name")
	}
	from, err := d.expand(n, words[0], d.metaArgs)
	if err != nil {
		return err
	}
	switch {
	case from == "":
		return lineError(n, "FROM %s is empty after substitution", words[0])
	case strings.EqualFold(from, "scratch"):
		return lineError(n, "FROM scratch is not supported: start from a template or an image")
	}
	if err := validateFrom(from); err != nil {
		return fmt.Errorf("dockerfile line %d: %w", n.StartLine, err)
	}
	d.sawFrom, d.from = true, from
	return nil
}

func (d *dockerfile) run(n *parser.Node) error {
	if len(n.Flags) > 0 {
		return lineError(n, "RUN %s is not supported", flagName(n.Flags[0]))
	}
	var words []string
	for x := n.Next; x != nil; x = x.Next {
		words = append(words, x.Value)
	}
	cmd := strings.Join(words, " ")
	if n.Attributes["json"] {
		cmd = ShellJoin(words)
	}
	if strings.TrimSpace(cmd) == "" {
		return lineError(n, "RUN needs a command")
	}
	return d.add(n, Step{Run: cmd, Args: d.runArgs()})
}

// runArgs returns the ARG values a RUN sees: those in scope that no ENV
// hides, and the proxy build args, which need no ARG.
func (d *dockerfile) runArgs() map[string]string {
	args := map[string]string{}
	for k, v := range d.args {
		if _, hidden := d.env[k]; !hidden {
			args[k] = v
		}
	}
	for _, k := range proxyArgs {
		if v, ok := d.buildArgs[k]; ok {
			d.usedArgs[k] = true
			if _, declared := args[k]; !declared {
				args[k] = v
			}
		}
	}
	if len(args) == 0 {
		return nil
	}
	return args
}

func (d *dockerfile) envInstr(n *parser.Node) error {
	if n.Next == nil {
		return lineError(n, "ENV needs a name and a value")
	}
	vars := d.vars()
	set := map[string]string{}
	// The parser gives ENV as triples: name, value, and "=" or "".
	for x := n.Next; x != nil; {
		if x.Next == nil {
			return lineError(n, "ENV %s has no value", x.Value)
		}
		k, err := d.expand(n, x.Value, vars)
		if err != nil {
			return err
		}
		v, err := d.expand(n, x.Next.Value, vars)
		if err != nil {
			return err
		}
		set[k] = v
		x = x.Next.Next
		if x != nil {
			x = x.Next
		}
	}
	if err := d.add(n, Step{Env: set}); err != nil {
		return err
	}
	if d.env == nil {
		d.env = map[string]string{}
	}
	maps.Copy(d.env, set)
	return nil
}

func (d *dockerfile) copyInstr(n *parser.Node, instr string) error {
	var chown string
	for _, f := range n.Flags {
		name, value, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch name {
		case "from":
			return lineError(n, "%s --from: multi-stage builds are not supported", instr)
		case "chown":
			v, err := d.expand(n, value, d.vars())
			if err != nil {
				return err
			}
			chown = v
		case "link":
		default:
			return lineError(n, "%s --%s is not supported", instr, name)
		}
	}
	var args []string
	for x := n.Next; x != nil; x = x.Next {
		v, err := d.expand(n, x.Value, d.vars())
		if err != nil {
			return err
		}
		args = append(args, v)
	}
	if len(args) < 2 {
		return lineError(n, "%s needs a source and a destination", instr)
	}
	srcs, dest := args[:len(args)-1], args[len(args)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return lineError(n, "%s of several sources needs a destination directory ending in /", instr)
	}
	for _, src := range srcs {
		if instr == "ADD" {
			if err := checkAddSource(n, src); err != nil {
				return err
			}
		}
		if err := d.add(n, Step{Copy: &Copy{Src: src, Dest: dest, Chown: chown}}); err != nil {
			return err
		}
	}
	return nil
}

func checkAddSource(n *parser.Node, src string) error {
	lower := strings.ToLower(src)
	switch {
	case strings.HasPrefix(lower, "git@") || strings.HasSuffix(lower, ".git") && strings.Contains(lower, "://"):
		return lineError(n, "ADD of a git repository (%s) is not supported", src)
	case strings.Contains(lower, "://"):
		return lineError(n, "ADD of a URL (%s) is not supported: download it in a RUN step", src)
	}
	for _, ext := range archiveExts {
		if strings.HasSuffix(lower, ext) {
			return lineError(n, "ADD of the archive %s is not supported: it is not unpacked here; COPY it and unpack it in a RUN step", src)
		}
	}
	return nil
}

// flagName returns "--name" of "--name=value".
func flagName(f string) string {
	name, _, _ := strings.Cut(f, "=")
	return name
}

// startCmd combines ENTRYPOINT and CMD into one shell command, as Docker
// combines them into one argv: the ENTRYPOINT words followed by the CMD
// words, a shell form being /bin/sh -c and its text. A shell form
// ENTRYPOINT takes no arguments, so CMD is then dropped.
func (d *dockerfile) startCmd() string {
	e, c := d.entry, d.cmd
	if e != nil && !e.exec {
		if c != nil {
			d.warnings = append(d.warnings, "CMD is ignored: a shell form ENTRYPOINT takes no arguments")
		}
		return e.text
	}
	var argv []string
	if e != nil {
		argv = append(argv, e.words...)
	}
	if c != nil {
		if c.exec {
			argv = append(argv, c.words...)
		} else {
			argv = append(argv, "/bin/sh", "-c", c.text)
		}
	}
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return argv[2]
	}
	return ShellJoin(argv)
}

// shellWords are the reserved words of sh, which would not be taken for a
// command's name unquoted.
var shellWords = map[string]bool{
	"if": true, "then": true, "else": true, "elif": true, "fi": true,
	"case": true, "esac": true, "for": true, "while": true, "until": true,
	"do": true, "done": true, "in": true, "function": true, "select": true,
	"time": true, "{": true, "}": true, "!": true, "[[": true, "]]": true,
}

// quoteWords joins words into a shell command that runs them as one argv.
func ShellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}

// shellQuote returns s as one shell word: as is when it is made of
// characters the shell gives no meaning to, otherwise in single quotes.
func shellQuote(s string) string {
	plain := s != "" && !shellWords[s] && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./:,+@%", r))
	}) < 0
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// envGetter gives a map to the shell lexer.
type envGetter map[string]string

func (e envGetter) Get(k string) (string, bool) {
	v, ok := e[k]
	return v, ok
}

func (e envGetter) Keys() []string { return slices.Sorted(maps.Keys(e)) }
