package cli

import (
	"errors"
	"io"
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestParseExec(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		sbx     string
		argv    []string
		tty     bool
		stdin   bool
		env     map[string]string
		cwd     string
		user    string
		timeout int
	}{
		{name: "with --", args: []string{"sbx1", "--", "ls", "-l"}, sbx: "sbx1", argv: []string{"ls", "-l"}},
		{name: "without --", args: []string{"sbx1", "ls", "-l"}, sbx: "sbx1", argv: []string{"ls", "-l"}},
		{name: "-- before the sandbox", args: []string{"--", "sbx1", "ls"}, sbx: "sbx1", argv: []string{"ls"}},
		{name: "combined -it", args: []string{"-it", "sbx1", "bash"}, sbx: "sbx1", argv: []string{"bash"}, tty: true, stdin: true},
		{name: "the command's -it stays its own", args: []string{"sbx1", "grep", "-it", "x"}, sbx: "sbx1", argv: []string{"grep", "-it", "x"}},
		{name: "-it after a flag with a value", args: []string{"-w", "/tmp", "-ti", "sbx1", "sh"}, sbx: "sbx1", argv: []string{"sh"}, tty: true, stdin: true, cwd: "/tmp"},
		{
			name: "all flags",
			args: []string{"-i", "-e", "A=1", "-e", "B=2", "-u", "nobody", "--timeout", "5m", "sbx1", "--", "sh", "-c", "echo $A"},
			sbx:  "sbx1", argv: []string{"sh", "-c", "echo $A"}, stdin: true,
			env: map[string]string{"A": "1", "B": "2"}, user: "nobody", timeout: 300,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseExec(&Env{Stderr: io.Discard}, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			r := o.req
			if o.sandbox != tc.sbx || !slices.Equal(r.Argv, tc.argv) || o.tty != tc.tty || r.Stdin != tc.stdin ||
				!maps.Equal(r.Env, tc.env) || r.Cwd != tc.cwd || r.User != tc.user || r.TimeoutS != tc.timeout {
				t.Fatalf("got sandbox %q tty %v %+v", o.sandbox, o.tty, r)
			}
		})
	}
}

func TestParseExecErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"nothing":          nil,
		"no command":       {"sbx1"},
		"no command after": {"sbx1", "--"},
		"unknown flag":     {"-x", "sbx1", "ls"},
		"bad env":          {"-e", "NOVALUE", "sbx1", "ls"},
		"bad timeout":      {"--timeout", "soon", "sbx1", "ls"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseExec(&Env{Stderr: io.Discard}, args)
			if !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 {
				t.Fatalf("got %v", err)
			}
		})
	}
}

func TestExecStreamsOutput(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	stdout, stderr, err := f.run(t, "", "exec", "sbx1", "--", "echo", "hi")
	if err != nil {
		t.Fatal(err)
	}
	if stdout != "echo hi\n" || stderr != "warning\n" {
		t.Fatalf("stdout %q stderr %q", stdout, stderr)
	}
	if c := f.command("cmd1"); c.req.Stdin || c.req.PTY != nil {
		t.Fatalf("without -i and -t: %+v", c.req)
	}
}

func TestExecExitCode(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	_, _, err := f.run(t, "", "exec", "sbx1", "exit", "3")
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 || ee.Err != nil {
		t.Fatalf("got %v, want the command's status 3 with nothing to print", err)
	}
}

func TestExecStdin(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	stdout, _, err := f.run(t, "hello\nworld\n", "exec", "-i", "sbx1", "cat")
	if err != nil || stdout != "hello\nworld\n" {
		t.Fatalf("stdout %q: %v", stdout, err)
	}
}

func TestExecForwardsSignals(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	go func() {
		// Once the command runs, airlock handles the signal and passes it on.
		for {
			if c := f.command("cmd1"); c != nil {
				f.mu.Lock()
				started := c.started
				f.mu.Unlock()
				if started {
					syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
					return
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	_, _, err := f.run(t, "", "exec", "sbx1", "wait-signal")
	if ExitCode(err) != 130 {
		t.Fatalf("got %v, want exit 130", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.commands["cmd1"].signals; !slices.Equal(got, []string{"TERM"}) {
		t.Fatalf("signals %q", got)
	}
}

func TestExecConflict(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	f.mu.Lock()
	f.sandboxes["sbx1"].State = "deleted"
	f.mu.Unlock()
	_, _, err := f.run(t, "", "exec", "sbx1", "ls")
	if ExitCode(err) != 2 || Message(err) != "sandbox sbx1 is deleted" {
		t.Fatalf("exit %d: %v", ExitCode(err), err)
	}
}

func TestShell(t *testing.T) {
	f := newFakeServer(t)
	f.addSandbox("sbx1", time.Now())
	t.Setenv("TERM", "xterm-test")
	stdout, _, err := f.run(t, "", "shell", "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	if stdout != shellCmd+"\n" {
		t.Fatalf("stdout %q", stdout)
	}
	r := f.command("cmd1").req
	if r.Cmd != shellCmd || len(r.Argv) != 0 || !r.Stdin || r.PTY == nil || r.PTY.Rows == 0 || r.Env["TERM"] != "xterm-test" {
		t.Fatalf("request %+v", r)
	}
}
