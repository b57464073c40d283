package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// streamWindow is the yamux stream window of agentproto.MuxConfig: the most
// a stream can have written that its host has not read yet.
const streamWindow = 1 << 20

// maxInFlight bounds how far behind what a stream wrote its host can be
// when the stream ends: the window, and the message the host had read but
// not yet passed on. A host that lost its session resumes no further back.
const maxInFlight = streamWindow + 5 + agentproto.ChunkSize

// Retention of the records of exited processes. A record is kept after the
// exit so that a host that lost its stream can still attach and collect the
// output and the exit:
//
//   - until a stream has delivered the exit (MsgExit written without error),
//     however long that takes;
//   - then for exitedTTL more, in case the host lost the end of that stream
//     in flight.
//
// Two bounds keep abandoned records from piling up. Only the maxExited most
// recent exits are kept: beyond that the oldest records go, those already
// delivered first. And the output the exited records hold stays within
// exitedOutputBudget: beyond it the oldest records, those already delivered
// first, release their output but keep their exit, so an attach then
// starts at the end of the output and its Started.Offset tells the host
// what was dropped. Records a stream is attached to are left alone. The
// rule is applied whenever a process exits, an exit is delivered or a
// process starts.
const (
	exitedTTL          = 10 * time.Minute
	maxExited          = 256
	exitedOutputBudget = 32 << 20
)

// process is the record of a process the agent started. It outlives the
// stream that started it: output is read into a ring and sent by whichever
// stream is attached, so a host that lost its session can attach again and
// resume where its output stopped.
type process struct {
	id    string
	pid   int
	pty   *os.File // the terminal's master; nil without a terminal
	stdin *os.File // our end of the process's stdin; nil unless it asked for one
	isPTY bool

	stdinMu sync.Mutex // serialises writes to stdin and its end

	mu       sync.Mutex // guards the fields below
	cond     *sync.Cond // broadcast whenever a field below changes
	out      outRing
	reserved int   // bytes the pumps are reading that are not in out yet
	sent     int64 // offset the current attachment, else the last one, has written up to
	att      *attachment
	running  bool             // false once the process was reaped
	exit     *agentproto.Exit // set once the process exited and all its output is in out
	exitedAt time.Time
	// delivered is set once a stream took MsgExit, at deliveredAt.
	delivered   bool
	deliveredAt time.Time
}

// attachment is the stream a process's output currently goes to.
type attachment struct {
	st net.Conn
}

func newProcess(id string, pid int, ptmx, stdin *os.File) *process {
	p := &process{id: id, pid: pid, pty: ptmx, stdin: stdin, isPTY: ptmx != nil, running: true}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// attach makes st the process's attachment, from offset on. A stream
// attached before is closed, so its host sees its output end. It returns
// the offset the output resumes at: offset itself, or the oldest offset
// still held when older output was dropped.
func (p *process) attach(st net.Conn, offset int64) (*attachment, int64, *agentproto.Error) {
	p.mu.Lock()
	if offset < 0 || offset > p.out.end {
		end := p.out.end
		p.mu.Unlock()
		return nil, 0, &agentproto.Error{Code: agentproto.CodeInvalid,
			Message: fmt.Sprintf("offset %d is outside the %d bytes process %s has written", offset, end, p.id)}
	}
	old := p.att
	att := &attachment{st: st}
	from := max(offset, p.out.start())
	p.att, p.sent = att, from
	p.cond.Broadcast()
	p.mu.Unlock()
	if old != nil {
		// Outside the lock: closing may wait for a busy session.
		old.st.Close()
	}
	return att, from, nil
}

// detach ends att's attachment unless another stream took over already.
func (p *process) detach(att *attachment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.att == att {
		p.att = nil
		p.cond.Broadcast()
	}
}

func (p *process) current(att *attachment) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.att == att
}

// reserve waits until n more bytes fit in the ring without overwriting
// output a host may still need, and reserves them. A host may need every
// byte no stream has written yet, and the last maxInFlight bytes written,
// which it may have lost in flight. So while no host is attached the pumps
// stop reading and the process blocks on its writes instead of losing
// output.
func (p *process) reserve(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		keep := max(0, p.sent-maxInFlight)
		if p.out.end+int64(p.reserved+n)-keep <= RingSize {
			break
		}
		p.cond.Wait()
	}
	p.reserved += n
}

// pump reads output of type t from f into the ring until EOF, or until the
// process has exited and f stays idle for drainIdle.
func (p *process) pump(f *os.File, t agentproto.MsgType, exited <-chan struct{}) {
	// While the process runs, reads block without a deadline. Its exit arms
	// one, which every later read renews.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-exited:
			f.SetReadDeadline(time.Now().Add(drainIdle))
		case <-stop:
		}
	}()
	buf := make([]byte, agentproto.ChunkSize)
	for {
		p.reserve(len(buf))
		select {
		case <-exited:
			f.SetReadDeadline(time.Now().Add(drainIdle))
		default:
		}
		n, err := readOutput(f, buf)
		p.mu.Lock()
		p.reserved -= len(buf)
		if n > 0 {
			p.out.append(t, buf[:n])
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		if err != nil {
			return // EOF, EIO from a pty whose last holder left, or idle after exit
		}
	}
}

// readOutput reads f like f.Read, except that a deadline that has passed
// still lets it take what f already holds. Go's poller reports a passed
// deadline without reading, so a pump that got to run only after the
// drain deadline (a busy guest can stall it that long) would otherwise
// drop output the process wrote before it exited.
func readOutput(f *os.File, buf []byte) (int, error) {
	n, err := f.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return n, err
	}
	rc, cerr := f.SyscallConn()
	if cerr != nil {
		return 0, err
	}
	var rerr error
	n = 0
	cerr = rc.Control(func(fd uintptr) {
		// Poll first: the descriptor may be blocking (a terminal), and a
		// read must not wait here.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if k, perr := unix.Poll(fds, 0); perr != nil || k == 0 {
			rerr = err
			return
		}
		for {
			n, rerr = unix.Read(int(fd), buf)
			if rerr != unix.EINTR {
				break
			}
		}
		switch {
		case rerr == unix.EAGAIN:
			n, rerr = 0, err
		case rerr != nil:
			n = 0
		case n == 0:
			rerr = io.EOF
		}
	})
	if cerr != nil {
		return 0, err
	}
	return n, rerr
}

// supervise runs the process's life after its start: it pumps the output
// into the ring, enforces the timeout, and records the exit. It ends once
// the process has exited and its output is read; output that does not fit
// the ring while no host is attached holds it until one attaches.
func (a *Agent) supervise(p *process, waitCh <-chan unix.WaitStatus, outputs []*os.File, types []agentproto.MsgType, timeout time.Duration, start time.Time) {
	exited := make(chan struct{})
	var pumps sync.WaitGroup
	for i, f := range outputs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			p.pump(f, types[i], exited)
		}()
	}
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var ws unix.WaitStatus
	timedOut := false
	select {
	case ws = <-waitCh:
	case <-timer:
		timedOut = true
		unix.Kill(-p.pid, unix.SIGKILL)
		unix.Kill(p.pid, unix.SIGKILL)
		ws = <-waitCh
	}
	dur := time.Since(start)
	p.mu.Lock()
	p.running = false
	p.mu.Unlock()

	close(exited)
	pumps.Wait()
	for _, f := range outputs {
		f.Close()
	}
	if p.stdin != nil && !p.isPTY {
		p.stdin.Close()
	}

	exit := agentproto.Exit{TimedOut: timedOut, DurationMS: dur.Milliseconds()}
	switch {
	case ws.Signaled():
		exit.ExitCode = 128 + int(ws.Signal())
		exit.Signal = strings.TrimPrefix(unix.SignalName(ws.Signal()), "SIG")
	default:
		exit.ExitCode = ws.ExitStatus()
	}
	p.mu.Lock()
	p.exit, p.exitedAt = &exit, time.Now()
	p.cond.Broadcast()
	p.mu.Unlock()
	a.evict(time.Now())
}

// serve sends the process's output to att's stream from offset from on,
// then its exit: MsgStarted first, then the output the ring holds, then
// output as it comes, then MsgExit. It returns once the exit is delivered,
// the stream fails or ends, or another stream takes over.
func (a *Agent) serve(st net.Conn, p *process, att *attachment, from int64) {
	defer p.detach(att)
	if err := agentproto.WriteJSON(st, agentproto.MsgStarted, agentproto.Started{ID: p.id, PID: p.pid, Offset: from}); err != nil {
		return
	}
	go p.readInput(st, att)
	buf := make([]byte, agentproto.ChunkSize)
	off := from
	for {
		p.mu.Lock()
		for p.att == att && off == p.out.end && p.exit == nil {
			p.cond.Wait()
		}
		if p.att != att {
			p.mu.Unlock()
			return
		}
		if off < p.out.end {
			// The pumps never overwrite what the attachment has not sent;
			// this only guards the ring's bounds.
			off = max(off, p.out.start())
			t, n := p.out.read(off, buf)
			p.mu.Unlock()
			if err := agentproto.WriteMsg(st, t, buf[:n]); err != nil {
				return
			}
			off += int64(n)
			p.mu.Lock()
			if p.att == att {
				p.sent = off
				p.cond.Broadcast()
			}
			p.mu.Unlock()
			continue
		}
		exit := *p.exit
		p.mu.Unlock()
		if err := agentproto.WriteJSON(st, agentproto.MsgExit, exit); err != nil {
			return
		}
		p.mu.Lock()
		p.delivered, p.deliveredAt = true, time.Now()
		p.mu.Unlock()
		p.detach(att)
		a.evict(time.Now())
		return
	}
}

// readInput reads att's stream until it ends: MsgStdin and MsgEOF go to the
// process while att is its attachment and it has a stdin; anything else is
// dropped. The end of the stream ends the attachment (the host is gone), but
// not the process's stdin: a host that attaches again may still write.
func (p *process) readInput(st net.Conn, att *attachment) {
	defer p.detach(att)
	buf := make([]byte, agentproto.ChunkSize+64)
	for {
		t, b, err := agentproto.ReadMsg(st, buf)
		if err != nil {
			return
		}
		if p.stdin == nil || !p.current(att) {
			continue
		}
		switch t {
		case agentproto.MsgStdin:
			p.writeStdin(b)
		case agentproto.MsgEOF:
			p.closeStdin()
		}
	}
}

// writeStdin writes b to the process. An error means the process closed
// its stdin or ended; the input then goes nowhere, as it would in a pipe.
func (p *process) writeStdin(b []byte) {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	p.stdin.Write(b)
}

// closeStdin ends the process's input. For a terminal it sends the EOF
// character instead: closing the master would hang up the terminal.
func (p *process) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.isPTY {
		p.stdin.Write([]byte{4})
		return
	}
	p.stdin.Close()
}

// signal sends sig to the process's group, and reports false if the
// process is no longer running.
func (p *process) signal(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return false
	}
	// The whole group: a shell's children get it too.
	if err := unix.Kill(-p.pid, sig); err != nil {
		unix.Kill(p.pid, sig)
	}
	return true
}

// resize changes the terminal's size, and reports false if the process is
// no longer running. Its terminal stays open while it runs.
func (p *process) resize(rows, cols uint16) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return false, nil
	}
	return true, setWinsize(p.pty, rows, cols)
}

func (a *Agent) handleAttach(st net.Conn, req *agentproto.AttachReq) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "attach request without parameters")
		return
	}
	p := a.lookupProc(req.ID)
	if p == nil {
		replyErr(st, agentproto.CodeNotFound, fmt.Sprintf("no process %q", req.ID))
		return
	}
	att, from, perr := p.attach(st, req.Offset)
	if perr != nil {
		reply(st, agentproto.Result{Error: perr})
		return
	}
	a.serve(st, p, att, from)
}

// evict applies the retention rule for exited records (see exitedTTL).
func (a *Agent) evict(now time.Time) {
	type exited struct {
		id        string
		p         *process
		delivered bool
		at        time.Time
		size      int
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var recs []exited
	for id, p := range a.procs {
		p.mu.Lock()
		if p.exit != nil && p.att == nil {
			if p.delivered && now.Sub(p.deliveredAt) > exitedTTL {
				delete(a.procs, id)
			} else {
				recs = append(recs, exited{id: id, p: p, delivered: p.delivered, at: p.exitedAt, size: p.out.size()})
			}
		}
		p.mu.Unlock()
	}
	// Those to go first come first: delivered ones, oldest exits first.
	slices.SortFunc(recs, func(x, y exited) int {
		if x.delivered != y.delivered {
			if x.delivered {
				return -1
			}
			return 1
		}
		return x.at.Compare(y.at)
	})
	for len(recs) > maxExited {
		delete(a.procs, recs[0].id)
		recs = recs[1:]
	}
	total := 0
	for _, r := range recs {
		total += r.size
	}
	for _, r := range recs {
		if total <= exitedOutputBudget {
			break
		}
		r.p.mu.Lock()
		r.p.out.release()
		r.p.mu.Unlock()
		total -= r.size
	}
}
