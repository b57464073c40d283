package agentclient

import (
	"context"
	"fmt"
	"io"
	"sync"

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

// Process is a running exec.
type Process struct {
	c      *Client
	ctx    context.Context
	st     *yamux.Stream
	done   func()
	ID     string
	PID    int
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
	st, done, err := c.open(ctx, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
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
			return nil, fmt.Errorf("agent answered exec without starting it")
		}
		return nil, AgentError(res.Error)
	case agentproto.MsgStarted:
	default:
		done()
		return nil, fmt.Errorf("unexpected message type %d at exec start", t)
	}
	var started agentproto.Started
	if err := jsonDecode(b, &started); err != nil {
		done()
		return nil, err
	}
	p := &Process{c: c, ctx: ctx, st: st, done: done, ID: started.ID, PID: started.PID, ended: make(chan struct{})}
	if req.Stdin && stdio.Stdin != nil {
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
			if _, err := stdout.Write(b); err != nil {
				p.err = fmt.Errorf("write stdout: %w", err)
				return
			}
		case agentproto.MsgStderr:
			if _, err := stderr.Write(b); err != nil {
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
