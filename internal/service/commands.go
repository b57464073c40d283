package service

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/store"
)

// AttachTTL is how long an attach token is valid.
const AttachTTL = 10 * time.Minute

// execOutputCap bounds each of stdout and stderr in an exec answer.
const execOutputCap = 16 << 20

func (s *Service) commandLogPath(sbx, id string) string {
	return filepath.Join(s.sandboxDir(sbx), "commands", id+".log")
}

// toExec checks a command request and turns it into the agent's.
func toExec(req apiv1.CommandRequest) (agentproto.ExecRequest, error) {
	if req.TimeoutS < 0 || req.TimeoutS > 7*24*3600 {
		return agentproto.ExecRequest{}, fmt.Errorf("timeout_s %d is out of bounds: use 0 (none) to %d: %w", req.TimeoutS, 7*24*3600, errdefs.ErrInvalid)
	}
	if err := checkMap("env", req.Env, envKeyOK); err != nil {
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

// runningSandbox returns the held sandbox p owns, or an error naming its
// state when it has no running VM.
func (s *Service) runningSandbox(ctx context.Context, p Principal, id string) (*live, store.Sandbox, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return nil, sb, err
	}
	lv := s.getLive(id)
	if sb.State != apiv1.StateRunning || lv == nil || !lv.hasVM() {
		return nil, sb, fmt.Errorf("sandbox %s is %s, not running: %w", id, sb.State, errdefs.ErrConflict)
	}
	return lv, sb, nil
}

// CreateCommand records a command session; the first attach starts it.
func (s *Service) CreateCommand(ctx context.Context, p Principal, sbxID string, req apiv1.CommandRequest) (apiv1.CommandSession, error) {
	if _, err := toExec(req); err != nil {
		return apiv1.CommandSession{}, err
	}
	if _, _, err := s.runningSandbox(ctx, p, sbxID); err != nil {
		return apiv1.CommandSession{}, err
	}
	raw, _ := json.Marshal(req)
	now := s.now()
	id := ids.New("cmd")
	secret := ids.Secret()
	rec := store.Command{
		ID: id, SandboxID: sbxID, Owner: p.KeyID, Request: raw, State: apiv1.CommandCreated,
		TokenHash: hashSecret(secret), TokenExpiresAt: now.Add(AttachTTL), CreatedAt: now,
	}
	if err := s.st.InsertCommand(ctx, rec); err != nil {
		return apiv1.CommandSession{}, fmt.Errorf("record command: %w", err)
	}
	return apiv1.CommandSession{
		ID: id, SandboxID: sbxID, State: rec.State,
		Attach: apiv1.Attach{URL: "/v1/commands/" + id + "/attach", Token: "act_" + id[3:] + "_" + secret, ExpiresAt: rec.TokenExpiresAt},
	}, nil
}

func hashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// getCommand returns a command p may see.
func (s *Service) getCommand(ctx context.Context, p Principal, id string) (store.Command, error) {
	if err := checkID("command", "cmd", id); err != nil {
		return store.Command{}, err
	}
	c, err := s.st.GetCommand(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.owns(c.Owner) {
		return c, fmt.Errorf("command %s not found: %w", id, errdefs.ErrNotFound)
	}
	return c, err
}

// GetCommand returns a command's state.
func (s *Service) GetCommand(ctx context.Context, p Principal, id string) (apiv1.Command, error) {
	c, err := s.getCommand(ctx, p, id)
	if err != nil {
		return apiv1.Command{}, err
	}
	return commandView(c), nil
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
func (s *Service) ListCommands(ctx context.Context, p Principal, sbxID, pageToken string, limit int) (apiv1.List[apiv1.Command], error) {
	var out apiv1.List[apiv1.Command]
	n, err := checkLimit(limit)
	if err != nil {
		return out, err
	}
	if _, err := s.getOwned(ctx, p, sbxID); err != nil {
		return out, err
	}
	after := ""
	if pageToken != "" {
		if after, err = decodePageToken(pageToken, "cmd"); err != nil {
			return out, err
		}
	}
	rows, err := s.st.ListCommands(ctx, sbxID, after, n+1)
	if err != nil {
		return out, err
	}
	out.Items = []apiv1.Command{}
	for i, c := range rows {
		if i == n {
			out.NextPageToken = encodePageToken(rows[i-1].ID)
			break
		}
		out.Items = append(out.Items, commandView(c))
	}
	return out, nil
}

// AttachAuth is how an attach request authenticated: an API key's
// principal, or a command's attach token.
type AttachAuth struct {
	Principal *Principal
	Token     string
}

// checkToken verifies an attach token for command c.
func checkToken(c store.Command, token string, now time.Time) error {
	bad := fmt.Errorf("the attach token is not valid for command %s: use the token from the session or an API key: %w", c.ID, errdefs.ErrUnauthenticated)
	rest, ok := strings.CutPrefix(token, "act_")
	idPart, secret, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || "cmd"+idPart != c.ID {
		return bad
	}
	if subtle.ConstantTimeCompare(hashSecret(secret), c.TokenHash) != 1 {
		return bad
	}
	if c.TokenSpent {
		return fmt.Errorf("the attach token of command %s is spent: its stream delivered the exit; attach with an API key: %w", c.ID, errdefs.ErrUnauthenticated)
	}
	if now.After(c.TokenExpiresAt) {
		return fmt.Errorf("the attach token of command %s expired at %s: attach with an API key: %w", c.ID, c.TokenExpiresAt.Format(time.RFC3339), errdefs.ErrUnauthenticated)
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
func (s *Service) Attach(ctx context.Context, auth AttachAuth, id string, after int64) (*command.Stream, error) {
	if auth.Principal == nil {
		// A token answers the same for a command that does not exist as
		// for one it is not valid for, so it cannot probe IDs.
		if tid, ok := CommandIDFromToken(auth.Token); !ok || tid != id {
			return nil, fmt.Errorf("the attach token is not valid for command %s: use the token from the session or an API key: %w", truncate(id, 40), errdefs.ErrUnauthenticated)
		}
	}
	if err := checkID("command", "cmd", id); err != nil {
		return nil, err
	}
	rec, err := s.st.GetCommand(ctx, id)
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
		if !auth.Principal.owns(rec.Owner) {
			return nil, fmt.Errorf("command %s not found: %w", id, errdefs.ErrNotFound)
		}
	} else if err := checkToken(rec, auth.Token, s.now()); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, fmt.Errorf("Last-Event-ID %d is negative: %w", after, errdefs.ErrInvalid)
	}
	if rec.State == apiv1.CommandCreated && after > 0 {
		return nil, fmt.Errorf("Last-Event-ID %d is past the last event: command %s has not started: %w", after, id, errdefs.ErrInvalid)
	}
	lv := s.getLive(rec.SandboxID)
	if lv == nil {
		sb, err := s.st.GetSandbox(ctx, rec.SandboxID)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sandbox %s is %s: its commands cannot be attached: %w", sb.ID, sb.State, errdefs.ErrConflict)
	}
	c, err := lv.command(rec)
	if err != nil {
		return nil, err
	}
	if rec.State == apiv1.CommandCreated {
		if err := c.StartOnce(func() error { return lv.start(c, rec) }); err != nil {
			return nil, err
		}
	}
	if last := c.LastSeq(); after > last {
		return nil, fmt.Errorf("Last-Event-ID %d is past the last event (%d): %w", after, last, errdefs.ErrInvalid)
	}
	var onExit func()
	if auth.Principal == nil {
		onExit = func() { s.spendToken(id) }
	}
	s.m.attached()
	return c.Stream(after, onExit), nil
}

func (s *Service) spendToken(id string) {
	if err := s.st.SpendCommandToken(context.Background(), id); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		s.log.Warn("spend attach token", "command", id, "err", err)
	}
}

// command returns the command's open session, opening its log if needed.
func (lv *live) command(rec store.Command) (*command.Session, error) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if c, ok := lv.cmds[rec.ID]; ok {
		return c, nil
	}
	if lv.ctx.Err() != nil {
		return nil, fmt.Errorf("sandbox %s is going away: %w", lv.id, errdefs.ErrConflict)
	}
	c, err := command.Open(rec.ID, lv.s.commandLogPath(lv.id, rec.ID), rec.State == apiv1.CommandExited, lv.s.m.streamed)
	if err != nil {
		return nil, err
	}
	lv.cmds[rec.ID] = c
	return c, nil
}

// start runs the command: its first attach.
func (lv *live) start(c *command.Session, rec store.Command) error {
	var req apiv1.CommandRequest
	if err := json.Unmarshal(rec.Request, &req); err != nil {
		return fmt.Errorf("command %s has an unreadable request: %w", rec.ID, err)
	}
	x, err := toExec(req)
	if err != nil {
		return err
	}
	ready := make(chan struct{})
	stdio := c.Stdio(ready)
	now := lv.s.now()
	box, vmCtx, err := lv.vm()
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
		if err := c.NotStarted(agentMessage(err)+"\n", code); err != nil {
			lv.s.log.Error("log command's end", "command", rec.ID, "err", err)
		}
		rec.State, rec.ExitCode, rec.StartedAt, rec.FinishedAt = apiv1.CommandExited, &code, &now, &now
		if err := lv.s.st.UpdateCommand(context.Background(), rec); err != nil {
			lv.s.log.Error("record command exit", "command", rec.ID, "err", err)
		}
		lv.s.m.commandEnded("exited")
		return nil
	}
	err = c.Started(proc)
	close(ready)
	if err != nil {
		return err
	}
	rec.State, rec.AgentID, rec.PID, rec.StartedAt = apiv1.CommandRunning, proc.ID, proc.PID, &now
	if err := lv.s.st.UpdateCommand(context.Background(), rec); err != nil {
		lv.s.log.Error("record command start", "command", rec.ID, "err", err)
	}
	lv.s.m.following(1)
	lv.pumps.Add(1)
	go lv.waitCommand(c, proc, rec, box, vmCtx)
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

// waitCommand waits for the process and logs its exit. It ends with the
// process, or when its VM's context ends: the sandbox was suspended (the
// wake re-attaches) or let go (the next server re-attaches).
func (lv *live) waitCommand(c *command.Session, proc *agentclient.Process, rec store.Command, box VM, vmCtx context.Context) {
	defer lv.pumps.Done()
	defer lv.s.m.following(-1)
	exit, err := box.Wait(proc)
	if vmCtx.Err() != nil {
		c.Detach(proc)
		return
	}
	if err != nil {
		lv.s.log.Warn("lost a command's output", "command", c.ID(), "err", err)
		select {
		case <-box.Done():
			return // the VM went away: watch ends every command
		case <-time.After(3 * time.Second):
		}
		lv.endCommand(c, rec, "the connection to the sandbox agent was lost")
		return
	}
	ev := apiv1.ExitEvent{ExitCode: exit.ExitCode, TimedOut: exit.TimedOut, DurationMS: exit.DurationMS}
	if exit.Signal != "" {
		sig := exit.Signal
		ev.Signal = &sig
	}
	if err := c.Exited(ev); err != nil {
		lv.s.log.Error("log command exit", "command", c.ID(), "err", err)
	}
	now := lv.s.now()
	if cur, err := lv.s.st.GetCommand(context.Background(), c.ID()); err == nil {
		rec = cur
	}
	rec.State, rec.ExitCode, rec.Signal, rec.TimedOut, rec.FinishedAt = apiv1.CommandExited, &ev.ExitCode, ev.Signal, ev.TimedOut, &now
	if err := lv.s.st.UpdateCommand(context.Background(), rec); err != nil {
		lv.s.log.Error("record command exit", "command", c.ID(), "err", err)
	}
	lv.s.m.commandEnded("exited")
}

// endCommand ends a command whose process can no longer be followed.
func (lv *live) endCommand(c *command.Session, rec store.Command, reason string) {
	if err := c.End(reason); err != nil {
		lv.s.log.Error("log command's end", "command", rec.ID, "err", err)
	}
	lv.s.markEnded(rec.ID)
}

// markEnded records a command that ended without an exit status.
func (s *Service) markEnded(id string) {
	rec, err := s.st.GetCommand(context.Background(), id)
	if err != nil || rec.State == apiv1.CommandExited {
		return
	}
	now := s.now()
	code := -1
	rec.State, rec.ExitCode, rec.FinishedAt = apiv1.CommandExited, &code, &now
	if rec.StartedAt == nil {
		rec.StartedAt = &now
	}
	if err := s.st.UpdateCommand(context.Background(), rec); err != nil {
		s.log.Error("record lost command", "command", id, "err", err)
	}
	s.m.commandEnded("lost")
}

// endCommands ends every unfinished command of a sandbox that lost its VM.
func (s *Service) endCommands(sbxID, reason string) {
	for _, state := range []string{apiv1.CommandRunning, apiv1.CommandCreated} {
		rows, err := s.st.ListCommandsByState(context.Background(), state)
		if err != nil {
			s.log.Error("list commands", "err", err)
			return
		}
		for _, rec := range rows {
			if rec.SandboxID != sbxID {
				continue
			}
			if state == apiv1.CommandRunning {
				// Readers of the log, if it is still there, end.
				if err := command.EndLog(s.commandLogPath(rec.SandboxID, rec.ID), reason); err != nil {
					s.log.Error("log command's end", "command", rec.ID, "err", err)
				}
			}
			s.markEnded(rec.ID)
		}
	}
}

// resume re-attaches to a command that was running when the server
// stopped or the sandbox was suspended: output the agent kept since is
// logged and the stream goes on. A command still attached is left alone.
func (lv *live) resume(rec store.Command) {
	c, err := lv.command(rec)
	if err != nil {
		lv.s.log.Warn("resume command", "command", rec.ID, "err", err)
		lv.s.markEnded(rec.ID)
		return
	}
	ready := make(chan struct{})
	close(ready)
	cursor, attached := c.Position()
	if attached {
		return
	}
	stdio := c.Stdio(ready)
	box, vmCtx, err := lv.vm()
	if err != nil {
		return
	}
	proc, err := box.Attach(vmCtx, rec.AgentID, cursor, stdio)
	if err != nil {
		lv.s.log.Warn("re-attach command", "command", rec.ID, "err", err)
		lv.endCommand(c, rec, "the command's process was lost while the server was down")
		return
	}
	if err := c.Reattach(proc); err != nil {
		lv.s.log.Error("log command's lost output", "command", rec.ID, "err", err)
	}
	lv.s.m.following(1)
	lv.pumps.Add(1)
	go lv.waitCommand(c, proc, rec, box, vmCtx)
}

// runningProcess returns the process of a running command p owns.
func (s *Service) runningProcess(ctx context.Context, p Principal, id string) (*agentclient.Process, store.Command, error) {
	rec, err := s.getCommand(ctx, p, id)
	if err != nil {
		return nil, rec, err
	}
	if rec.State != apiv1.CommandRunning {
		hint := ""
		if rec.State == apiv1.CommandCreated {
			hint = ": attach to it first, which starts it"
		}
		return nil, rec, fmt.Errorf("command %s is %s, not running%s: %w", id, rec.State, hint, errdefs.ErrConflict)
	}
	lv := s.getLive(rec.SandboxID)
	if sb, err := s.st.GetSandbox(ctx, rec.SandboxID); err == nil && sb.State != apiv1.StateRunning || lv == nil {
		state := "not running"
		if err == nil {
			state = sb.State
		}
		return nil, rec, fmt.Errorf("command %s cannot be reached: its sandbox %s is %s: %w", id, rec.SandboxID, state, errdefs.ErrConflict)
	}
	c, err := lv.command(rec)
	if err != nil {
		return nil, rec, err
	}
	proc := c.Process()
	if proc == nil {
		return nil, rec, fmt.Errorf("command %s has exited: %w", id, errdefs.ErrConflict)
	}
	return proc, rec, nil
}

// Stdin copies r to the command's stdin; eof then closes it.
func (s *Service) Stdin(ctx context.Context, p Principal, id string, r io.Reader, eof bool) error {
	proc, rec, err := s.runningProcess(ctx, p, id)
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
func (s *Service) Signal(ctx context.Context, p Principal, id, sig string) error {
	name := strings.ToUpper(strings.TrimPrefix(strings.ToUpper(sig), "SIG"))
	if name == "" || unix.SignalNum("SIG"+name) == 0 {
		return fmt.Errorf("signal %q is not a signal name such as TERM, KILL or INT: %w", truncate(sig, 20), errdefs.ErrInvalid)
	}
	proc, _, err := s.runningProcess(ctx, p, id)
	if err != nil {
		return err
	}
	return proc.Signal(ctx, name)
}

// Resize changes the terminal size of a command with a pty.
func (s *Service) Resize(ctx context.Context, p Principal, id string, rows, cols int) error {
	if rows < 1 || cols < 1 || rows > 10000 || cols > 10000 {
		return fmt.Errorf("rows and cols must be 1 to 10000: %w", errdefs.ErrInvalid)
	}
	proc, rec, err := s.runningProcess(ctx, p, id)
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

// capBuffer keeps the first max bytes written to it.
// Exec runs a command to its end and returns its output, kept on disk
// (see ExecOutput); the caller must Close it.
func (s *Service) Exec(ctx context.Context, p Principal, sbxID string, req apiv1.CommandRequest) (*ExecOutput, error) {
	x, err := toExec(req)
	if err != nil {
		return nil, err
	}
	if x.Stdin {
		return nil, fmt.Errorf("exec takes no stdin: create a command session for that: %w", errdefs.ErrInvalid)
	}
	lv, _, err := s.runningSandbox(ctx, p, sbxID)
	if err != nil {
		return nil, err
	}
	box, vmCtx, err := lv.vm()
	if err != nil {
		return nil, err
	}
	out := &ExecOutput{}
	if out.stdout, err = newSpool(s.execTmp(), execOutputCap); err != nil {
		return nil, err
	}
	if out.stderr, err = newSpool(s.execTmp(), execOutputCap); err != nil {
		return nil, errors.Join(err, out.Close())
	}
	proc, err := box.Exec(vmCtx, x, agentclient.Stdio{Stdout: out.stdout, Stderr: out.stderr})
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			s.m.commandEnded("exited")
			out.Result.ExitCode, out.note = 127, agentMessage(err)+"\n"
			return out, nil
		}
		return nil, errors.Join(err, out.Close())
	}
	s.m.following(1)
	select {
	case <-proc.Done():
	case <-ctx.Done():
		if err := proc.Signal(context.Background(), "KILL"); err != nil {
			s.log.Warn("kill an exec whose caller left", "sandbox", sbxID, "err", err)
		}
		<-proc.Done()
	}
	exit, err := box.Wait(proc)
	s.m.following(-1)
	if err != nil {
		s.m.commandEnded("lost")
		return nil, errors.Join(err, out.Close())
	}
	s.m.commandEnded("exited")
	s.m.streamed(int(out.stdout.n + out.stderr.n))
	out.Result = apiv1.ExecResult{ExitCode: exit.ExitCode, TimedOut: exit.TimedOut, Truncated: out.stdout.truncated || out.stderr.truncated}
	if exit.Signal != "" {
		sig := exit.Signal
		out.Result.Signal = &sig
	}
	return out, nil
}
