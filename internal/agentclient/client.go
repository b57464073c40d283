// Package agentclient is the host side of the agent protocol: it connects
// to a sandbox's agent and runs processes and file operations in it.
package agentclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// ErrDisconnected marks a request cut short because the link to the agent
// broke: the VM stopped, or the agent died.
var ErrDisconnected = errors.New("connection to the sandbox agent lost")

// Client is one session with an agent.
type Client struct {
	conn net.Conn
	mux  *yamux.Session
}

// helloInterval is how often the hello is repeated until the agent answers.
const helloInterval = 200 * time.Millisecond

// Handshake opens a session on conn, which is connected to the agent's
// port. It repeats the hello until the agent acks it or ctx ends, so it can
// be called while the VM is still booting.
func Handshake(ctx context.Context, conn net.Conn) (*Client, error) {
	session := agentproto.NewSessionID()
	hello := agentproto.Hello{Version: agentproto.Version, Session: session}.Marshal()

	// Ending ctx cuts short whatever blocks on conn: a read waiting for the
	// ack, or a hello write into a socket the guest is not draining.
	unblock := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer unblock()

	stop := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		t := time.NewTicker(helloInterval)
		defer t.Stop()
		for {
			if _, err := conn.Write(hello); err != nil {
				sent <- err
				return
			}
			select {
			case <-stop:
				sent <- nil
				return
			case <-t.C:
			}
		}
	}()
	br := bufio.NewReaderSize(conn, 64<<10)
	ack, err := agentproto.ReadAck(br, session)
	close(stop)
	if serr := <-sent; err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for agent: %w", ctx.Err())
		}
		return nil, fmt.Errorf("wait for agent: %w", err)
	}
	if !unblock() {
		return nil, fmt.Errorf("wait for agent: %w", ctx.Err())
	}
	conn.SetDeadline(time.Time{})
	if ack.Status == agentproto.AckVersionMismatch || ack.Version != agentproto.Version {
		return nil, fmt.Errorf("agent speaks protocol version %d, this airlock speaks %d: rebuild the guest with `airlock setup`: %w",
			ack.Version, agentproto.Version, errdefs.ErrPrecondition)
	}
	mux, err := yamux.Client(linkConn{Conn: conn, r: br, w: agentproto.NewFrameWriter(conn)}, agentproto.MuxConfig())
	if err != nil {
		return nil, fmt.Errorf("start session: %w", err)
	}
	return &Client{conn: conn, mux: mux}, nil
}

// linkConn reads through the buffered reader that found the ack and writes
// through link frames.
type linkConn struct {
	net.Conn
	r *bufio.Reader
	w *agentproto.FrameWriter
}

func (l linkConn) Read(p []byte) (int, error)  { return l.r.Read(p) }
func (l linkConn) Write(p []byte) (int, error) { return l.w.Write(p) }

// Close ends the session and its connection.
func (c *Client) Close() error {
	c.mux.Close()
	return c.conn.Close()
}

// Done is closed when the session ends.
func (c *Client) Done() <-chan struct{} { return c.mux.CloseChan() }

// open starts a stream with req. The stream is closed when ctx ends, which
// aborts whatever is blocked on it.
func (c *Client) open(ctx context.Context, req agentproto.Request) (*yamux.Stream, func(), error) {
	if req.Path != "" || isFileOp(req.Op) {
		if err := agentproto.CheckPath(req.Path); err != nil {
			return nil, nil, AgentError(&agentproto.Error{Code: agentproto.CodeInvalid, Message: err.Error()})
		}
	}
	if req.Op == agentproto.OpMove {
		if err := agentproto.CheckPath(req.To); err != nil {
			return nil, nil, AgentError(&agentproto.Error{Code: agentproto.CodeInvalid, Message: "destination: " + err.Error()})
		}
	}
	st, err := c.mux.OpenStream()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrDisconnected, err)
	}
	stop := context.AfterFunc(ctx, func() { st.Close() })
	if err := agentproto.WriteJSON(st, agentproto.MsgRequest, req); err != nil {
		stop()
		st.Close()
		return nil, nil, c.linkErr(ctx, err)
	}
	return st, func() { stop(); st.Close() }, nil
}

// linkErr explains an I/O error on a stream.
func (c *Client) linkErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if c.mux.IsClosed() || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, yamux.ErrStreamClosed) || errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, yamux.ErrConnectionReset) {
		return fmt.Errorf("%w: %v", ErrDisconnected, err)
	}
	return err
}

// result reads a MsgResult and turns a reported error into a Go error.
func (c *Client) result(ctx context.Context, r io.Reader) (agentproto.Result, error) {
	var res agentproto.Result
	if err := agentproto.ReadJSON(r, agentproto.MsgResult, &res); err != nil {
		return res, c.linkErr(ctx, err)
	}
	if res.Error != nil {
		return res, AgentError(res.Error)
	}
	return res, nil
}

// call runs a request answered by one result.
func (c *Client) call(ctx context.Context, req agentproto.Request) (agentproto.Result, error) {
	st, done, err := c.open(ctx, req)
	if err != nil {
		return agentproto.Result{}, err
	}
	defer done()
	return c.result(ctx, st)
}

// AgentError wraps an error the agent reported in the matching errdefs class.
func AgentError(e *agentproto.Error) error {
	var class error // internal failures have none
	switch e.Code {
	case agentproto.CodeInvalid, agentproto.CodeIsDir, agentproto.CodeNotDir,
		agentproto.CodeNotEmpty, agentproto.CodePermission:
		class = errdefs.ErrInvalid
	case agentproto.CodeNotFound:
		class = errdefs.ErrNotFound
	case agentproto.CodeExists, agentproto.CodeState:
		class = errdefs.ErrConflict
	case agentproto.CodeNoSpace:
		class = errdefs.ErrExhausted
	case agentproto.CodeInternal:
	default:
		class = errdefs.ErrUnavailable // a code from a newer agent
	}
	return &Error{Code: e.Code, Message: e.Message, class: class}
}

// Error is a failure reported by the agent.
type Error struct {
	Code    string
	Message string
	class   error
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the errdefs class of the error.
func (e *Error) Unwrap() error { return e.class }

// HasCode says whether err is, or wraps, a failure the agent reported with
// code (agentproto.Code…).
func HasCode(err error, code string) bool {
	var ae *Error
	return errors.As(err, &ae) && ae.Code == code
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) (agentproto.PongResult, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpPing})
	if err != nil {
		return agentproto.PongResult{}, err
	}
	if res.Pong == nil {
		return agentproto.PongResult{}, fmt.Errorf("agent answered a ping without a pong")
	}
	return *res.Pong, nil
}

// Init prepares a booted guest: clock, entropy, hostname, root disk.
func (c *Client) Init(ctx context.Context, req agentproto.InitRequest) (agentproto.InitResult, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpInit, Init: &req})
	if err != nil {
		return agentproto.InitResult{}, fmt.Errorf("init guest: %w", err)
	}
	if res.Init == nil {
		return agentproto.InitResult{}, nil
	}
	return *res.Init, nil
}

// Reinit makes a guest restored from a warm template snapshot the sandbox
// it is a clone of (see agentproto.OpReinit).
func (c *Client) Reinit(ctx context.Context, req agentproto.ReinitRequest) (agentproto.InitResult, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpReinit, Reinit: &req})
	if err != nil {
		return agentproto.InitResult{}, fmt.Errorf("reinit guest: %w", err)
	}
	if res.Init == nil {
		return agentproto.InitResult{}, fmt.Errorf("reinit guest: the agent answered without a result")
	}
	return *res.Init, nil
}

// Refresh brings an initialised guest up to date after a pause or a
// restore: its clock, and its kernel's random state.
func (c *Client) Refresh(ctx context.Context, req agentproto.RefreshRequest) error {
	if _, err := c.call(ctx, agentproto.Request{Op: agentproto.OpRefresh, Refresh: &req}); err != nil {
		return fmt.Errorf("refresh guest: %w", err)
	}
	return nil
}

// Freeze freezes the guest's root filesystem for at most timeout of the
// guest's running time (see agentproto.OpFreeze): once it returns, the
// disk holds everything written before and changes no more until Thaw.
func (c *Client) Freeze(ctx context.Context, timeout time.Duration) error {
	req := agentproto.FreezeRequest{TimeoutMS: timeout.Milliseconds()}
	if _, err := c.call(ctx, agentproto.Request{Op: agentproto.OpFreeze, Freeze: &req}); err != nil {
		return fmt.Errorf("freeze the guest's filesystem: %w", err)
	}
	return nil
}

// Thaw ends a freeze. Thawing a guest that is not frozen does nothing; the
// result says whether this thaw ended a freeze.
func (c *Client) Thaw(ctx context.Context) (agentproto.ThawResult, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpThaw})
	if err != nil {
		return agentproto.ThawResult{}, fmt.Errorf("thaw the guest's filesystem: %w", err)
	}
	if res.Thaw == nil {
		return agentproto.ThawResult{}, fmt.Errorf("thaw the guest's filesystem: the agent answered without a result")
	}
	return *res.Thaw, nil
}

// Sync writes the guest's dirty data to its disk.
func (c *Client) Sync(ctx context.Context) error {
	if _, err := c.call(ctx, agentproto.Request{Op: agentproto.OpSync}); err != nil {
		return fmt.Errorf("sync the guest's filesystems: %w", err)
	}
	return nil
}

// Stats measures the guest's CPU, memory and disk use now; it takes
// agentproto.StatsWindow.
func (c *Client) Stats(ctx context.Context) (agentproto.StatsResult, error) {
	res, err := c.call(ctx, agentproto.Request{Op: agentproto.OpStats})
	if err != nil {
		return agentproto.StatsResult{}, fmt.Errorf("measure the guest: %w", err)
	}
	if res.Stats == nil {
		return agentproto.StatsResult{}, fmt.Errorf("measure the guest: the agent answered without a result")
	}
	return *res.Stats, nil
}

func isFileOp(op string) bool {
	switch op {
	case agentproto.OpRead, agentproto.OpWrite, agentproto.OpStat, agentproto.OpList, agentproto.OpMkdir,
		agentproto.OpMove, agentproto.OpRemove, agentproto.OpTarOut, agentproto.OpTarIn:
		return true
	}
	return false
}
