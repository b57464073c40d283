package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// envFlags collects repeated -e K=V flags.
type envFlags map[string]string

func (e envFlags) String() string { return "" }

func (e envFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not KEY=VALUE", v)
	}
	e[k] = val
	return nil
}

const runAbout = `Boots a sandbox from a template, runs CMD in it with this terminal's
stdio attached, and removes the sandbox. Exits with CMD's exit status, or
128+N when signal N ended it. Signals sent to airlock (INT, TERM, HUP, QUIT)
are passed on to CMD.

  airlock run -- python3 -c 'print(1)'
  airlock run -it -- bash
  airlock run --template tiny -e GREETING=hi -- sh -c 'echo $GREETING'
  airlock run --net allow -- python3 -c 'import urllib.request as u; print(u.urlopen("https://example.com").status)'

The sandbox's network goes through a gateway in this process, with the
egress policy --net (default deny: DNS answers nothing, no connection
leaves). A sandbox kept with --keep loses its network when airlock run
exits; sandboxes of ` + "`airlock serve`" + ` keep theirs.`

func runRun(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("run", "airlock run [FLAGS] -- CMD [ARGS...]", runAbout, env)
	tpl := fs.String("template", "base", "template `ref`: name, name:tag or sha256:digest")
	vcpus := fs.Int("vcpus", 0, "virtual CPUs (default: the template's)")
	memory := fs.Int("memory", 0, "memory in `MiB` (default: the template's)")
	disk := fs.Int("disk", 0, "disk size in `MiB` (default: the template's)")
	vars := envFlags{}
	fs.Var(vars, "e", "set an environment variable `KEY=VALUE` (repeatable)")
	workdir := fs.String("w", "", "working `dir`ectory inside the sandbox")
	user := fs.String("u", "", "`user` to run as (name or uid[:gid]; default root)")
	interactive := fs.Bool("i", false, "attach stdin")
	tty := fs.Bool("t", false, "run CMD in a terminal (a pty)")
	keep := fs.Bool("keep", false, "leave the sandbox running afterwards and print its ID")
	timeout := fs.Duration("timeout", 0, "kill CMD after this `duration` (e.g. 30s; 0: no limit)")
	accel := fs.String("accel", "auto", "accelerator: kvm, tcg or auto")
	netPolicy := fs.String("net", "deny", netFlagHelp+"; credential rules are for the server")
	dnsUpstream := fs.String("dns-upstream", "", "resolver `HOST:PORT` the gateway asks (default: the host's)")
	jailOpts := addJailFlags(fs)
	if err := parse(fs, expandShortFlags(args, "it")); err != nil {
		return err
	}
	unjailed, uids, err := jailOpts.parse()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	rawNet, err := readNetworkPolicy(env, *netPolicy)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	pol, _ := policy.Parse(rawNet)
	if len(pol.Credentials) > 0 {
		return fmt.Errorf("run: %w: %w", errNoNet, errdefs.ErrInvalid)
	}
	pol = pol.Normalized()
	argv := fs.Args()
	if len(argv) == 0 {
		return fmt.Errorf("run: give a command to run after --, e.g. `airlock run -- echo hi`: %w", errdefs.ErrInvalid)
	}
	if *timeout < 0 {
		return fmt.Errorf("run: --timeout must not be negative: %w", errdefs.ErrInvalid)
	}
	req := agentproto.ExecRequest{Argv: argv, Cwd: *workdir, User: *user, Stdin: *interactive, TimeoutMS: timeout.Milliseconds()}
	stdinFD := int(env.Stdin.Fd())
	if *tty {
		rows, cols := 24, 80
		if c, r, err := term.GetSize(stdinFD); err == nil {
			rows, cols = r, c
		}
		req.PTY = &agentproto.PTY{Rows: uint16(rows), Cols: uint16(cols)}
	}
	if err := req.Validate(); err != nil {
		return fmt.Errorf("run: %v: %w", err, errdefs.ErrInvalid)
	}

	if unjailed {
		env.Log.Warn("the jail is off: QEMU runs unconfined, for debugging only")
	}
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: env.Dir, Accel: *accel, Log: env.Log, Unjailed: unjailed, UIDs: uids,
		Network: sandbox.NetworkConfig{DNSUpstream: *dnsUpstream}})
	if err != nil {
		return err
	}
	sb, err := rt.Create(ctx, sandbox.Spec{
		Template: *tpl, VCPUs: *vcpus, MemoryMiB: *memory, DiskMiB: *disk, Env: vars, Detach: *keep,
		Network: &pol,
	})
	if err != nil {
		return err
	}
	defer func() {
		if *keep {
			sb.Release()
			fmt.Fprintf(env.Stderr, "airlock: kept sandbox %s (VM pid %d, files in %s)\n", sb.ID, sb.Machine().PID(), sb.Dir)
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sb.Destroy(dctx); err != nil {
			fmt.Fprintf(env.Stderr, "airlock: %v\n", err)
		}
	}()

	// Signals: resizes go to the pty, the rest to the process.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGWINCH)
	defer signal.Stop(sigs)

	if *tty && term.IsTerminal(stdinFD) {
		state, err := term.MakeRaw(stdinFD)
		if err != nil {
			return fmt.Errorf("run: put the terminal in raw mode: %w", err)
		}
		defer term.Restore(stdinFD, state)
	}
	stdio := agentclient.Stdio{Stdout: env.Stdout, Stderr: env.Stderr}
	if *interactive {
		stdio.Stdin = env.Stdin
	}
	p, err := sb.Exec(ctx, req, stdio)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return &ExitError{Code: 127, Err: err}
		}
		return err
	}
	go func() {
		for s := range sigs {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if s == syscall.SIGWINCH {
				if c, r, err := term.GetSize(stdinFD); err == nil && req.PTY != nil {
					p.Resize(sctx, uint16(r), uint16(c))
				}
			} else {
				p.Signal(sctx, unixSignalName(s))
			}
			cancel()
		}
	}()
	exit, err := sb.Wait(p)
	if err != nil {
		return err
	}
	if exit.TimedOut {
		fmt.Fprintf(env.Stderr, "airlock: %s timed out after %s and was killed\n", argv[0], timeout)
	}
	return &ExitError{Code: exit.ExitCode}
}

func unixSignalName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "INT"
	case syscall.SIGTERM:
		return "TERM"
	case syscall.SIGHUP:
		return "HUP"
	case syscall.SIGQUIT:
		return "QUIT"
	}
	return s.String()
}
