package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

// stallWriter takes writes until it holds limit bytes, then blocks the next
// write until release is closed and fails it: a host that stops reading and
// then goes away, losing whatever it had in flight.
type stallWriter struct {
	limit   int
	reached chan struct{}
	release chan struct{}

	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func newStallWriter(limit int) *stallWriter {
	return &stallWriter{limit: limit, reached: make(chan struct{}), release: make(chan struct{})}
}

func (w *stallWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.b.Len() < w.limit {
		defer w.mu.Unlock()
		return w.b.Write(p)
	}
	w.mu.Unlock()
	select {
	case <-w.reached:
	default:
		close(w.reached)
	}
	<-w.release
	return 0, errors.New("host gone")
}

func (w *stallWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func wait(t *testing.T, p *agentclient.Process) agentproto.Exit {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the process did not end within 30s")
	}
	exit, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return exit
}

// The host stops reading mid-stream and its session is dropped with up to a
// window of output in flight; a new session attaches at the offset the host
// had received and gets exactly the rest.
func TestAttachResumesAfterSessionDrop(t *testing.T) {
	port, c := startAgent(t)
	ctx := context.Background()
	const n = 600000 // about 4.1 MB: more than the ring beyond what is in flight
	want := seqOutput(n)
	first := newStallWriter(200 << 10)
	p1, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: fmt.Sprintf("seq 1 %d", n)}, agentclient.Stdio{Stdout: first})
	if err != nil {
		t.Fatal(err)
	}
	<-first.reached
	// The agent fills the stream's window: having taken less than half of
	// it, the host granted no more, so the agent writes a window in all,
	// what the host took and what waits in its buffer.
	window := int64(agentproto.MuxConfig().MaxStreamWindowSize)
	testenv.Eventually(t, 30*time.Second, "the agent writing the stream's window", func() (bool, string) {
		w, took := port.written.Load(), int64(len(first.String()))
		return w >= window, fmt.Sprintf("the agent wrote %d bytes, the host took %d", w, took)
	})
	c2 := dial(t, port) // replaces the first session
	close(first.release)
	<-p1.Done()
	if _, err := p1.Wait(); err == nil {
		t.Fatal("the first stream reported an exit although its host stopped reading")
	}
	off := p1.OutputOffset()
	if off != int64(len(first.String())) || off == 0 {
		t.Fatalf("OutputOffset %d, host received %d bytes", off, len(first.String()))
	}

	var rest safeBuffer
	p2, err := c2.Attach(ctx, p1.ID, off, agentclient.Stdio{Stdout: &rest})
	if err != nil {
		t.Fatal(err)
	}
	if p2.Offset != off || p2.PID != p1.PID {
		t.Fatalf("attach resumes at %d for pid %d, want %d for pid %d", p2.Offset, p2.PID, off, p1.PID)
	}
	if exit := wait(t, p2); exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	if got := first.String() + rest.String(); got != want {
		t.Fatalf("output differs: got %d bytes, want %d; first break at %d", len(got), len(want), firstDiff(got, want))
	}
	if p2.OutputOffset() != int64(len(want)) {
		t.Fatalf("OutputOffset %d after the exit, want %d", p2.OutputOffset(), len(want))
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Output made while no host is attached is held, and once the ring is full
// the process blocks on its writes rather than losing output.
func TestDetachedOutputBlocksAndIsKept(t *testing.T) {
	port, c := startAgent(t)
	const n = 700000 // about 4.8 MB, more than twice the ring
	want := seqOutput(n)
	if len(want) < 2*agent.RingSize {
		t.Fatalf("the output (%d bytes) must exceed twice the ring", len(want))
	}
	marker := filepath.Join(t.TempDir(), "done")
	ctx, cancel := context.WithCancel(context.Background())
	var first safeBuffer
	p1, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: fmt.Sprintf("seq 1 %d; touch %s", n, marker)}, agentclient.Stdio{Stdout: &first})
	if err != nil {
		t.Fatal(err)
	}
	cancel() // the host abandons the stream
	<-p1.Done()
	off := p1.OutputOffset()

	// seq writes 4 MB in a few milliseconds when nothing holds it back.
	// Held back, it waits in a write to its pipe, at the same count, and
	// the shell has not reached the touch.
	seqBlocked(t, p1.PID)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the process finished its output although no host read it")
	}

	var rest safeBuffer
	p2, err := dial(t, port).Attach(context.Background(), p1.ID, off, agentclient.Stdio{Stdout: &rest})
	if err != nil {
		t.Fatal(err)
	}
	if p2.Offset != off {
		t.Fatalf("attach resumes at %d, want %d", p2.Offset, off)
	}
	if exit := wait(t, p2); exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	if got := first.String() + rest.String(); got != want {
		t.Fatalf("output differs: got %d bytes, want %d; first break at %d", len(got), len(want), firstDiff(got, want))
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the process did not finish: %v", err)
	}
}

func TestAttachToExited(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	p, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "printf hello; sleep 0.2; printf oops >&2; exit 3"}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	if exit := wait(t, p); exit.ExitCode != 3 {
		t.Fatalf("exit %+v", exit)
	}
	tests := []struct {
		name             string
		id               string
		offset           int64
		wantOut, wantErr string
		class            error
	}{
		{name: "from the start", id: p.ID, offset: 0, wantOut: "hello", wantErr: "oops"},
		{name: "inside a chunk", id: p.ID, offset: 2, wantOut: "llo", wantErr: "oops"},
		{name: "at the second stream", id: p.ID, offset: 5, wantErr: "oops"},
		{name: "at the end", id: p.ID, offset: 9},
		{name: "beyond the end", id: p.ID, offset: 10, class: errdefs.ErrInvalid},
		{name: "negative offset", id: p.ID, offset: -1, class: errdefs.ErrInvalid},
		{name: "unknown process", id: "p999999", class: errdefs.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb safeBuffer
			a, err := c.Attach(ctx, tc.id, tc.offset, agentclient.Stdio{Stdout: &out, Stderr: &errb})
			if tc.class != nil {
				if !errors.Is(err, tc.class) {
					t.Fatalf("got %v, want class %v", err, tc.class)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			exit := wait(t, a)
			if a.Offset != tc.offset || out.String() != tc.wantOut || errb.String() != tc.wantErr || exit.ExitCode != 3 {
				t.Fatalf("offset %d out %q err %q exit %+v; want offset %d out %q err %q code 3",
					a.Offset, out.String(), errb.String(), exit, tc.offset, tc.wantOut, tc.wantErr)
			}
		})
	}
}

// Output older than the ring is gone: the attach says where it resumes.
func TestAttachBeforeTheRing(t *testing.T) {
	_, c := startAgent(t)
	const n = 500000 // about 3.4 MB
	want := seqOutput(n)
	var all safeBuffer
	e, err := c.Exec(context.Background(), agentproto.ExecRequest{Cmd: fmt.Sprintf("seq 1 %d", n)}, agentclient.Stdio{Stdout: &all})
	if err != nil {
		t.Fatal(err)
	}
	if exit := wait(t, e); all.String() != want || exit.ExitCode != 0 {
		t.Fatalf("exec: %d bytes, exit %+v", len(all.String()), exit)
	}
	var out safeBuffer
	p, err := c.Attach(context.Background(), e.ID, 0, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, p)
	start := int64(len(want) - agent.RingSize)
	if p.Offset != start || out.String() != want[start:] {
		t.Fatalf("attach at 0 resumed at %d with %d bytes; want %d with %d", p.Offset, len(out.String()), start, len(want)-int(start))
	}
}

// A second attach takes the output over; the first stream ends.
func TestAttachTakesOver(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	var first safeBuffer
	p1, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "while :; do echo tick; sleep 0.02; done"}, agentclient.Stdio{Stdout: &first})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Count(first.String(), "tick") >= 3 })
	var second safeBuffer
	p2, err := c.Attach(ctx, p1.ID, 0, agentclient.Stdio{Stdout: &second})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the first stream still runs after a second attach")
	}
	if _, err := p1.Wait(); !errors.Is(err, agentclient.ErrDisconnected) {
		t.Fatalf("first stream ended with %v, want a disconnect", err)
	}
	got1 := first.String()
	waitFor(t, func() bool { return len(second.String()) > len(got1)+20 })
	if err := p2.Signal(ctx, "TERM"); err != nil {
		t.Fatal(err)
	}
	if exit := wait(t, p2); exit.Signal != "TERM" {
		t.Fatalf("exit %+v", exit)
	}
	got2 := second.String()
	if first.String() != got1 || !strings.HasPrefix(got2, got1) || got2 != strings.Repeat("tick\n", strings.Count(got2, "tick")) {
		t.Fatalf("first stream %q, second %q: want the second to replay the first and go on", first.String(), got2)
	}
}

// Stdin survives its stream: a later attach writes to it and ends it.
func TestAttachStdin(t *testing.T) {
	for _, tty := range []*agentproto.PTY{nil, {Rows: 24, Cols: 80}} {
		t.Run(fmt.Sprintf("pty %v", tty != nil), func(t *testing.T) {
			port, c := startAgent(t)
			ctx, cancel := context.WithCancel(context.Background())
			var first safeBuffer
			p1, err := c.Exec(ctx, agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: true, PTY: tty}, agentclient.Stdio{Stdout: &first})
			if err != nil {
				t.Fatal(err)
			}
			if err := p1.WriteStdin([]byte("one\n")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return strings.Count(first.String(), "one") == 2-btoi(tty == nil) })
			cancel()
			<-p1.Done()

			var rest safeBuffer
			p2, err := dial(t, port).Attach(context.Background(), p1.ID, p1.OutputOffset(), agentclient.Stdio{Stdin: strings.NewReader("two\n"), Stdout: &rest})
			if err != nil {
				t.Fatal(err)
			}
			if exit := wait(t, p2); exit.ExitCode != 0 {
				t.Fatalf("exit %+v", exit)
			}
			got := first.String() + rest.String()
			if tty == nil && got != "one\ntwo\n" || tty != nil && strings.Count(got, "two") != 2 {
				t.Fatalf("output %q", got)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Signals and resizes reach a running process whether or not a stream is
// attached; an exited one is not found.
func TestSignalAndResizeWhileDetached(t *testing.T) {
	port, c := startAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	var first safeBuffer
	p, err := c.Exec(ctx, agentproto.ExecRequest{
		Cmd: `trap 'stty size; exit 7' WINCH; echo ready; while :; do sleep 0.05; done`,
		PTY: &agentproto.PTY{Rows: 10, Cols: 20},
	}, agentclient.Stdio{Stdout: &first})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(first.String(), "ready") })
	cancel()
	<-p.Done()
	if err := p.Resize(context.Background(), 50, 60); err != nil {
		t.Fatal(err)
	}
	var rest safeBuffer
	c2 := dial(t, port)
	a, err := c2.Attach(context.Background(), p.ID, p.OutputOffset(), agentclient.Stdio{Stdout: &rest})
	if err != nil {
		t.Fatal(err)
	}
	if exit := wait(t, a); exit.ExitCode != 7 || !strings.Contains(rest.String(), "50 60") {
		t.Fatalf("after resize: exit %+v output %q", exit, rest.String())
	}
	if err := a.Signal(context.Background(), "TERM"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("signal after the exit: %v, want not found", err)
	}

	// A signal to a process no stream is attached to.
	ctx, cancel = context.WithCancel(context.Background())
	p, err = c2.Exec(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "30"}}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-p.Done()
	if err := p.Signal(context.Background(), "INT"); err != nil {
		t.Fatal(err)
	}
	a, err = c2.Attach(context.Background(), p.ID, 0, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	if exit := wait(t, a); exit.Signal != "INT" {
		t.Fatalf("after SIGINT: exit %+v", exit)
	}
}

// seqBlocked waits until the first child of the shell pid (the seq of
// "seq ...; touch ...") has written half a ring or more and is waiting in a
// write to its pipe, its count of bytes written the same 100 ms later.
func seqBlocked(t *testing.T, pid int) {
	t.Helper()
	last := int64(-1)
	testenv.Eventually(t, 30*time.Second, "seq blocked writing to its pipe", func() (bool, string) {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		f := strings.Fields(string(kids))
		if len(f) == 0 {
			return false, "the shell has no child"
		}
		wchan, _ := os.ReadFile("/proc/" + f[0] + "/wchan")
		io, _ := os.ReadFile("/proc/" + f[0] + "/io")
		var wrote int64 = -1
		for _, line := range strings.Split(string(io), "\n") {
			if v, ok := strings.CutPrefix(line, "wchar: "); ok {
				wrote, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		blocked := strings.Contains(string(wchan), "pipe_write") && wrote >= agent.RingSize/2 && wrote == last
		last = wrote
		return blocked, fmt.Sprintf("seq %s waits in %q, %d bytes written", f[0], wchan, wrote)
	})
}
