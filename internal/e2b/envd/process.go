package envd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/sessions"
)

// maxProcessTimeout is the longest process lifetime the service takes.
const maxProcessTimeout = 7 * 24 * time.Hour

// retention is how long a process that was seen to end answers a Connect
// with its end, as envd keeps it; maxRetained bounds how many are kept.
const (
	retention   = 30 * time.Second
	maxRetained = 4096
)

// note is what this layer keeps beside a command it started: E2B's tag
// and the ProcessConfig as the client gave it (cwd unresolved).
type note struct {
	Tag    *string       `json:"tag,omitempty"`
	Config processConfig `json:"config"`
}

// exitKey names a process that ended: its sandbox and pid.
type exitKey struct {
	sandbox string
	pid     uint32
}

// retainedExit is the end of a process, kept for a late Connect.
type retainedExit struct {
	tag     *string
	end     endEvent
	expires time.Time
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
func quote(s string) string {
	return strconv.Quote(truncate(s, 100))
}

// toCommand turns a StartRequest into the service's command request.
func toCommand(sr startRequest, user string, timeout time.Duration) (apiv1.CommandRequest, error) {
	cfg := sr.Process
	if cfg.Cmd == "" {
		return apiv1.CommandRequest{}, errorf(codeInvalidArgument, "field process.cmd: is required")
	}
	cr := apiv1.CommandRequest{Argv: append([]string{cfg.Cmd}, cfg.Args...), Env: cfg.Envs, User: user, Stdin: true}
	if sr.Stdin != nil {
		cr.Stdin = *sr.Stdin
	}
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cwd, err := resolve(*cfg.Cwd, user)
		if err != nil {
			return cr, err
		}
		cr.Cwd = cwd
	}
	if sr.PTY != nil {
		if sr.PTY.Cols == 0 || sr.PTY.Rows == 0 || sr.PTY.Cols > 10000 || sr.PTY.Rows > 10000 {
			return cr, errorf(codeInvalidArgument, "field pty.size: cols and rows must be 1 to 10000, not %d and %d", sr.PTY.Cols, sr.PTY.Rows)
		}
		cr.PTY = &apiv1.PTY{Rows: uint16(sr.PTY.Rows), Cols: uint16(sr.PTY.Cols)}
		cr.Stdin = true // a terminal's input is its stdin
	}
	if timeout > 0 {
		timeout = min(timeout, maxProcessTimeout)
		cr.TimeoutS = int((timeout + time.Second - 1) / time.Second)
	}
	return cr, nil
}

// start is Process.Start: it runs a command and streams its events. The
// process outlives the stream; Connect-Timeout-Ms is its lifetime.
func (s *Server) start(ctx context.Context, req Request, r *http.Request, m message, c call, out *streamWriter) error {
	sr, err := readStartRequest(m)
	if err != nil {
		return err
	}
	user, err := basicUser(r)
	if err != nil {
		return err
	}
	cr, err := toCommand(sr, user, c.timeout)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(note{Tag: sr.Tag, Config: sr.Process})
	id, st, err := s.cmds.StartCommand(ctx, req.Principal, req.SandboxID, cr, b)
	if err != nil {
		return err
	}
	defer st.Close()
	return s.follow(ctx, r, out, st, follow{sandbox: req.SandboxID, command: id, principal: req.Principal, pty: cr.PTY != nil, tag: sr.Tag})
}

// connect is Process.Connect: it re-attaches to a running process from
// the present on.
func (s *Server) connect(ctx context.Context, req Request, r *http.Request, m message, c call, out *streamWriter) error {
	sel, err := readSelector(m)
	if err != nil {
		return err
	}
	rc, err := s.findProcess(ctx, req, sel)
	if errors.Is(err, errdefs.ErrNotFound) {
		if pid, ex, ok := s.retainedExit(req.SandboxID, sel); ok {
			if err := out.send(eventResponse{Event: processEvent{Start: &startEvent{PID: pid}}}); err != nil {
				return err
			}
			end := ex.end
			return out.send(eventResponse{Event: processEvent{End: &end}})
		}
	}
	if err != nil {
		return err
	}
	st, err := s.cmds.AttachNow(ctx, req.Principal, rc.ID)
	if errors.Is(err, errdefs.ErrConflict) {
		return errorf(codeNotFound, "process with %s not found", sel.String)
	}
	if err != nil {
		return err
	}
	defer st.Close()
	n := readNote(rc)
	pid := pidOf(rc)
	if err := out.send(eventResponse{Event: processEvent{Start: &startEvent{PID: pid}}}); err != nil {
		return err
	}
	return s.follow(ctx, r, out, st, follow{sandbox: req.SandboxID, pty: rc.Request.PTY != nil, tag: n.Tag, pid: pid})
}

// follow says how to translate a command's stream.
type follow struct {
	sandbox   string
	command   string
	principal service.Principal
	pty       bool    // output is a terminal's: data.pty
	tag       *string // kept with the process's end
	pid       uint32  // the start event was sent already (Connect); 0 for Start
}

// startedPID returns the pid of a command whose stream lost its start
// event (its oldest output was dropped before it was read), 0 if it never
// started.
func (s *Server) startedPID(ctx context.Context, f follow) uint32 {
	c, err := s.cmds.GetCommand(ctx, f.principal, f.command)
	if err != nil || c.PID == nil || *c.PID <= 0 {
		return 0
	}
	return uint32(*c.PID)
}

// follow sends a command's events as process events, with keepalives
// while it is quiet, to the end event; the first write error ends it.
func (s *Server) follow(ctx context.Context, r *http.Request, out *streamWriter, st *command.Stream, f follow) error {
	events := st.Events(ctx) // the caller's Close ends the pump
	interval := keepaliveInterval(r)
	keepalive := time.NewTicker(interval)
	defer keepalive.Stop()
	started := f.pid != 0
	var failed []byte // stderr of a process that could not start
	// An event other than start first: either the process never ran (the
	// service logs why and an exit), or its start was dropped with the
	// oldest output. The command's record tells which.
	startLost := func() error {
		if started || f.command == "" {
			return nil
		}
		if f.pid = s.startedPID(ctx, f); f.pid == 0 {
			return nil
		}
		started = true
		return out.send(eventResponse{Event: processEvent{Start: &startEvent{PID: f.pid}}})
	}
	checked := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-keepalive.C:
			if started {
				if err := out.send(eventResponse{Event: processEvent{Keepalive: &struct{}{}}}); err != nil {
					return err
				}
			}
		case ev, ok := <-events:
			if !ok {
				if err := st.Err(); !errors.Is(err, io.EOF) {
					return err
				}
				return errorf(codeUnknown, "the process's output ended without its exit")
			}
			if !checked && !started && ev.Kind != command.Start {
				checked = true
				if err := startLost(); err != nil {
					return err
				}
			}
			var pe processEvent
			switch ev.Kind {
			case command.Start:
				if f.pid != 0 {
					continue
				}
				f.pid, started = uint32(ev.Start.PID), true
				pe.Start = &startEvent{PID: f.pid}
			case command.Stdout, command.Stderr:
				if !started {
					// The process never ran: the service wrote why on stderr.
					if len(failed) < 4096 {
						failed = append(failed, ev.Data...)
					}
					continue
				}
				switch {
				case f.pty:
					pe.Data = &dataEvent{PTY: ev.Data}
				case ev.Kind == command.Stdout:
					pe.Data = &dataEvent{Stdout: ev.Data}
				default:
					pe.Data = &dataEvent{Stderr: ev.Data}
				}
			case command.Exit:
				if !started {
					msg := strings.TrimSpace(string(bytes.ToValidUTF8(failed, nil)))
					if msg == "" {
						msg = "the process could not start"
					}
					return errorf(codeInvalidArgument, "%s", truncate(msg, 1000))
				}
				end := toEnd(*ev.Exit)
				s.retain(f.sandbox, f.pid, f.tag, end)
				return out.send(eventResponse{Event: processEvent{End: &end}})
			default: // gap: output the server no longer keeps
				continue
			}
			if err := out.send(eventResponse{Event: pe}); err != nil {
				return err
			}
			keepalive.Reset(interval)
		}
	}
}

// keepaliveInterval reads Keepalive-Ping-Interval (seconds), 90 s when it
// is missing or not a positive integer, as envd does.
func keepaliveInterval(r *http.Request) time.Duration {
	n, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 90 * time.Second
	}
	return time.Duration(min(n, 3600)) * time.Second
}

// toEnd turns a command's exit into envd's end event, worded as Go's
// os.ProcessState reports it ("exit status 1", "signal: killed").
func toEnd(x apiv1.ExitEvent) endEvent {
	var end endEvent
	switch {
	case x.Signal != nil:
		name := *x.Signal
		status := "signal: " + strings.ToLower(name)
		if sig := unix.SignalNum("SIG" + name); sig != 0 {
			status = "signal: " + sig.String()
		}
		end.ExitCode, end.Status, end.Error = -1, status, &status
	case x.ExitCode < 0:
		msg := "the process was lost: its exit status is unknown"
		end.ExitCode, end.Status, end.Error = -1, "unknown", &msg
	default:
		status := "exit status " + itoa(int64(x.ExitCode))
		end.ExitCode, end.Exited, end.Status = int32(x.ExitCode), true, status
		if x.ExitCode != 0 {
			end.Error = &status
		}
	}
	return end
}

// retain keeps a process's end for a late Connect.
func (s *Server) retain(sbx string, pid uint32, tag *string, end endEvent) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ex := range s.exits {
		if now.After(ex.expires) {
			delete(s.exits, k)
		}
	}
	if len(s.exits) < maxRetained {
		s.exits[exitKey{sbx, pid}] = retainedExit{tag: tag, end: end, expires: now.Add(retention)}
	}
}

// retainedExit finds a retained end by the selector.
func (s *Server) retainedExit(sbx string, sel selector) (uint32, retainedExit, bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ex := range s.exits {
		if k.sandbox != sbx || now.After(ex.expires) {
			continue
		}
		if !sel.ByTag && k.pid == sel.PID || sel.ByTag && ex.tag != nil && *ex.tag == sel.Tag {
			return k.pid, ex, true
		}
	}
	return 0, retainedExit{}, false
}

func readNote(rc sessions.RunningCommand) note {
	var n note
	if len(rc.Note) > 0 {
		json.Unmarshal(rc.Note, &n)
	}
	return n
}

// configOf is the ProcessConfig of a command: as the client gave it when
// this layer started it, else from the command's request.
func configOf(rc sessions.RunningCommand) processConfig {
	if n := readNote(rc); n.Config.Cmd != "" {
		return n.Config
	}
	req := rc.Request
	cfg := processConfig{Envs: req.Env}
	if len(req.Argv) > 0 {
		cfg.Cmd, cfg.Args = req.Argv[0], req.Argv[1:]
	} else {
		cfg.Cmd, cfg.Args = "/bin/sh", []string{"-c", req.Cmd}
	}
	if req.Cwd != "" {
		cwd := req.Cwd
		cfg.Cwd = &cwd
	}
	return cfg
}

// findProcess returns the running command the selector names: by pid, or
// the newest with the tag.
func (s *Server) findProcess(ctx context.Context, req Request, sel selector) (sessions.RunningCommand, error) {
	rcs, err := s.cmds.RunningCommands(ctx, req.Principal, req.SandboxID)
	if err != nil {
		return sessions.RunningCommand{}, err
	}
	for i := len(rcs) - 1; i >= 0; i-- {
		rc := rcs[i]
		if sel.ByTag {
			if n := readNote(rc); n.Tag != nil && *n.Tag == sel.Tag {
				return rc, nil
			}
		} else if pidOf(rc) == sel.PID {
			return rc, nil
		}
	}
	return sessions.RunningCommand{}, fmt.Errorf("process with %s not found: %w", sel.String, errdefs.ErrNotFound)
}

// list is Process.List: the sandbox's running processes.
func (s *Server) list(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	rcs, err := s.cmds.RunningCommands(ctx, req.Principal, req.SandboxID)
	if err != nil {
		return nil, err
	}
	res := listResponse{Processes: []processInfo{}}
	for _, rc := range rcs {
		res.Processes = append(res.Processes, processInfo{
			Config: configOf(rc), PID: pidOf(rc), Tag: readNote(rc).Tag,
		})
	}
	return res, nil
}

// gone turns the service's conflict for a process that just exited into
// envd's not_found.
func gone(err error, sel selector) error {
	if errors.Is(err, errdefs.ErrConflict) {
		return errorf(codeNotFound, "process with %s not found", sel.String)
	}
	return err
}

// sendInput is Process.SendInput.
func (s *Server) sendInput(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	sel, err := readSelector(m)
	if err != nil {
		return nil, err
	}
	im, _, err := m.sub("input")
	if err != nil {
		return nil, err
	}
	which, err := im.oneof("stdin", "pty")
	if err != nil {
		return nil, err
	}
	if which == "" {
		return nil, errorf(codeUnimplemented, "field input: give stdin or pty")
	}
	data, err := im.bytes(which)
	if err != nil {
		return nil, err
	}
	rc, err := s.findProcess(ctx, req, sel)
	if err != nil {
		return nil, err
	}
	if !rc.Request.Stdin {
		return nil, errorf(codeFailedPrecondition, "process with %s was started without stdin: start it with stdin true", sel.String)
	}
	if err := s.cmds.Stdin(ctx, req.Principal, rc.ID, bytes.NewReader(data), false); err != nil {
		return nil, gone(err, sel)
	}
	return empty{}, nil
}

// streamInput is Process.StreamInput, a client stream: its first message
// is {"start": {"process": selector}}, each later one {"data": {"input":
// {"stdin"|"pty": bytes}}} or {"keepalive": {}}. Each input is written to
// the process as it arrives, as SendInput would; the stream ending
// leaves stdin open (CloseStdin closes it). The answer is one {} message
// and the end of the stream, or the end of the stream with the first
// error, after which nothing more of the request is read.
func (s *Server) streamInput(w http.ResponseWriter, r *http.Request, req Request) {
	c, err := readHeaders(r, true)
	if wt, ok := err.(*errWrongType); ok {
		w.Header().Set("Accept-Post", wt.want)
		restError(w, http.StatusUnsupportedMediaType, wt.Error())
		return
	}
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if err == nil && c.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
	}
	defer cancel()
	// The stream lasts as long as the client sends, up to its
	// Connect-Timeout-Ms: a read waiting for the next message ends then.
	var deadline time.Time
	if c.timeout > 0 {
		deadline = time.Now().Add(c.timeout)
	}
	http.NewResponseController(w).SetReadDeadline(deadline)
	if err == nil {
		err = s.readInput(ctx, r, req)
	}
	if err != nil && r.Context().Err() != nil {
		return // the client went away
	}
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		err = errorf(codeDeadlineExceeded, "the call's deadline (Connect-Timeout-Ms) passed")
	}
	out := newStreamWriter(w)
	if err == nil {
		err = out.send(empty{})
	}
	out.end(err)
}

// readInput reads StreamInput's messages and writes each input to the
// process the first one selects.
func (s *Server) readInput(ctx context.Context, r *http.Request, req Request) error {
	gz, err := checkEncoding(r.Header.Get("Connect-Content-Encoding"))
	if err != nil {
		return err
	}
	var (
		rc  sessions.RunningCommand
		sel selector
	)
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := readMessage(r.Body, gz)
		if err == io.EOF {
			if n == 0 {
				return errorf(codeInvalidArgument, "the stream has no message: send start first")
			}
			return nil
		}
		if err != nil {
			return err
		}
		m, err := parseMessage("", b)
		if err != nil {
			return err
		}
		which, err := m.oneof("start", "data", "keepalive")
		if err != nil {
			return err
		}
		switch {
		case which == "":
			return errorf(codeInvalidArgument, "message %d: give start, data or keepalive", n+1)
		case n == 0 && which != "start":
			return errorf(codeInvalidArgument, "message 1 is %s: the first message must be start, naming the process", which)
		case n > 0 && which == "start":
			return errorf(codeInvalidArgument, "message %d is a second start: one stream feeds one process", n+1)
		case which == "keepalive":
			continue
		case which == "start":
			sm, _, err := m.sub("start")
			if err != nil {
				return err
			}
			if sel, err = readSelector(sm); err != nil {
				return err
			}
			if rc, err = s.findProcess(ctx, req, sel); err != nil {
				return err
			}
			if !rc.Request.Stdin {
				return errorf(codeFailedPrecondition, "process with %s was started without stdin: start it with stdin true", sel.String)
			}
			continue
		}
		dm, _, err := m.sub("data")
		if err != nil {
			return err
		}
		im, ok, err := dm.sub("input")
		if err != nil {
			return err
		}
		if !ok {
			return errorf(codeInvalidArgument, "message %d: data needs an input", n+1)
		}
		kind, err := im.oneof("stdin", "pty")
		if err != nil {
			return err
		}
		if kind == "" {
			return errorf(codeUnimplemented, "message %d: field input: give stdin or pty", n+1)
		}
		data, err := im.bytes(kind)
		if err != nil {
			return err
		}
		if err := s.cmds.Stdin(ctx, req.Principal, rc.ID, bytes.NewReader(data), false); err != nil {
			return gone(err, sel)
		}
	}
}

// closeStdin is Process.CloseStdin.
func (s *Server) closeStdin(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	sel, err := readSelector(m)
	if err != nil {
		return nil, err
	}
	rc, err := s.findProcess(ctx, req, sel)
	if err != nil {
		return nil, err
	}
	if !rc.Request.Stdin {
		return nil, errorf(codeFailedPrecondition, "process with %s was started without stdin", sel.String)
	}
	if err := s.cmds.Stdin(ctx, req.Principal, rc.ID, bytes.NewReader(nil), true); err != nil {
		return nil, gone(err, sel)
	}
	return empty{}, nil
}

// sendSignal is Process.SendSignal: SIGTERM or SIGKILL to the process's
// group.
func (s *Server) sendSignal(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	sel, err := readSelector(m)
	if err != nil {
		return nil, err
	}
	sig, err := m.enum("signal", signalValues)
	if err != nil {
		return nil, err
	}
	name := ""
	switch sig {
	case 15:
		name = "TERM"
	case 9:
		name = "KILL"
	default:
		return nil, errorf(codeUnimplemented, "invalid signal: %d: send SIGNAL_SIGTERM or SIGNAL_SIGKILL", sig)
	}
	rc, err := s.findProcess(ctx, req, sel)
	if err != nil {
		return nil, err
	}
	if err := s.cmds.Signal(ctx, req.Principal, rc.ID, name); err != nil {
		return nil, gone(err, sel)
	}
	return empty{}, nil
}

// update is Process.Update: a terminal's new size.
func (s *Server) update(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	sel, err := readSelector(m)
	if err != nil {
		return nil, err
	}
	pty, err := readPTY(m, "pty")
	if err != nil {
		return nil, err
	}
	rc, err := s.findProcess(ctx, req, sel)
	if err != nil {
		return nil, err
	}
	if pty == nil {
		return empty{}, nil
	}
	if pty.Rows > 10000 || pty.Cols > 10000 {
		return nil, errorf(codeInvalidArgument, "field pty.size: cols and rows must be 1 to 10000")
	}
	if err := s.cmds.Resize(ctx, req.Principal, rc.ID, int(pty.Rows), int(pty.Cols)); err != nil {
		return nil, gone(err, sel)
	}
	return empty{}, nil
}

// pidOf is a running command's guest pid.
func pidOf(rc sessions.RunningCommand) uint32 {
	if rc.PID == nil || *rc.PID < 0 {
		return 0
	}
	return uint32(*rc.PID)
}
