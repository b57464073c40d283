package sessions

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// AttachTTL is how long an attach token is valid.
const AttachTTL = 10 * time.Minute

// toExec checks a command request and turns it into the agent's.
func toExec(req apiv1.CommandRequest) (agentproto.ExecRequest, error) {
	if req.TimeoutS < 0 || req.TimeoutS > 7*24*3600 {
		return agentproto.ExecRequest{}, fmt.Errorf("timeout_s %d is out of bounds: use 0 (none) to %d: %w", req.TimeoutS, 7*24*3600, errdefs.ErrInvalid)
	}
	if err := fields.Map("env", req.Env, fields.EnvKey); err != nil {
		return agentproto.ExecRequest{}, err
	}
	if req.PTY != nil && (req.PTY.Rows == 0 || req.PTY.Cols == 0) {
		return agentproto.ExecRequest{}, fmt.Errorf("pty needs positive rows and cols: %w", errdefs.ErrInvalid)
	}
	x := agentproto.ExecRequest{Argv: req.Argv, Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Stdin: req.Stdin, TimeoutMS: int64(req.TimeoutS) * 1000}
	if req.PTY != nil {
		x.PTY = &agentproto.PTY{Rows: req.PTY.Rows, Cols: req.PTY.Cols}
	}
	if err := x.Validate(); err != nil {
		return x, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	return x, nil
}

// CreateCommand records a command session; the first attach starts it.
func (c *Commands) CreateCommand(ctx context.Context, p tenancy.Principal, sbxID string, req apiv1.CommandRequest) (apiv1.CommandSession, error) {
	if _, err := toExec(req); err != nil {
		return apiv1.CommandSession{}, err
	}
	// The ID names the command's directory: refuse one that is not an ID
	// whatever the sandboxes answer.
	if err := fields.ID("sandbox", "sbx", sbxID); err != nil {
		return apiv1.CommandSession{}, err
	}
	release, err := c.use(ctx, p, sbxID)
	if err != nil {
		return apiv1.CommandSession{}, err
	}
	defer release()
	if err := c.sb.Running(ctx, p, sbxID); err != nil {
		return apiv1.CommandSession{}, err
	}
	raw, _ := json.Marshal(req)
	now := c.now()
	id := ids.New("cmd")
	secret := ids.Secret()
	rec := store.Command{
		ID: id, SandboxID: sbxID, Owner: p.KeyID, Request: raw, State: apiv1.CommandCreated,
		TokenHash: ids.SecretHash(secret), TokenExpiresAt: now.Add(AttachTTL), CreatedAt: now,
	}
	if err := c.st.InsertCommand(ctx, rec); err != nil {
		return apiv1.CommandSession{}, fmt.Errorf("record command: %w", err)
	}
	return apiv1.CommandSession{
		ID: id, SandboxID: sbxID, State: rec.State,
		Attach: apiv1.Attach{URL: "/v1/commands/" + id + "/attach", Token: "act_" + id[3:] + "_" + secret, ExpiresAt: rec.TokenExpiresAt},
	}, nil
}

// getCommand returns a command p may see.
func (c *Commands) getCommand(ctx context.Context, p tenancy.Principal, id string) (store.Command, error) {
	if err := fields.ID("command", "cmd", id); err != nil {
		return store.Command{}, err
	}
	rec, err := c.st.GetCommand(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.Owns(rec.Owner) {
		return rec, fmt.Errorf("command %s not found: %w", id, errdefs.ErrNotFound)
	}
	return rec, err
}

// GetCommand returns a command's state.
func (c *Commands) GetCommand(ctx context.Context, p tenancy.Principal, id string) (apiv1.Command, error) {
	rec, err := c.getCommand(ctx, p, id)
	if err != nil {
		return apiv1.Command{}, err
	}
	return commandView(rec), nil
}

func commandView(c store.Command) apiv1.Command {
	v := apiv1.Command{ID: c.ID, SandboxID: c.SandboxID, State: c.State, ExitCode: c.ExitCode, Signal: c.Signal,
		TimedOut: c.TimedOut, StartedAt: c.StartedAt, FinishedAt: c.FinishedAt}
	if c.PID > 0 {
		pid := c.PID
		v.PID = &pid
	}
	return v
}

// ListCommands lists a sandbox's commands.
func (c *Commands) ListCommands(ctx context.Context, p tenancy.Principal, sbxID, pageToken string, limit int) (apiv1.List[apiv1.Command], error) {
	var out apiv1.List[apiv1.Command]
	n, err := fields.Limit(limit)
	if err != nil {
		return out, err
	}
	if _, err := c.sb.Owned(ctx, p, sbxID); err != nil {
		return out, err
	}
	after := ""
	if pageToken != "" {
		if after, err = fields.After(pageToken, "cmd"); err != nil {
			return out, err
		}
	}
	rows, err := c.st.ListCommands(ctx, sbxID, after, n+1)
	if err != nil {
		return out, err
	}
	out.Items = []apiv1.Command{}
	for i, rec := range rows {
		if i == n {
			out.NextPageToken = fields.PageToken(rows[i-1].ID)
			break
		}
		out.Items = append(out.Items, commandView(rec))
	}
	return out, nil
}

// AttachAuth is how an attach request authenticated: an API key's
// principal, or a command's attach token.
type AttachAuth struct {
	Principal *tenancy.Principal
	Token     string
}

// checkToken verifies an attach token for command rec.
func checkToken(rec store.Command, token string, now time.Time) error {
	bad := fmt.Errorf("the attach token is not valid for command %s: use the token from the session or an API key: %w", rec.ID, errdefs.ErrUnauthenticated)
	rest, ok := strings.CutPrefix(token, "act_")
	idPart, secret, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || "cmd"+idPart != rec.ID {
		return bad
	}
	if subtle.ConstantTimeCompare(ids.SecretHash(secret), rec.TokenHash) != 1 {
		return bad
	}
	if rec.TokenSpent {
		return fmt.Errorf("the attach token of command %s is spent: its stream delivered the exit; attach with an API key: %w", rec.ID, errdefs.ErrUnauthenticated)
	}
	if now.After(rec.TokenExpiresAt) {
		return fmt.Errorf("the attach token of command %s expired at %s: attach with an API key: %w", rec.ID, rec.TokenExpiresAt.Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	return nil
}

// CommandIDFromToken returns the command an attach token is for, so that
// a request can be checked against its path.
func CommandIDFromToken(token string) (string, bool) {
	rest, ok := strings.CutPrefix(token, "act_")
	idPart, _, ok2 := strings.Cut(rest, "_")
	return "cmd" + idPart, ok && ok2
}

// Attach starts the command if this is its first attachment, and returns
// its events after the one numbered after.
func (c *Commands) Attach(ctx context.Context, auth AttachAuth, id string, after int64) (*command.Stream, error) {
	if auth.Principal == nil {
		// A token answers the same for a command that does not exist as
		// for one it is not valid for, so it cannot probe IDs.
		if tid, ok := CommandIDFromToken(auth.Token); !ok || tid != id {
			return nil, fmt.Errorf("the attach token is not valid for command %s: use the token from the session or an API key: %w", fields.Truncate(id, 40), errdefs.ErrUnauthenticated)
		}
	}
	if err := fields.ID("command", "cmd", id); err != nil {
		return nil, err
	}
	rec, err := c.st.GetCommand(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		if auth.Principal == nil {
			return nil, fmt.Errorf("the attach token is not valid for command %s: use the token from the session or an API key: %w", id, errdefs.ErrUnauthenticated)
		}
		return nil, fmt.Errorf("command %s not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if auth.Principal != nil {
		if !auth.Principal.Owns(rec.Owner) {
			return nil, fmt.Errorf("command %s not found: %w", id, errdefs.ErrNotFound)
		}
	} else if err := checkToken(rec, auth.Token, c.now()); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, fmt.Errorf("Last-Event-ID %d is negative: %w", after, errdefs.ErrInvalid)
	}
	if rec.State == apiv1.CommandCreated && after > 0 {
		return nil, fmt.Errorf("Last-Event-ID %d is past the last event: command %s has not started: %w", after, id, errdefs.ErrInvalid)
	}
	release, err := c.sb.Use(ctx, rec.SandboxID)
	if err != nil {
		return nil, err
	}
	handed := false
	defer func() {
		if !handed {
			release()
		}
	}()
	lifetime, ok := c.sb.Live(rec.SandboxID)
	if !ok {
		sb, err := c.st.GetSandbox(ctx, rec.SandboxID)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sandbox %s is %s: its commands cannot be attached: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	sess, err := c.open(rec, lifetime)
	if err != nil {
		return nil, err
	}
	if rec.State == apiv1.CommandCreated {
		if err := sess.StartOnce(func() error { return c.start(sess, rec) }); err != nil {
			return nil, err
		}
	}
	if last := sess.LastSeq(); after > last {
		return nil, fmt.Errorf("Last-Event-ID %d is past the last event (%d): %w", after, last, errdefs.ErrInvalid)
	}
	var onExit func()
	if auth.Principal == nil {
		onExit = func() { c.spendToken(id) }
	}
	c.m.attached()
	st := sess.Stream(after, onExit)
	st.OnClose(release) // an open stream uses the sandbox
	handed = true
	return st, nil
}

// use is Sandboxes.Use of sandbox sbx for p, once p may see it.
func (c *Commands) use(ctx context.Context, p tenancy.Principal, sbx string) (release func(), err error) {
	if _, err := c.sb.Owned(ctx, p, sbx); err != nil {
		return nil, err
	}
	return c.sb.Use(ctx, sbx)
}

func (c *Commands) spendToken(id string) {
	if err := c.st.SpendCommandToken(context.Background(), id); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		c.log.Warn("spend attach token", "command", id, "err", err)
	}
}

// open returns the command's open session, opening its log if needed.
// lifetime is its sandbox's on this server (Sandboxes.Live): once it has
// ended no log is opened, so that Close leaves none open.
func (c *Commands) open(rec store.Command, lifetime context.Context) (*command.Session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.boxes[rec.SandboxID]
	if sess, ok := b.lookup(rec.ID); ok {
		return sess, nil
	}
	if lifetime.Err() != nil {
		return nil, fmt.Errorf("sandbox %s is going away: %w", rec.SandboxID, errdefs.ErrConflict)
	}
	sess, err := command.Open(rec.ID, c.logPath(rec.SandboxID, rec.ID), rec.State == apiv1.CommandExited, c.cfg.Streamed)
	if err != nil {
		return nil, err
	}
	c.boxLocked(rec.SandboxID).cmds[rec.ID] = sess
	return sess, nil
}

// lookup returns the open session of command id; a nil sandbox has none.
func (b *sandboxSessions) lookup(id string) (*command.Session, bool) {
	if b == nil {
		return nil, false
	}
	sess, ok := b.cmds[id]
	return sess, ok
}

// follow counts a pump of sandbox sbx's, started by the caller, and
// holds the sandbox in use while its process runs: the pump calls
// release as it ends.
func (c *Commands) follow(sbx string) (*sandboxSessions, func()) {
	b := c.box(sbx)
	b.pumps.Add(1)
	c.m.following(1)
	return b, c.sb.Hold(sbx)
}

// start runs the command: its first attach.
func (c *Commands) start(sess *command.Session, rec store.Command) error {
	var req apiv1.CommandRequest
	if err := json.Unmarshal(rec.Request, &req); err != nil {
		return fmt.Errorf("command %s has an unreadable request: %w", rec.ID, err)
	}
	x, err := toExec(req)
	if err != nil {
		return err
	}
	ready := make(chan struct{})
	stdio := sess.Stdio(ready)
	now := c.now()
	box, vmCtx, err := c.sb.VM(rec.SandboxID)
	if err != nil {
		return err
	}
	proc, err := box.Exec(vmCtx, x, stdio)
	if err != nil {
		// The process never ran: say why on stderr and end it like a
		// shell would (127: not found, 126: could not run).
		code := 126
		if errors.Is(err, errdefs.ErrNotFound) {
			code = 127
		}
		close(ready)
		if err := sess.NotStarted(agentMessage(err)+"\n", code); err != nil {
			c.log.Error("log command's end", "command", rec.ID, "err", err)
		}
		rec.State, rec.ExitCode, rec.StartedAt, rec.FinishedAt = apiv1.CommandExited, &code, &now, &now
		if err := c.st.UpdateCommand(context.Background(), rec); err != nil {
			c.log.Error("record command exit", "command", rec.ID, "err", err)
		}
		c.m.commandEnded("exited")
		return nil
	}
	err = sess.Started(proc)
	close(ready)
	if err != nil {
		return err
	}
	rec.State, rec.AgentID, rec.PID, rec.StartedAt = apiv1.CommandRunning, proc.ID, proc.PID, &now
	if err := c.st.UpdateCommand(context.Background(), rec); err != nil {
		c.log.Error("record command start", "command", rec.ID, "err", err)
	}
	b, release := c.follow(rec.SandboxID)
	go c.waitCommand(b, release, sess, proc, rec, box, vmCtx)
	return nil
}

// agentMessage is an agent error's message without its class suffix.
func agentMessage(err error) string {
	var ae *agentclient.Error
	if errors.As(err, &ae) {
		return ae.Message
	}
	return err.Error()
}

// waitCommand, the pump of a command's process, waits for the process
// and logs its exit. It ends with the process, or when its VM's context
// ends: the sandbox was suspended (the wake re-attaches) or let go (the
// next server re-attaches).
func (c *Commands) waitCommand(b *sandboxSessions, release func(), sess *command.Session, proc *agentclient.Process, rec store.Command, box VM, vmCtx context.Context) {
	defer b.pumps.Done()
	defer c.m.following(-1)
	defer release()
	exit, err := box.Wait(proc)
	if vmCtx.Err() != nil {
		sess.Detach(proc)
		return
	}
	if err != nil {
		c.log.Warn("lost a command's output", "command", sess.ID(), "err", err)
		select {
		case <-box.Done():
			return // the VM went away: the service ends every command (Lost)
		case <-time.After(3 * time.Second):
		}
		c.endCommand(sess, rec, "the connection to the sandbox agent was lost")
		return
	}
	ev := apiv1.ExitEvent{ExitCode: exit.ExitCode, TimedOut: exit.TimedOut, DurationMS: exit.DurationMS}
	if exit.Signal != "" {
		sig := exit.Signal
		ev.Signal = &sig
	}
	if err := sess.Exited(ev); err != nil {
		c.log.Error("log command exit", "command", sess.ID(), "err", err)
	}
	now := c.now()
	if cur, err := c.st.GetCommand(context.Background(), sess.ID()); err == nil {
		rec = cur
	}
	rec.State, rec.ExitCode, rec.Signal, rec.TimedOut, rec.FinishedAt = apiv1.CommandExited, &ev.ExitCode, ev.Signal, ev.TimedOut, &now
	if err := c.st.UpdateCommand(context.Background(), rec); err != nil {
		c.log.Error("record command exit", "command", sess.ID(), "err", err)
	}
	c.m.commandEnded("exited")
}

// endCommand ends a command whose process can no longer be followed.
func (c *Commands) endCommand(sess *command.Session, rec store.Command, reason string) {
	if err := sess.End(reason); err != nil {
		c.log.Error("log command's end", "command", rec.ID, "err", err)
	}
	c.markEnded(rec.ID, false)
}

// markEnded records a command that ended without an exit status: code
// -1, or none for one rolled back.
func (c *Commands) markEnded(id string, rolledBack bool) {
	rec, err := c.st.GetCommand(context.Background(), id)
	if err != nil || rec.State == apiv1.CommandExited {
		return
	}
	now := c.now()
	code := -1
	rec.State, rec.ExitCode, rec.FinishedAt = apiv1.CommandExited, &code, &now
	if rolledBack {
		rec.ExitCode = nil
	}
	if rec.StartedAt == nil {
		rec.StartedAt = &now
	}
	if err := c.st.UpdateCommand(context.Background(), rec); err != nil {
		c.log.Error("record lost command", "command", id, "err", err)
	}
	if rolledBack {
		c.m.commandEnded("rolled_back")
	} else {
		c.m.commandEnded("lost")
	}
}

// End ends every unfinished command of sandbox sbx, which lost its VM or
// is gone: each is recorded as exited with code -1, and the log of one
// that ran gets "airlock: reason" on stderr and its exit, so that its
// readers end.
func (c *Commands) End(sbx, reason string) { c.end(sbx, reason, false) }

func (c *Commands) end(sbx, reason string, rolledBack bool) {
	for _, state := range []string{apiv1.CommandRunning, apiv1.CommandCreated} {
		rows, err := c.st.ListCommandsByState(context.Background(), state)
		if err != nil {
			c.log.Error("list commands", "err", err)
			return
		}
		for _, rec := range rows {
			if rec.SandboxID != sbx {
				continue
			}
			if state == apiv1.CommandRunning {
				// Readers of the log, if it is still there, end.
				if err := command.EndLog(c.logPath(rec.SandboxID, rec.ID), reason, rolledBack); err != nil {
					c.log.Error("log command's end", "command", rec.ID, "err", err)
				}
			}
			c.markEnded(rec.ID, rolledBack)
		}
	}
}

// Resume re-attaches to every command of sandbox sbx recorded as running,
// after the service gave the sandbox a VM again (a wake, an adoption
// after a server restart, a suspend that failed with the VM still
// running): output the agent kept since is logged and the streams go
// on. A command still attached is left alone.
func (c *Commands) Resume(sbx string) {
	rows, err := c.st.ListCommandsByState(context.Background(), apiv1.CommandRunning)
	if err != nil {
		c.log.Error("list running commands", "err", err)
		return
	}
	for _, rec := range rows {
		if rec.SandboxID == sbx {
			c.resume(rec)
		}
	}
}

// resume re-attaches to one running command.
func (c *Commands) resume(rec store.Command) {
	sess, err := c.openLive(rec)
	if err != nil {
		c.log.Warn("resume command", "command", rec.ID, "err", err)
		c.markEnded(rec.ID, false)
		return
	}
	ready := make(chan struct{})
	close(ready)
	cursor, attached := sess.Position()
	if attached {
		return
	}
	stdio := sess.Stdio(ready)
	box, vmCtx, err := c.sb.VM(rec.SandboxID)
	if err != nil {
		return
	}
	proc, err := box.Attach(vmCtx, rec.AgentID, cursor, stdio)
	if err != nil {
		c.log.Warn("re-attach command", "command", rec.ID, "err", err)
		c.endCommand(sess, rec, "the command's process was lost while the server was down")
		return
	}
	if err := sess.Reattach(proc); err != nil {
		c.log.Error("log command's lost output", "command", rec.ID, "err", err)
	}
	b, release := c.follow(rec.SandboxID)
	go c.waitCommand(b, release, sess, proc, rec, box, vmCtx)
}

// openLive opens the session of a command of a sandbox this server looks
// after.
func (c *Commands) openLive(rec store.Command) (*command.Session, error) {
	lifetime, ok := c.sb.Live(rec.SandboxID)
	if !ok {
		return nil, fmt.Errorf("sandbox %s is not looked after by this server: %w", rec.SandboxID, errdefs.ErrConflict)
	}
	return c.open(rec, lifetime)
}

// runningProcess returns the process of a running command p owns.
func (c *Commands) runningProcess(ctx context.Context, p tenancy.Principal, id string) (*agentclient.Process, store.Command, error) {
	rec, err := c.getCommand(ctx, p, id)
	if err != nil {
		return nil, rec, err
	}
	// A call on a command uses its sandbox, which it may wake.
	release, err := c.sb.Use(ctx, rec.SandboxID)
	if err != nil {
		return nil, rec, err
	}
	release()
	if rec.State != apiv1.CommandRunning {
		hint := ""
		if rec.State == apiv1.CommandCreated {
			hint = ": attach to it first, which starts it"
		}
		return nil, rec, fmt.Errorf("command %s is %s, not running%s: %w", id, rec.State, hint, errdefs.ErrConflict)
	}
	lifetime, live := c.sb.Live(rec.SandboxID)
	if sb, err := c.st.GetSandbox(ctx, rec.SandboxID); err == nil && sb.State != apiv1.StateRunning || !live {
		state := "not running"
		if err == nil {
			state = sb.State
		}
		return nil, rec, fmt.Errorf("command %s cannot be reached: its sandbox %s is %s: %w", id, rec.SandboxID, state, errdefs.ErrConflict)
	}
	sess, err := c.open(rec, lifetime)
	if err != nil {
		return nil, rec, err
	}
	proc := sess.Process()
	if proc == nil {
		return nil, rec, fmt.Errorf("command %s has exited: %w", id, errdefs.ErrConflict)
	}
	return proc, rec, nil
}

// Stdin copies r to the command's stdin; eof then closes it.
func (c *Commands) Stdin(ctx context.Context, p tenancy.Principal, id string, r io.Reader, eof bool) error {
	proc, rec, err := c.runningProcess(ctx, p, id)
	if err != nil {
		return err
	}
	var req apiv1.CommandRequest
	if err := json.Unmarshal(rec.Request, &req); err != nil {
		return fmt.Errorf("read the request of command %s: %w", id, err)
	}
	if !req.Stdin {
		return fmt.Errorf("command %s was created without stdin: create it with \"stdin\": true: %w", id, errdefs.ErrConflict)
	}
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := proc.WriteStdin(buf[:n]); err != nil {
				return fmt.Errorf("write stdin of %s: %w", id, errdefs.ErrConflict)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	if eof {
		if err := proc.CloseStdin(); err != nil {
			return fmt.Errorf("close stdin of %s: %w", id, errdefs.ErrConflict)
		}
	}
	return nil
}

// Signal sends a signal to the command's process group.
func (c *Commands) Signal(ctx context.Context, p tenancy.Principal, id, sig string) error {
	name := strings.ToUpper(strings.TrimPrefix(strings.ToUpper(sig), "SIG"))
	if name == "" || unix.SignalNum("SIG"+name) == 0 {
		return fmt.Errorf("signal %q is not a signal name such as TERM, KILL or INT: %w", fields.Truncate(sig, 20), errdefs.ErrInvalid)
	}
	proc, _, err := c.runningProcess(ctx, p, id)
	if err != nil {
		return err
	}
	return proc.Signal(ctx, name)
}

// Resize changes the terminal size of a command with a pty.
func (c *Commands) Resize(ctx context.Context, p tenancy.Principal, id string, rows, cols int) error {
	if rows < 1 || cols < 1 || rows > 10000 || cols > 10000 {
		return fmt.Errorf("rows and cols must be 1 to 10000: %w", errdefs.ErrInvalid)
	}
	proc, rec, err := c.runningProcess(ctx, p, id)
	if err != nil {
		return err
	}
	var req apiv1.CommandRequest
	if err := json.Unmarshal(rec.Request, &req); err != nil {
		return fmt.Errorf("read the request of command %s: %w", id, err)
	}
	if req.PTY == nil {
		return fmt.Errorf("command %s has no pty to resize: %w", id, errdefs.ErrInvalid)
	}
	return proc.Resize(ctx, uint16(rows), uint16(cols))
}
