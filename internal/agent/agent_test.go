package agent_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// port stands in for the virtio-serial port: reads report EOF while no host
// is connected, writes are dropped, and a host can connect again later.
type port struct {
	mu   sync.Mutex // guards conn
	conn net.Conn
	cond *sync.Cond
	// written counts the bytes the agent wrote to its hosts.
	written atomic.Int64
}

func newPort() *port {
	p := &port{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *port) current() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

func (p *port) Read(b []byte) (int, error) {
	c := p.current()
	if c == nil {
		return 0, io.EOF
	}
	n, err := c.Read(b)
	if err != nil {
		p.mu.Lock()
		if p.conn == c {
			p.conn = nil
		}
		p.mu.Unlock()
		if n == 0 {
			return 0, io.EOF
		}
	}
	return n, nil
}

func (p *port) Write(b []byte) (int, error) {
	c := p.current()
	if c == nil {
		return len(b), nil
	}
	n, err := c.Write(b)
	p.written.Add(int64(n))
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return len(b), nil
	}
	return n, err
}

func (p *port) SetWriteDeadline(t time.Time) error {
	if c := p.current(); c != nil {
		return c.SetWriteDeadline(t)
	}
	return nil
}

// connect attaches a new host and returns its end.
func (p *port) connect() net.Conn {
	host, guest := net.Pipe()
	p.mu.Lock()
	old := p.conn
	p.conn = guest
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return host
}

func startAgent(t *testing.T) (*port, *agentclient.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := newPort()
	a := agent.New(agent.Config{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Serve(ctx, p, time.Millisecond)
	}()
	c := dial(t, p)
	if _, err := c.Init(ctx, agentproto.InitRequest{Env: map[string]string{"AIRLOCK_TEST": "1"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if conn := p.current(); conn != nil {
			conn.Close()
		}
		<-done
	})
	return p, c
}

func dial(t *testing.T, p *port) *agentclient.Client {
	t.Helper()
	return handshake(t, p.connect())
}

func handshake(t *testing.T, conn net.Conn) *agentclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := agentclient.Handshake(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func run(t *testing.T, c *agentclient.Client, req agentproto.ExecRequest, stdin io.Reader) (string, string, agentproto.Exit) {
	t.Helper()
	var out, errb bytes.Buffer
	p, err := c.Exec(context.Background(), req, agentclient.Stdio{Stdin: stdin, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), exit
}

func TestExec(t *testing.T) {
	_, c := startAgent(t)
	tests := []struct {
		name           string
		req            agentproto.ExecRequest
		stdin          string
		wantOut, wantE string
		wantCode       int
		wantSig        string
	}{
		{name: "argv", req: agentproto.ExecRequest{Argv: []string{"echo", "hello"}}, wantOut: "hello\n"},
		{name: "shell and stderr", req: agentproto.ExecRequest{Cmd: "echo out; echo err >&2; exit 3"}, wantOut: "out\n", wantE: "err\n", wantCode: 3},
		{name: "env", req: agentproto.ExecRequest{Cmd: "echo $AIRLOCK_TEST $X", Env: map[string]string{"X": "y"}}, wantOut: "1 y\n"},
		{name: "cwd", req: agentproto.ExecRequest{Cmd: "pwd", Cwd: "/usr"}, wantOut: "/usr\n"},
		{name: "stdin", req: agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: true}, stdin: "from stdin", wantOut: "from stdin"},
		{name: "no stdin reads empty", req: agentproto.ExecRequest{Argv: []string{"cat"}}, wantOut: ""},
		{name: "killed by signal", req: agentproto.ExecRequest{Cmd: "kill -TERM $$"}, wantCode: 128 + 15, wantSig: "TERM"},
		{name: "killed by SIGKILL", req: agentproto.ExecRequest{Cmd: "kill -KILL $$"}, wantCode: 128 + 9, wantSig: "KILL"},
		{name: "pty", req: agentproto.ExecRequest{Cmd: "test -t 0 && test -t 1 && stty size", PTY: &agentproto.PTY{Rows: 33, Cols: 101}}, wantOut: "33 101\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var in io.Reader
			if tc.req.Stdin {
				in = strings.NewReader(tc.stdin)
			}
			out, errs, exit := run(t, c, tc.req, in)
			if out != tc.wantOut || errs != tc.wantE || exit.ExitCode != tc.wantCode || exit.Signal != tc.wantSig {
				t.Errorf("got out %q err %q exit %+v; want out %q err %q code %d signal %q", out, errs, exit, tc.wantOut, tc.wantE, tc.wantCode, tc.wantSig)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	_, c := startAgent(t)
	tests := []struct {
		name  string
		req   agentproto.ExecRequest
		class error
	}{
		{"missing program", agentproto.ExecRequest{Argv: []string{"no-such-program-x"}}, errdefs.ErrNotFound},
		{"no command", agentproto.ExecRequest{}, errdefs.ErrInvalid},
		{"both argv and cmd", agentproto.ExecRequest{Argv: []string{"true"}, Cmd: "true"}, errdefs.ErrInvalid},
		{"missing cwd", agentproto.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.ErrInvalid},
		{"relative cwd", agentproto.ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, errdefs.ErrInvalid},
		{"unknown user", agentproto.ExecRequest{Argv: []string{"true"}, User: "no-such-user-x"}, errdefs.ErrInvalid},
		{"NUL in argv", agentproto.ExecRequest{Argv: []string{"echo", "a\x00b"}}, errdefs.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Exec(context.Background(), tc.req, agentclient.Stdio{})
			if !errors.Is(err, tc.class) {
				t.Fatalf("got %v, want class %v", err, tc.class)
			}
		})
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	_, c := startAgent(t)
	start := time.Now()
	out, _, exit := run(t, c, agentproto.ExecRequest{Cmd: "sleep 30 & echo started; wait", TimeoutMS: 300}, nil)
	if !exit.TimedOut || exit.Signal != "KILL" || out != "started\n" {
		t.Fatalf("got out %q exit %+v, want a timed-out KILL", out, exit)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
}

func TestSignalAndResize(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	var out safeBuffer
	p, err := c.Exec(ctx, agentproto.ExecRequest{
		Cmd: `trap 'stty size; exit 7' WINCH; echo ready; while :; do sleep 0.05; done`,
		PTY: &agentproto.PTY{Rows: 10, Cols: 20},
	}, agentclient.Stdio{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
	if err := p.Resize(ctx, 50, 60); err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait()
	if err != nil || exit.ExitCode != 7 || !strings.Contains(out.String(), "50 60") {
		t.Fatalf("after resize: out %q exit %+v err %v", out.String(), exit, err)
	}

	// No shell: a shell that gets SIGINT while it forks defers it until its
	// child exits.
	p, err = c.Exec(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "30"}}, agentclient.Stdio{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(ctx, "INT"); err != nil {
		t.Fatal(err)
	}
	if exit, err := p.Wait(); err != nil || exit.Signal != "INT" {
		t.Fatalf("after SIGINT: exit %+v err %v", exit, err)
	}
	if err := p.Signal(ctx, "NOPE"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad signal name: got %v", err)
	}
}

// safeBuffer is a bytes.Buffer that output goroutines may write while the
// test reads it.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLargeOutputKeepsOrder(t *testing.T) {
	_, c := startAgent(t)
	// 8 MiB on stdout, numbered lines, checked in order.
	out, _, exit := run(t, c, agentproto.ExecRequest{Cmd: "seq 1 1000000"}, nil)
	if exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 1000000 || lines[0] != "1" || lines[999999] != "1000000" || lines[500000] != "500001" {
		t.Fatalf("got %d lines", len(lines))
	}
}

func TestFiles(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	path := filepath.Join(dir, "sub dir", "ünïcode file.bin")
	if err := c.WriteFile(ctx, path, 0o600, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	st, err := c.ReadFile(ctx, path, &got)
	if err != nil || !bytes.Equal(got.Bytes(), data) || st.Mode != "0600" || st.Type != "file" || st.SizeBytes != int64(len(data)) {
		t.Fatalf("read back: stat %+v err %v equal %v", st, err, bytes.Equal(got.Bytes(), data))
	}
	if err := c.Mkdir(ctx, filepath.Join(dir, "a/b/c")); err != nil {
		t.Fatal(err)
	}
	if err := c.Move(ctx, path, filepath.Join(dir, "a/b/c/moved")); err != nil {
		t.Fatal(err)
	}
	items, err := c.List(ctx, dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, it := range items {
		names = append(names, strings.TrimPrefix(it.Path, dir))
	}
	if want := "/a /a/b /a/b/c /sub dir"; strings.Join(names, " ") != want {
		t.Fatalf("list depth 3: %q, want %q", strings.Join(names, " "), want)
	}

	// tar out of a tree, and back in elsewhere.
	var tarball bytes.Buffer
	if err := c.TarOut(ctx, filepath.Join(dir, "a"), &tarball); err != nil {
		t.Fatal(err)
	}
	if err := c.TarIn(ctx, filepath.Join(dir, "copy"), bytes.NewReader(tarball.Bytes())); err != nil {
		t.Fatal(err)
	}
	got.Reset()
	if _, err := c.ReadFile(ctx, filepath.Join(dir, "copy/b/c/moved"), &got); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("tar round trip: err %v", err)
	}

	if err := c.Remove(ctx, filepath.Join(dir, "a"), false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("remove non-empty dir without recursive: %v", err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "a"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, filepath.Join(dir, "a")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
}

// TestReadFileLength: the size a read reports is the length of what it
// sends, for a small file rewritten while it is read, for a file whose
// stat says 0 (proc), and a large file that shrinks while it is read
// fails the read rather than ending it short.
func TestReadFileLength(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()

	small := filepath.Join(dir, "counter")
	os.WriteFile(small, []byte("0\n"), 0o644)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // what `echo $i > counter` in a loop does
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			os.WriteFile(small, []byte(strings.Repeat("7", i%4096)+"\n"), 0o644)
		}
	}()
	for i := range 300 {
		var got bytes.Buffer
		st, err := c.ReadFile(ctx, small, &got)
		if err != nil || st.SizeBytes != int64(got.Len()) {
			close(stop)
			wg.Wait()
			t.Fatalf("read %d of a file being rewritten: stat says %d bytes, got %d (err %v)", i, st.SizeBytes, got.Len(), err)
		}
	}
	close(stop)
	wg.Wait()

	var got bytes.Buffer
	if st, err := c.ReadFile(ctx, "/proc/self/status", &got); err != nil || got.Len() == 0 || st.SizeBytes != int64(got.Len()) {
		t.Errorf("read of /proc/self/status: stat says %d bytes, got %d (err %v)", st.SizeBytes, got.Len(), err)
	}

	large := filepath.Join(dir, "large")
	if err := os.WriteFile(large, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// Cut to 4 MiB at the first bytes the host gets: the agent is then
	// at most a stream window (1 MiB) ahead.
	w := &onFirstWrite{do: func() { os.Truncate(large, 4<<20) }}
	st, err := c.ReadFile(ctx, large, w)
	if err == nil || !strings.Contains(err.Error(), "shrank") {
		t.Errorf("read of a file cut from 16 to 4 MiB while read: stat %+v, %d bytes, err %v; want a shrank error", st, w.n, err)
	}
	// A large file read whole is its stat's size, even when it grows
	// while it is read.
	os.WriteFile(large, make([]byte, 2<<20+3), 0o644)
	w = &onFirstWrite{do: func() {
		f, _ := os.OpenFile(large, os.O_APPEND|os.O_WRONLY, 0)
		f.Write(make([]byte, 1<<20))
		f.Close()
	}}
	if st, err := c.ReadFile(ctx, large, w); err != nil || st.SizeBytes != 2<<20+3 || w.n != 2<<20+3 {
		t.Errorf("read of a 2 MiB file that grew by 1 MiB: stat %+v, %d bytes, err %v; want 2 MiB+3 of both", st, w.n, err)
	}
}

type onFirstWrite struct {
	do   func()
	once sync.Once
	n    int
}

func (w *onFirstWrite) Write(p []byte) (int, error) {
	w.once.Do(w.do)
	w.n += len(p)
	return len(p), nil
}

func TestFileErrors(t *testing.T) {
	_, c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	bad := []string{"", "relative", "/a/../b", "/nul\x00", "/" + strings.Repeat("x", 5000)}
	for _, p := range bad {
		if err := c.WriteFile(ctx, p, 0, strings.NewReader("x")); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("write %q: got %v, want invalid", p, err)
		}
		if _, err := c.ReadFile(ctx, p, io.Discard); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("read %q: got %v, want invalid", p, err)
		}
	}
	if _, err := c.ReadFile(ctx, filepath.Join(dir, "missing"), io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("read missing: %v", err)
	}
	if _, err := c.ReadFile(ctx, dir, io.Discard); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("read a directory: %v", err)
	}
	// Writing onto a directory fails and leaves it alone, even with a large body.
	if err := c.WriteFile(ctx, dir, 0, bytes.NewReader(make([]byte, 5<<20))); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("write onto a directory: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Errorf("directory changed: %v", err)
	}
	// A tar that climbs out of its target is refused.
	if err := c.TarIn(ctx, dir, bytes.NewReader(evilTar(t))); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("tar with ..: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escaped")); err == nil {
		t.Error("a tar entry escaped its target")
	}
}

func TestReconnectResetsSession(t *testing.T) {
	p, c := startAgent(t)
	ctx := context.Background()
	// A process started in the first session.
	if _, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "sleep 5"}, agentclient.Stdio{}); err != nil {
		t.Fatal(err)
	}
	// Stale bytes of a half-sent frame sit in front of the next hello.
	h := p.connect()
	if _, err := h.Write([]byte{0xd7, 0, 0, 0, 0x50, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	c2 := handshake(t, h)
	pong, err := c2.Ping(ctx)
	if err != nil || !pong.Initialized {
		t.Fatalf("ping after reconnect: %+v %v", pong, err)
	}
	out, _, _ := run(t, c2, agentproto.ExecRequest{Argv: []string{"echo", "again"}}, nil)
	if out != "again\n" {
		t.Fatalf("exec after reconnect: %q", out)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the old session is still open")
	}
}

func evilTar(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	body := []byte("x")
	if err := tw.WriteHeader(&tar.Header{Name: "../escaped", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(body)
	tw.Close()
	return b.Bytes()
}

func TestHelloOfAnotherVersionIsRefused(t *testing.T) {
	p, _ := startAgent(t)
	h := p.connect()
	session := agentproto.NewSessionID()
	go h.Write(agentproto.Hello{Version: agentproto.Version + 1, Session: session}.Marshal())
	h.SetReadDeadline(time.Now().Add(10 * time.Second))
	ack, err := agentproto.ReadAck(bufio.NewReader(h), session)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Status != agentproto.AckVersionMismatch || ack.Version != agentproto.Version {
		t.Fatalf("ack %+v, want a version mismatch naming version %d", ack, agentproto.Version)
	}
	// A hello of the right version on the same connection is then served.
	if _, err := agentclient.Handshake(context.Background(), h); err != nil {
		t.Fatal(err)
	}
}

// A background child that keeps the output open must not hold the exit:
// output is drained until it goes quiet, then the exit is reported.
//
// The children ignore SIGHUP (as under nohup), so that the terminal's
// hangup when the shell exits does not end the background one: the drain
// must not depend on it. A pty master outside Go's poller, where read
// deadlines do nothing, waited the full 30 s here.
func TestExitWithBackgroundChildHoldingOutput(t *testing.T) {
	signal.Ignore(syscall.SIGHUP) // inherited by what the agent starts
	defer signal.Reset(syscall.SIGHUP)
	_, c := startAgent(t)
	for _, pty := range []*agentproto.PTY{nil, {Rows: 24, Cols: 80}} {
		start := time.Now()
		out, _, exit := run(t, c, agentproto.ExecRequest{Cmd: "sleep 30 & echo done", PTY: pty}, nil)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("pty %v: exit took %v", pty != nil, d)
		}
		if exit.ExitCode != 0 || !strings.Contains(out, "done") {
			t.Fatalf("pty %v: out %q exit %+v", pty != nil, out, exit)
		}
	}
}
