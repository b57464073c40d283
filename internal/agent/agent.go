// Package agent is the guest side of airlock: PID 1 of every sandbox VM. It
// loads the kernel modules the VM needs, waits for the host on a
// virtio-serial port, and then serves requests: init (mount the sandbox's
// disk and switch into it), reinit (make a guest restored from a warm
// template snapshot the sandbox it is a clone of), exec, file operations,
// and freezing the root filesystem while the host copies the disk. Run
// again by a process in the guest, its binary is the bench's probe
// instead (Probe).
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// Config says how the agent runs.
type Config struct {
	// System is true when the agent is PID 1 of a VM: init then mounts the
	// root disk and switches into it, sets the clock and the hostname. When
	// false (tests on a host), init only records the default environment.
	System bool
	// Log receives the agent's own diagnostics.
	Log *slog.Logger
}

// Agent serves the host's requests. Create it with New.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	reaper  *reaper
	freezer *freezer

	initialized atomic.Bool
	nextID      atomic.Uint64
	// commands is the descriptor of the cgroup every process the agent
	// starts runs in (cgroup.go), or -1 for none: set once, by init.
	commands atomic.Int64

	// reinitMu serialises reinits, which read and replace identity.
	reinitMu sync.Mutex

	mu         sync.Mutex             // guards the fields below
	defaultEnv map[string]string      // environment every process starts with
	image      agentproto.ImageConfig // the template's defaults (agentproto.ImageConfigFile)
	procs      map[string]*process    // processes by ID, kept after their exit (see exitedTTL)
	identity   identity               // what init, or the last reinit, made the guest
}

// New returns an agent. Call Serve to run it.
func New(cfg Config) *Agent {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &Agent{
		cfg:     cfg,
		log:     cfg.Log,
		reaper:  processReaper(),
		freezer: &freezer{system: cfg.System, log: cfg.Log},
		procs:   map[string]*process{},
	}
	a.commands.Store(-1)
	return a
}

// Serve reads the host-to-guest stream from port and answers on it until
// ctx ends or the port fails. It survives the host reconnecting: every new
// hello replaces the session. eofBackoff is how long to wait after the port
// first reports that no host is connected; the wait doubles while no host
// comes, up to ten times that, so an unattended sandbox stays quiet.
func (a *Agent) Serve(ctx context.Context, port Port, eofBackoff time.Duration) error {
	a.reaper.acquire()
	defer a.reaper.release()
	d := agentproto.NewDemux(port)
	var cur *session
	wait := eofBackoff
	defer func() {
		if cur != nil {
			cur.close()
		}
	}()
	for ctx.Err() == nil {
		ev, err := d.Next()
		if errors.Is(err, io.EOF) {
			// No host is connected: drop the session and wait for a new one.
			if cur != nil {
				a.log.Info("host disconnected")
				cur.close()
				cur = nil
			}
			d.Resync()
			time.Sleep(wait)
			wait = min(2*wait, 10*eofBackoff)
			continue
		}
		if err != nil {
			return fmt.Errorf("read agent port: %w", err)
		}
		wait = eofBackoff
		if ev.Hello != nil {
			if cur != nil && cur.id == ev.Hello.Session {
				continue // the host repeats its hello until it sees our ack
			}
			if cur != nil {
				cur.close()
				cur = nil
			}
			cur = a.startSession(port, *ev.Hello)
			if cur == nil {
				d.Resync()
			}
			continue
		}
		if cur != nil {
			cur.feed(ev.Data)
		}
	}
	return ctx.Err()
}

// session is one host connection: a yamux server over the port.
type session struct {
	id   agentproto.SessionID
	in   *io.PipeWriter // host-to-guest payload, read by yamux
	out  *gatedWriter
	outq *coalescer // batches yamux's writes onto out
	mux  *yamux.Session
}

func (s *session) feed(p []byte) {
	if _, err := s.in.Write(p); err != nil {
		// The session ended on its own (a protocol error); its bytes go
		// nowhere until the host says hello again.
		return
	}
}

func (s *session) close() {
	s.outq.close()
	s.out.close()
	s.in.Close()
	s.mux.Close()
}

// startSession acks a hello and starts serving it. It returns nil when the
// host speaks another protocol version.
func (a *Agent) startSession(port Port, h agentproto.Hello) *session {
	out := &gatedWriter{port: port}
	ack := agentproto.Ack{Version: agentproto.Version, Session: h.Session, Status: agentproto.AckOK}
	if h.Version != agentproto.Version {
		ack.Status = agentproto.AckVersionMismatch
		a.log.Error("host speaks another protocol version", "host", h.Version, "agent", agentproto.Version)
		out.Write(ack.Marshal())
		return nil
	}
	if _, err := out.Write(ack.Marshal()); err != nil {
		a.log.Error("write ack", "err", err)
		return nil
	}
	pr, pw := io.Pipe()
	outq := newCoalescer(out)
	mux, err := yamux.Server(pipeConn{r: pr, w: outq}, agentproto.MuxConfig())
	if err != nil {
		outq.close()
		a.log.Error("start session", "err", err)
		return nil
	}
	s := &session{id: h.Session, in: pw, out: out, outq: outq, mux: mux}
	go a.acceptLoop(s)
	return s
}

func (a *Agent) acceptLoop(s *session) {
	for {
		st, err := s.mux.AcceptStream()
		if err != nil {
			s.in.CloseWithError(err)
			return
		}
		go a.handle(st)
	}
}

// Port is the agent's end of the host link: the virtio-serial port in a VM,
// a net.Conn in tests.
type Port interface {
	io.ReadWriter
	SetWriteDeadline(time.Time) error
}

// gatedWriter writes to the port until it is closed, so that a replaced
// session can never write into its successor's stream.
type gatedWriter struct {
	port   Port
	closed atomic.Bool
	mu     sync.Mutex // serialises writes
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	if g.closed.Load() {
		return 0, net.ErrClosed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() {
		return 0, net.ErrClosed
	}
	return g.port.Write(p)
}

// close stops all writes. A write blocked on a port whose host went away is
// cut short, so its bytes cannot land after the next session's ack.
func (g *gatedWriter) close() {
	g.closed.Store(true)
	g.port.SetWriteDeadline(time.Now())
	g.mu.Lock()
	g.port.SetWriteDeadline(time.Time{})
	g.mu.Unlock()
}

// pipeConn joins a reader and a writer into the io.ReadWriteCloser yamux needs.
type pipeConn struct {
	r *io.PipeReader
	w io.Writer
}

func (p pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p pipeConn) Close() error                { return p.r.Close() }

// handle serves one stream: one request.
func (a *Agent) handle(st net.Conn) {
	defer st.Close()
	var req agentproto.Request
	if err := agentproto.ReadJSON(st, agentproto.MsgRequest, &req); err != nil {
		a.log.Warn("read request", "err", err)
		return
	}
	switch req.Op {
	case agentproto.OpPing:
		a.mu.Lock()
		placeholder := a.identity.placeholder
		a.mu.Unlock()
		reply(st, agentproto.Result{Pong: &agentproto.PongResult{Initialized: a.initialized.Load(), Placeholder: placeholder}})
	case agentproto.OpInit:
		a.handleInit(st, req.Init)
	case agentproto.OpExec:
		a.handleExec(st, req.Exec)
	case agentproto.OpSignal:
		a.handleSignal(st, req.Signal)
	case agentproto.OpResize:
		a.handleResize(st, req.Resize)
	case agentproto.OpAttach:
		a.handleAttach(st, req.Attach)
	case agentproto.OpRefresh:
		a.handleRefresh(st, req.Refresh)
	case agentproto.OpReinit:
		a.handleReinit(st, req.Reinit)
	case agentproto.OpFreeze:
		a.handleFreeze(st, req.Freeze)
	case agentproto.OpThaw:
		a.handleThaw(st)
	case agentproto.OpSync:
		a.handleSync(st)
	case agentproto.OpStats:
		a.handleStats(st)
	case agentproto.OpRead, agentproto.OpWrite, agentproto.OpStat, agentproto.OpList,
		agentproto.OpMkdir, agentproto.OpMove, agentproto.OpRemove, agentproto.OpTarOut, agentproto.OpTarIn:
		if !a.initialized.Load() {
			replyErr(st, agentproto.CodeState, "the sandbox is not initialised yet")
			return
		}
		a.handleFile(st, &req)
	default:
		replyErr(st, agentproto.CodeInvalid, fmt.Sprintf("unknown operation %q", req.Op))
	}
}

func reply(w io.Writer, r agentproto.Result) error {
	return agentproto.WriteJSON(w, agentproto.MsgResult, r)
}

func replyErr(w io.Writer, code, msg string) error {
	return reply(w, agentproto.Result{Error: &agentproto.Error{Code: code, Message: msg}})
}
