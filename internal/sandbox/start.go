package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/template"
)

// defaultStartTimeout bounds how long a create waits for a template's
// start command to answer on its ready port.
const defaultStartTimeout = 60 * time.Second

// warmStartTimeout is the least a warm snapshot's template VM waits for
// its server: the first start of a server may do one-time work (the code
// interpreter's matplotlib builds its font cache) that a busy host under
// TCG stretches past a minute, and a snapshot is made once.
const warmStartTimeout = 3 * time.Minute

// startTimeout is how long a create waits for a template's server.
func (r *Runtime) startTimeout() time.Duration {
	if r.cfg.StartTimeout > 0 {
		return r.cfg.StartTimeout
	}
	return defaultStartTimeout
}

// startTemplate starts the template's StartCmd in the background of a
// freshly created sandbox, detached from the agent's exec (its own
// session, output to template.StartLog), then waits until an HTTP GET of
// ReadyPath on ReadyPort answers 200 through the sandbox's gateway. A
// server that does not come up within timeout is an error quoting the end
// of its log.
//
// It runs in the template VM of a warm snapshot (warm.go), and after the
// create of every sandbox that is not a clone of one: a booted sandbox,
// and a clone of the cold snapshot of a template that has no readiness
// check, or of a sandbox that startsWarm excludes. Those pay the
// server's start-up (for the code interpreter, a Jupyter kernel).
func (r *Runtime) startTemplate(ctx context.Context, sb *Sandbox, timeout time.Duration) error {
	tpl := sb.Template
	if tpl.StartCmd == "" && tpl.ReadyPort == 0 {
		return nil
	}
	start := time.Now()
	if tpl.StartCmd != "" {
		// The inner shell records how the command ended, so that a log
		// quoted in an error says whether it is still running.
		inner := tpl.StartCmd + "\necho \"airlock: start command exited with status $?\""
		cmd := fmt.Sprintf("mkdir -p /var/log && setsid /bin/sh -c %s >%s 2>&1 </dev/null &",
			shellQuote(inner), template.StartLog)
		var out bytes.Buffer
		exit, err := sb.run(ctx, cmd, &out)
		if err != nil {
			return fmt.Errorf("start %q: %w", tpl.StartCmd, err)
		}
		if exit.ExitCode != 0 {
			return fmt.Errorf("start %q: the shell exited with status %d: %s", tpl.StartCmd, exit.ExitCode, strings.TrimSpace(out.String()))
		}
	}
	if tpl.ReadyCmd != "" {
		if err := sb.waitReadyCmd(ctx, tpl.ReadyCmd, time.Until(start.Add(timeout))); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return fmt.Errorf("%w; %s ends with:\n%s", err, template.StartLog, sb.startLog(ctx))
		}
	}
	if tpl.ReadyPort == 0 {
		return nil
	}
	if err := sb.waitReady(ctx, uint16(tpl.ReadyPort), tpl.ReadyPath, timeout); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("%w; %s ends with:\n%s", err, template.StartLog, sb.startLog(ctx))
	}
	sb.log.Debug("template start command ready", "port", tpl.ReadyPort, "elapsed", time.Since(start))
	return nil
}

// run runs a shell command in the guest and waits for it.
func (s *Sandbox) run(ctx context.Context, cmd string, out io.Writer) (agentproto.Exit, error) {
	p, err := s.Exec(ctx, agentproto.ExecRequest{Cmd: cmd, TimeoutMS: 30_000}, agentclient.Stdio{Stdout: out, Stderr: out})
	if err != nil {
		return agentproto.Exit{}, err
	}
	return s.Wait(p)
}

// startLog returns the end of the start command's log in the guest.
func (s *Sandbox) startLog(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if _, err := s.run(ctx, "tail -n 30 "+template.StartLog, &out); err != nil {
		return fmt.Sprintf("(could not read it: %v)", err)
	}
	if out.Len() == 0 {
		return "(nothing)"
	}
	return strings.TrimRight(out.String(), "\n")
}

// waitReady polls GET path on the guest's port until it answers 200.
func (s *Sandbox) waitReady(ctx context.Context, port uint16, path string, timeout time.Duration) error {
	if path == "" {
		path = "/"
	}
	client := &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.DialGuest(ctx, port)
			},
			DisableKeepAlives: true,
		},
		Timeout: 5 * time.Second,
	}
	defer client.CloseIdleConnections()
	url := "http://" + net.JoinHostPort("guest", strconv.Itoa(int(port))) + path
	deadline := time.Now().Add(timeout)
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("it answered %s", resp.Status)
		}
		last = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the template's server did not answer GET %s on guest port %d within %s (last try: %v)",
				path, port, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// readyCmdPoll is how often a template's ready command is run while it
// fails, and readyCmdTimeout bounds one run.
const (
	readyCmdPoll    = 100 * time.Millisecond
	readyCmdTimeout = 10 * time.Second
)

// waitReadyCmd runs cmd in the guest until it exits 0, for at most
// timeout. The error of a command that never succeeds quotes its last
// output.
func (s *Sandbox) waitReadyCmd(ctx context.Context, cmd string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for tries := 1; ; tries++ {
		var out bytes.Buffer
		p, err := s.Exec(ctx, agentproto.ExecRequest{Cmd: cmd, TimeoutMS: readyCmdTimeout.Milliseconds()}, agentclient.Stdio{Stdout: &out, Stderr: &out})
		if err == nil {
			var exit agentproto.Exit
			if exit, err = s.Wait(p); err == nil {
				if exit.ExitCode == 0 {
					return nil
				}
				last = fmt.Sprintf("exit code %d: %s", exit.ExitCode, strings.TrimSpace(tailString(out.String(), 512)))
			}
		}
		if err != nil && ctx.Err() == nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ready command %q did not succeed in %s (%d tries; last: %s)", cmd, timeout.Round(time.Second), tries, last)
		case <-time.After(readyCmdPoll):
		}
	}
}

// tailString is the last n bytes of s.
func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
