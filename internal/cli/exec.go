package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const execAbout = `Runs CMD in a running sandbox of the airlock server, with its output on
this terminal's stdout and stderr. Exits with CMD's exit status (128+N when
signal N ended it). Signals sent to airlock (INT, TERM, HUP, QUIT) are passed
on to CMD. Flags go before SBX; everything after SBX is the command.

  airlock exec sbx7k2m9q4w8e1r5t3y6u -- python3 -c 'print(1)'
  airlock exec sbx7k2m9q4w8e1r5t3y6u ls -l /
  echo hi | airlock exec -i sbx7k2m9q4w8e1r5t3y6u -- wc -c
  airlock exec -it sbx7k2m9q4w8e1r5t3y6u -- bash`

func runExec(ctx context.Context, env *Env, args []string) error {
	o, err := parseExec(env, args)
	if err != nil {
		return err
	}
	c, err := o.server.client(env)
	if err != nil {
		return err
	}
	return runSession(ctx, env, c, o.sandbox, o.req, o.tty)
}

// execOptions is an exec command line, parsed.
type execOptions struct {
	server  *serverFlags
	sandbox string
	req     apiv1.CommandRequest
	tty     bool
}

func parseExec(env *Env, args []string) (execOptions, error) {
	fs := newFlagSet("exec", "airlock exec [FLAGS] SBX [--] CMD [ARGS...]", execAbout, env)
	o := execOptions{server: addServerFlags(fs)}
	interactive := fs.Bool("i", false, "pass stdin to CMD")
	tty := fs.Bool("t", false, "run CMD in a terminal (a pty); this terminal goes into raw mode")
	vars := envFlags{}
	fs.Var(vars, "e", "set an environment variable `KEY=VALUE` (repeatable)")
	workdir := fs.String("w", "", "working `dir`ectory inside the sandbox")
	user := fs.String("u", "", "`user` to run as (default root)")
	var timeout secondsFlag
	fs.Var(&timeout, "timeout", "kill CMD after this many `seconds` (or a duration: 5m; default: no limit)")
	if err := parse(fs, expandLeadingShortFlags(fs.FlagSet, args, "it")); err != nil {
		return o, err
	}
	sbx, argv, err := execArgs(fs.Args())
	if err != nil {
		return o, err
	}
	o.sandbox, o.tty = sbx, *tty
	o.req = apiv1.CommandRequest{Argv: argv, Cwd: *workdir, User: *user, Stdin: *interactive, TimeoutS: timeout.n}
	if len(vars) > 0 {
		o.req.Env = vars
	}
	return o, nil
}

// execArgs splits what follows exec's flags into the sandbox and the
// command, with or without a "--" between them.
func execArgs(rest []string) (sbx string, argv []string, err error) {
	if len(rest) == 0 {
		return "", nil, fmt.Errorf("exec: give a sandbox ID and a command, e.g. `airlock exec sbx… -- ls -l`: %w", errdefs.ErrInvalid)
	}
	sbx, argv = rest[0], rest[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return "", nil, fmt.Errorf("exec: give a command to run after the sandbox ID, e.g. `airlock exec %s -- ls -l`: %w", sbx, errdefs.ErrInvalid)
	}
	return sbx, argv, nil
}

// expandLeadingShortFlags is expandShortFlags for the flags before the
// first positional argument only: "-it" in the command that follows is the
// command's own.
func expandLeadingShortFlags(fs *flag.FlagSet, args []string, bools string) []string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			return append(expandShortFlags(args[:i], bools), args[i:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) {
			i++ // its value
		}
	}
	return expandShortFlags(args, bools)
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

const shellAbout = `Opens an interactive login shell in a running sandbox of the airlock
server: bash if the sandbox has it, else sh. Exits with the shell's status.

  airlock shell sbx7k2m9q4w8e1r5t3y6u
  airlock shell -u nobody -w /tmp sbx7k2m9q4w8e1r5t3y6u`

// shellCmd starts the best login shell there is.
const shellCmd = `if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi`

func runShell(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("shell", "airlock shell [FLAGS] SBX", shellAbout, env)
	sf := addServerFlags(fs)
	vars := envFlags{}
	fs.Var(vars, "e", "set an environment variable `KEY=VALUE` (repeatable)")
	workdir := fs.String("w", "", "working `dir`ectory inside the sandbox")
	user := fs.String("u", "", "`user` to run as (default root)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("shell: give one sandbox ID, e.g. `airlock shell sbx…`: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	req := apiv1.CommandRequest{Cmd: shellCmd, Cwd: *workdir, User: *user, Stdin: true}
	if len(vars) > 0 {
		req.Env = vars
	}
	return runSession(ctx, env, c, pos[0], req, true)
}

// runSession runs req in sandbox sbx with this process's stdio: stdin
// when req.Stdin, a pty the size of this terminal when tty, signals passed
// on. It returns the command's exit status as an *ExitError (nil for 0).
func runSession(ctx context.Context, env *Env, c *apiclient.Client, sbx string, req apiv1.CommandRequest, tty bool) error {
	stdinFD := -1
	if env.Stdin != nil {
		stdinFD = int(env.Stdin.Fd())
	}
	onTerminal := stdinFD >= 0 && term.IsTerminal(stdinFD)
	if tty {
		rows, cols := 24, 80
		if onTerminal {
			if w, h, err := term.GetSize(stdinFD); err == nil {
				rows, cols = h, w
			}
		}
		req.PTY = &apiv1.PTY{Rows: uint16(rows), Cols: uint16(cols)}
		if t := os.Getenv("TERM"); t != "" && req.Env["TERM"] == "" {
			if req.Env == nil {
				req.Env = map[string]string{}
			}
			req.Env["TERM"] = t
		}
	}
	sess, err := c.CreateCommand(ctx, sbx, req)
	if err != nil {
		return err
	}

	// Resizes go to the pty, the rest to the process. In raw mode ^C
	// reaches the pty as a byte; a signal still comes from kill(1).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGWINCH)
	defer signal.Stop(sigs)
	if tty && onTerminal {
		state, err := term.MakeRaw(stdinFD)
		if err != nil {
			return fmt.Errorf("exec: put the terminal in raw mode: %w", err)
		}
		defer term.Restore(stdinFD, state)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { forwardSignals(ctx, c, sess.ID, sigs, stop, tty && onTerminal, stdinFD) })
	defer func() { close(stop); wg.Wait() }()

	var stdin io.Reader
	if req.Stdin && env.Stdin != nil {
		stdin = env.Stdin
	}
	exit, err := c.StreamCommand(ctx, sess.ID, stdin, env.Stdout, env.Stderr)
	if err != nil {
		return err
	}
	if exit.TimedOut {
		fmt.Fprintf(env.Stderr, "airlock: the command timed out after %d s and was killed\n", req.TimeoutS)
	}
	if exit.ExitCode != 0 {
		return &ExitError{Code: exit.ExitCode}
	}
	return nil
}

// forwardSignals passes the signals that arrive on sigs to the command
// until stop is closed: window changes as resizes (when resize), the rest
// by name.
func forwardSignals(ctx context.Context, c *apiclient.Client, cmdID string, sigs <-chan os.Signal, stop <-chan struct{}, resize bool, fd int) {
	for {
		var s os.Signal
		select {
		case <-stop:
			return
		case s = <-sigs:
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		switch {
		case s != syscall.SIGWINCH:
			// A command that has already ended answers conflict: nothing to do.
			_ = c.Signal(sctx, cmdID, unixSignalName(s))
		case resize:
			if w, h, err := term.GetSize(fd); err == nil {
				_ = c.Resize(sctx, cmdID, uint16(h), uint16(w))
			}
		}
		cancel()
	}
}
