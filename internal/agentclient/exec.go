package agentclient

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/yamux"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// Stdio is where a process's streams go. Nil writers discard; a nil Stdin
// sends nothing (the request's Stdin flag decides whether the process gets
// a pipe at all).
type Stdio struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Process is a process in the sandbox, joined by Exec or Attach: its output
// streams to the Stdio it was given until it exits.
type Process struct {
	c    *Client
	ctx  context.Context
	st   *yamux.Stream
	done func()
	// ID names the process in the agent, for Attach.
	ID  string
	PID int
	// Offset is where in the process's output sequence this stream's output
	// starts: 0 for Exec; for Attach the requested offset, or more when
	// older output had been dropped.
	Offset int64
	// next is the offset just past the output written to Stdout and Stderr.
	next   atomic.Int64
	exit   agentproto.Exit
	err    error
	ended  chan struct{}
	stdinW sync.Mutex // serialises stdin messages
}

// Exec starts a process and streams its output to stdio until it exits.
// Cancelling ctx abandons the process's streams (the process itself is not
// signalled; use Signal for that).
func (c *Client) Exec(ctx context.Context, req agentproto.ExecRequest, stdio Stdio) (*Process, error) {
	if err := req.Validate(); err != nil {
		return nil, AgentError(&agentproto.Error{Code: agentproto.CodeInvalid, Message: err.Error()})
	}
	return c.start(ctx, agentproto.Request{Op: agentproto.OpExec, Exec: &req}, stdio, req.Stdin)
}

// Attach joins a process that Exec started, possibly over an earlier
// session, and streams its output from offset on to stdio until it exits.
// offset counts the bytes of the process's output sequence: everything
// written to Stdout and Stderr, in order. To resume a process whose stream
// was lost, pass the OutputOffset of the Process that lost it. The
// returned Process's Offset says where output actually resumes. A stream
// attached to the process before stops getting output. stdio.Stdin, if not
// nil, is copied to the process's stdin when it was started with one.
// Cancelling ctx abandons the stream, as with Exec.
func (c *Client) Attach(ctx context.Context, id string, offset int64, stdio Stdio) (*Process, error) {
	if id == "" || offset < 0 {
		return nil, AgentError(&agentproto.Error{Code: agentproto.CodeInvalid, Message: "attach needs a process ID and an offset that is not negative"})
	}
	p, err := c.start(ctx, agentproto.Request{Op: agentproto.OpAttach, Attach: &agentproto.AttachReq{ID: id, Offset: offset}}, stdio, true)
	if err != nil {
		return nil, fmt.Errorf("attach to process %s: %w", id, err)
	}
	return p, nil
}

// start opens a stream with req, an exec or an attach, and reads up to the
// process's start. copyStdin says whether stdio.Stdin goes to the process.
func (c *Client) start(ctx context.Context, req agentproto.Request, stdio Stdio, copyStdin bool) (*Process, error) {
	st, done, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	t, b, err := agentproto.ReadMsg(st, nil)
	if err != nil {
		done()
		return nil, c.linkErr(ctx, err)
	}
	switch t {
	case agentproto.MsgResult:
		done()
		var res agentproto.Result
		if err := jsonDecode(b, &res); err != nil {
			return nil, err
		}
		if res.Error == nil {
			return nil, fmt.Errorf("agent answered %s without starting the process", req.Op)
		}
		return nil, AgentError(res.Error)
	case agentproto.MsgStarted:
	default:
		done()
		return nil, fmt.Errorf("unexpected message type %d at %s start", t, req.Op)
	}
	var started agentproto.Started
	if err := jsonDecode(b, &started); err != nil {
		done()
		return nil, err
	}
	p := &Process{c: c, ctx: ctx, st: st, done: done, ID: started.ID, PID: started.PID, Offset: started.Offset, ended: make(chan struct{})}
	p.next.Store(started.Offset)
	if copyStdin && stdio.Stdin != nil {
		go p.copyStdin(stdio.Stdin)
	}
	go p.readOutput(stdio.Stdout, stdio.Stderr)
	return p, nil
}

func (p *Process) copyStdin(r io.Reader) {
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := p.WriteStdin(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			p.CloseStdin()
			return
		}
	}
}

// WriteStdin sends b to the process's stdin.
func (p *Process) WriteStdin(b []byte) error {
	p.stdinW.Lock()
	defer p.stdinW.Unlock()
	_, err := agentproto.DataWriter{W: p.st, Type: agentproto.MsgStdin}.Write(b)
	return err
}

// CloseStdin sends end-of-file to the process's stdin.
func (p *Process) CloseStdin() error {
	p.stdinW.Lock()
	defer p.stdinW.Unlock()
	return agentproto.WriteMsg(p.st, agentproto.MsgEOF, nil)
}

func (p *Process) readOutput(stdout, stderr io.Writer) {
	defer close(p.ended)
	defer p.done()
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	buf := make([]byte, agentproto.ChunkSize+64)
	for {
		t, b, err := agentproto.ReadMsg(p.st, buf)
		if err != nil {
			if p.ctx.Err() != nil {
				p.err = p.ctx.Err()
			} else {
				p.err = fmt.Errorf("%w: output ended before the process exited: %v", ErrDisconnected, err)
			}
			return
		}
		switch t {
		case agentproto.MsgStdout:
			n, err := stdout.Write(b)
			p.next.Add(int64(n))
			if err != nil {
				p.err = fmt.Errorf("write stdout: %w", err)
				return
			}
		case agentproto.MsgStderr:
			n, err := stderr.Write(b)
			p.next.Add(int64(n))
			if err != nil {
				p.err = fmt.Errorf("write stderr: %w", err)
				return
			}
		case agentproto.MsgExit:
			p.err = jsonDecode(b, &p.exit)
			return
		default:
			p.err = fmt.Errorf("unexpected message type %d in exec output", t)
			return
		}
	}
}

// OutputOffset is the offset in the process's output sequence just past the
// last byte written to Stdout or Stderr: where an Attach resumes with
// nothing lost and nothing repeated.
func (p *Process) OutputOffset() int64 { return p.next.Load() }

// Wait blocks until the process exits and its output is delivered.
func (p *Process) Wait() (agentproto.Exit, error) {
	<-p.ended
	return p.exit, p.err
}

// Done is closed when Wait would return.
func (p *Process) Done() <-chan struct{} { return p.ended }

// Signal sends sig ("TERM", "KILL", ...) to the process's group.
func (p *Process) Signal(ctx context.Context, sig string) error {
	_, err := p.c.call(ctx, agentproto.Request{Op: agentproto.OpSignal, Signal: &agentproto.SignalReq{ID: p.ID, Signal: sig}})
	return err
}

// Resize changes the process's terminal size.
func (p *Process) Resize(ctx context.Context, rows, cols uint16) error {
	_, err := p.c.call(ctx, agentproto.Request{Op: agentproto.OpResize, Resize: &agentproto.ResizeReq{ID: p.ID, Rows: rows, Cols: cols}})
	return err
}
