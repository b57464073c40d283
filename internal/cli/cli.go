// Package cli implements the airlock command: its subcommands, their flags
// and help, and how their failures map to exit codes.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// ExitError asks main to exit with Code. A nil Err means the message was
// already printed (or there is none, as when passing on a command's code).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode picks the process exit status for an error returned by Run:
// 0 for nil, the command's own status for ExitError, and otherwise the
// exit status of err's class (errdefs.ClassOf): 2 for errors the user can
// fix (bad input, setup not run), 1 for the rest.
func ExitCode(err error) int {
	var ee *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.Code
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		return errdefs.ClassOf(err).ExitCode
	}
}

// Message is err as one line for a person: errdefs.Message, without the
// error class that ends a wrapped message (": invalid argument"), as the
// exit status already carries it.
func Message(err error) string {
	return errdefs.Message(err)
}

// Env is what a command runs with: its streams and the process-wide inputs
// main gathered.
type Env struct {
	Stdin  *os.File
	Stdout io.Writer
	Stderr io.Writer
	Log    *slog.Logger
	Dir    datadir.Dir
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *Env, args []string) error
}

func commands() []command {
	return []command{
		{"setup", "install what airlock needs and build the guest and templates", runSetup},
		{"serve", "serve the HTTP API (see docs/api.md)", runServe},
		{"node", "run this host as a node of an airlock cluster on Kubernetes (see docs/kubernetes.md)", runNode},
		{"cluster-certs", "make the CA and certificates an airlock cluster's servers and nodes talk TLS with", runClusterCerts},
		{"localcluster", "run a whole cluster on this machine, for trying cluster mode (make cluster)", runLocalCluster},
		{"run", "boot a sandbox, run one command in it, and remove it", runRun},
		{"bench", "measure boot, lifecycle, exec, throughput and the API against baselines", runBench},
		{"sandbox", "create, list, show, save and remove sandboxes on a server", runSandbox},
		{"checkpoint", "checkpoint sandboxes, list and remove checkpoints on a server", runCheckpoint},
		{"template", "build, list, show and remove templates on a server", runTemplate},
		{"exec", "run a command in a sandbox on a server", runExec},
		{"shell", "open an interactive shell in a sandbox on a server", runShell},
		{"cp", "copy files between this machine and a sandbox on a server", runCp},
		{"secret", "store, list and remove secrets for credential rules on a server", runSecret},
		{"op", "show or wait for an operation on a server", runOp},
		{"events", "print, or follow, the changes of state of sandboxes and builds on a server", runEvents},
		{"key", "create, list, limit and remove API keys on a server", runKey},
		{"network", "change a sandbox's egress policy and show its egress log on a server", runNetwork},
		{"port-forward", "forward a local TCP port to a port in a sandbox on a server", runPortForward},
		{"mcp", "serve sandboxes as the tools of an MCP server on stdio, for agents (see docs/mcp.md)", runMCP},
		{"version", "print the version", runVersion},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "airlock runs code in microVM sandboxes.\n\nUsage:\n  airlock COMMAND [FLAGS] [ARGS]\n\nCommands:\n")
	width := 0
	for _, c := range commands() {
		width = max(width, len(c.name))
	}
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-*s  %s\n", width, c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun `airlock COMMAND -h` for a command's flags.\n"+
		"Data lives in $AIRLOCK_HOME (default /var/lib/airlock as root, else ~/.local/share/airlock).\n")
}

// Run runs the airlock command line args (without the program name).
func Run(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 {
		usage(env.Stderr)
		return &ExitError{Code: 2, Err: errors.New("no command given")}
	}
	name := args[0]
	if name == "-h" || name == "--help" || name == "help" {
		usage(env.Stdout)
		return nil
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, env, args[1:])
		}
	}
	return fmt.Errorf("unknown command %q: run `airlock help` for the list: %w", name, errdefs.ErrInvalid)
}

// flagSet is a command's flags with its help text.
type flagSet struct {
	*flag.FlagSet
	help func()
}

// newFlagSet returns a flag set whose errors come back to the caller as
// one line, and whose help (-h) goes to the command's stderr.
func newFlagSet(name, synopsis, about string, env *Env) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors in one line
	fs.Usage = func() {}
	help := func() {
		fmt.Fprintf(env.Stderr, "Usage: %s\n\n%s\n\nFlags:\n", synopsis, about)
		fs.SetOutput(env.Stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return &flagSet{FlagSet: fs, help: help}
}

// parse parses flags; bad flags are the user's to fix.
func parse(fs *flagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.help()
			return err
		}
		return fmt.Errorf("%s: %v (see `airlock %s -h`): %w", fs.Name(), err, fs.Name(), errdefs.ErrInvalid)
	}
	return nil
}

// expandShortFlags turns "-it" into "-i -t" for the single-letter boolean
// flags named in bools, up to the first "--".
func expandShortFlags(args []string, bools string) []string {
	var out []string
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if letters, ok := strings.CutPrefix(a, "-"); ok && len(letters) > 1 && strings.Trim(letters, bools) == "" {
			for _, l := range letters {
				out = append(out, "-"+string(l))
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// removeEach calls remove for each name, printing the names removed. One
// name's error is the command's; of several, each failure is reported on
// stderr as "airlock: CMD NAME: reason" and the exit code is the worst.
func removeEach(env *Env, cmd string, names []string, remove func(string) error) error {
	errs := make([]error, len(names))
	for i, name := range names {
		if errs[i] = remove(name); errs[i] == nil {
			fmt.Fprintln(env.Stdout, name)
		}
	}
	if len(names) == 1 {
		return errs[0]
	}
	code := 0
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(env.Stderr, "airlock: %s %s: %s\n", cmd, names[i], Message(err))
			code = max(code, ExitCode(err))
		}
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

// isSet reports whether the flag called name was given.
func (fs *flagSet) isSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
