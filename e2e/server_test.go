package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// server is a real `airlock serve` process with a data directory of its
// own: boot artifacts and templates are linked from the set-up one, while
// its store, keys and sandboxes are its own.
type server struct {
	home string
	addr string
	url  string
	key  string // the admin key
	args []string
	env  []string // added to the server's environment
	// command is the airlock command run: "serve" (the default) or
	// "node", whose internal API wants header on every request.
	command string
	header  http.Header
	// client calls the server; nil: http.DefaultClient. A node's
	// internal API wants the cluster TLS.
	client *http.Client
	// internal is a cluster replica's internal listener (https://…).
	internal string

	mu     sync.Mutex // guards cmd and exited
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	out    safeBuffer    // the server's output, across restarts
}

var (
	sharedOnce sync.Once
	sharedSrv  *server
	sharedErr  error
	allServers []*server // stopped and cleaned up by TestMain
	serversMu  sync.Mutex
)

// sharedServer is the server most API tests share; each test makes its
// own sandboxes on it.
func sharedServer(t *testing.T) *server {
	t.Helper()
	sharedOnce.Do(func() {
		sharedSrv, sharedErr = launchServer(nil, "--ping-interval", "1s")
	})
	if sharedErr != nil {
		t.Fatalf("start airlock serve: %v", sharedErr)
	}
	return sharedSrv
}

// newServer starts a server for one test, stopped when it ends.
func newServer(t *testing.T, args ...string) *server {
	t.Helper()
	return newServerEnv(t, nil, args...)
}

// newServerEnv is newServer with env added to the server's environment.
func newServerEnv(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	s, err := launchServer(env, args...)
	if err != nil {
		t.Fatalf("start airlock serve: %v", err)
	}
	t.Cleanup(func() { s.cleanup() })
	return s
}

// newHome makes a data directory sharing the set-up one's boot artifacts,
// templates and template snapshots.
func newHome() (string, error) {
	home, err := os.MkdirTemp("", "alh")
	if err != nil {
		return "", err
	}
	src := dataDir()
	// Template snapshots are shared too, so each server does not make its
	// own (their files are locked while made).
	if err := os.MkdirAll(src.Snapshots(), 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"boot", "templates", "accel.json", "snapshots"} {
		if err := os.Symlink(filepath.Join(src.Root, name), filepath.Join(home, name)); err != nil {
			return "", err
		}
	}
	return home, nil
}

// freeAddr returns a loopback address with a port nobody listens on, and
// never the same one twice in this test binary: a port is only bound later
// by the server it is for, and meanwhile the kernel may offer it again.
func freeAddr() (string, error) {
	addrsMu.Lock()
	defer addrsMu.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut[addr] {
			handedOut[addr] = true
			return addr, nil
		}
	}
	return "", fmt.Errorf("no fresh loopback port in 100 tries")
}

var (
	addrsMu   sync.Mutex
	handedOut = map[string]bool{} // addresses freeAddr returned; guarded by addrsMu
)

func launchServer(env []string, args ...string) (*server, error) {
	home, err := newHome()
	if err != nil {
		return nil, err
	}
	return launchServerAt(home, env, args...)
}

// launchServerAt starts a server on the data directory home.
func launchServerAt(home string, env []string, args ...string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &server{home: home, addr: addr, url: "http://" + addr, args: args, env: env}
	serversMu.Lock()
	allServers = append(allServers, s)
	serversMu.Unlock()
	if err := s.start(); err != nil {
		return s, err
	}
	b, err := os.ReadFile(filepath.Join(home, "admin.key"))
	if err != nil {
		return s, fmt.Errorf("admin key: %w", err)
	}
	s.key = strings.TrimSpace(string(b))
	return s, nil
}

func binPath() string {
	dir := os.Getenv("AIRLOCK_BIN")
	if dir == "" {
		dir = "../bin"
	}
	p, _ := filepath.Abs(filepath.Join(dir, "airlock"))
	return p
}

// start runs the server and waits for its "serving" line.
func (s *server) start() error {
	command, ready := s.command, "airlock serving on"
	if command == "" {
		command = "serve"
	} else {
		ready = "airlock " + command
	}
	cmd := exec.Command(binPath(), append([]string{command, "--listen", s.addr}, s.args...)...)
	cmd.Env = append(append(os.Environ(), "AIRLOCK_HOME="+s.home), s.env...)
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = &s.out
	// Wait returns once the process is gone even if something it started
	// still holds its output.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			s.out.Write([]byte(sc.Text() + "\n"))
			if strings.HasPrefix(sc.Text(), ready) && strings.Contains(sc.Text(), "serving") {
				once.Do(func() { close(serving) })
			}
		}
	}()
	exited := make(chan error, 1)
	reaped := make(chan struct{})
	go func() { exited <- cmd.Wait(); close(reaped); pw.Close() }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, reaped
	s.mu.Unlock()
	select {
	case <-serving:
		return nil
	case err := <-exited:
		return fmt.Errorf("server exited (%v): %s", err, s.output())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		return fmt.Errorf("server not ready in 2 minutes: %s", s.output())
	}
}

func (s *server) output() string { return s.out.String() }

// httpClient is what calls s.
func (s *server) httpClient() *http.Client {
	if s.client != nil {
		return s.client
	}
	return http.DefaultClient
}

// addHeader puts s.header on req.
func (s *server) addHeader(req *http.Request) {
	for k, vs := range s.header {
		req.Header[k] = vs
	}
}

// stop ends the server with sig and waits until it has been reaped. A
// zombie main thread is not enough: the other threads of a killed Go
// process may still hold its files, the listener among them, and a
// restart on the same address would find it in use.
func (s *server) stop(sig syscall.Signal) {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
	}
}

// cleanup stops the server, then kills what its sandboxes left running
// (VMs outlive the server by design) and removes its data directory.
func (s *server) cleanup() {
	s.stop(syscall.SIGTERM)
	entries, _ := os.ReadDir(filepath.Join(s.home, "sandboxes"))
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(s.home, "sandboxes", e.Name(), "qemu.pid"))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	os.RemoveAll(s.home)
}

// call sends a request with the key (none when key is "") and returns the
// status and body. A body that is not an io.Reader or []byte is sent as
// JSON.
func (s *server) call(t *testing.T, method, path, key string, body any, headers ...string) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		r = b
	case []byte:
		r = bytes.NewReader(b)
	case string:
		r = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, s.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	s.addHeader(req)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := s.httpClient().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// must sends a request that must answer want, and decodes the body into
// out when it is not nil.
func (s *server) must(t *testing.T, want int, method, path, key string, body, out any) {
	t.Helper()
	status, b := s.call(t, method, path, key, body)
	if status != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
}

// waitOp long-polls an operation until it finishes.
func (s *server) waitOp(t *testing.T, key, id string) apiv1.Operation {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		var op apiv1.Operation
		s.must(t, 200, "GET", "/v1/operations/"+id+"?wait_s=30", key, nil, &op)
		if op.Done() {
			return op
		}
	}
	t.Fatalf("operation %s did not finish in 3 minutes", id)
	return apiv1.Operation{}
}

// createSandbox creates a sandbox with key and waits until it runs; the
// test's end deletes it and checks that nothing of it is left.
func (s *server) createSandbox(t *testing.T, key string, req apiv1.CreateSandbox) apiv1.Sandbox {
	t.Helper()
	if req.Template == "" {
		req.Template = "tiny"
	}
	var res apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", key, req, &res)
	op := s.waitOp(t, key, res.Operation.ID)
	if op.Status != apiv1.OpSucceeded {
		t.Fatalf("create failed: %+v", op.Error)
	}
	checkTimings(t, op, "admit and record", "wait for a start slot", "create sandbox directory", "create disk", "connect to agent", "register sandbox")
	t.Cleanup(func() { s.deleteSandbox(t, key, res.Sandbox.ID) })
	var sb apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+res.Sandbox.ID, key, nil, &sb)
	if sb.State != apiv1.StateRunning {
		t.Fatalf("sandbox %s is %s after its create succeeded", sb.ID, sb.State)
	}
	return sb
}

// deleteSandbox deletes a sandbox (unless it is gone already) and checks
// that its directory and VM are gone.
func (s *server) deleteSandbox(t *testing.T, key, id string) {
	t.Helper()
	dir := filepath.Join(s.home, "sandboxes", id)
	pid := 0
	if b, err := os.ReadFile(filepath.Join(dir, "qemu.pid")); err == nil {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	status, body := s.call(t, "DELETE", "/v1/sandboxes/"+id, key, nil)
	switch status {
	case 202:
		var res apiv1.SandboxOperation
		json.Unmarshal(body, &res)
		if op := s.waitOp(t, key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Errorf("delete %s failed: %+v", id, op.Error)
		}
	case 409: // deleted already
	default:
		t.Errorf("delete %s: %d %s", id, status, body)
	}
	checkGone(t, dir, pid)
}

// sseEvent is one event of a stream.
type sseEvent struct {
	id   int64
	name string
	data string
}

// sseReader reads a text/event-stream.
type sseReader struct {
	sc    *bufio.Scanner
	pings int
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	return &sseReader{sc: sc}
}

// next returns the next event; comments are counted as pings.
func (r *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	var data []string
	seen := false
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "":
			if seen {
				ev.data = strings.Join(data, "\n")
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
			r.pings++
		default:
			seen = true
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				ev.id, _ = strconv.ParseInt(value, 10, 64)
			case "event":
				ev.name = value
			case "data":
				data = append(data, value)
			}
		}
	}
	if err := r.sc.Err(); err != nil {
		return ev, err
	}
	return ev, io.EOF
}

// attach opens a command's stream with key (an API key or attach token),
// after the event lastID.
func (s *server) attach(t *testing.T, cmdID, key string, lastID int64) (*http.Response, *sseReader) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/v1/commands/"+cmdID+"/attach", nil)
	s.addHeader(req)
	req.Header.Set("Authorization", "Bearer "+key)
	if lastID > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(lastID, 10))
	}
	resp, err := s.httpClient().Do(req)
	if err != nil {
		t.Fatalf("attach %s: %v", cmdID, err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("attach %s: status %d: %s", cmdID, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("attach content type %q", ct)
	}
	return resp, newSSEReader(resp.Body)
}

// output collects a command's stream to its exit.
type output struct {
	stdout, stderr string
	exit           apiv1.ExitEvent
	lastID         int64
	names          []string
}

func readToExit(t *testing.T, r *sseReader) output {
	t.Helper()
	var o output
	for {
		ev, err := r.next()
		if err != nil {
			t.Fatalf("stream ended before exit (%v) after %v", err, o.names)
		}
		o.names = append(o.names, ev.name)
		o.lastID = ev.id
		switch ev.name {
		case "stdout", "stderr":
			var d apiv1.DataEvent
			if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
				t.Fatalf("event %s data %q: %v", ev.name, ev.data, err)
			}
			if ev.name == "stdout" {
				o.stdout += string(d.Data)
			} else {
				o.stderr += string(d.Data)
			}
		case "exit":
			if err := json.Unmarshal([]byte(ev.data), &o.exit); err != nil {
				t.Fatal(err)
			}
			return o
		}
	}
}

// run runs a command through a session and its attach stream.
func (s *server) run(t *testing.T, key, sbx string, req apiv1.CommandRequest) output {
	t.Helper()
	var sess apiv1.CommandSession
	s.must(t, 201, "POST", "/v1/sandboxes/"+sbx+"/commands", key, req, &sess)
	resp, r := s.attach(t, sess.ID, sess.Attach.Token, 0)
	defer resp.Body.Close()
	return readToExit(t, r)
}

// readUntil reads a command's events until the stdout seen so far
// satisfies done, and returns that stdout and the last event's ID.
func readUntil(t *testing.T, r *sseReader, done func(stdout string) bool) (string, int64) {
	t.Helper()
	var out string
	var lastID int64
	for !done(out) {
		ev, err := r.next()
		if err != nil {
			t.Fatalf("stream ended (%v) with stdout %q", err, out)
		}
		lastID = ev.id
		if ev.name == "stdout" {
			var d apiv1.DataEvent
			if err := json.Unmarshal([]byte(ev.data), &d); err != nil {
				t.Fatal(err)
			}
			out += string(d.Data)
		}
	}
	return out, lastID
}

func lines(n int) func(string) bool {
	return func(out string) bool { return strings.Count(out, "\n") >= n }
}

func contains(sub string) func(string) bool {
	return func(out string) bool { return strings.Contains(out, sub) }
}

// openEvents opens a sandbox's state event stream.
func (s *server) openEvents(t *testing.T, id string) (*http.Response, *sseReader) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/v1/sandboxes/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := s.httpClient().Do(req)
	if err != nil {
		t.Fatalf("events of %s: %v", id, err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		t.Fatalf("events of %s: status %d", id, resp.StatusCode)
	}
	return resp, newSSEReader(resp.Body)
}

// checkTimings checks that a finished create or wake recorded its steps,
// among them want, each a duration that is not negative, and that they add
// up to the operation's duration (its timestamps are in milliseconds).
func checkTimings(t *testing.T, op apiv1.Operation, want ...string) {
	t.Helper()
	if op.FinishedAt == nil || len(op.Timings) == 0 {
		t.Fatalf("operation %s (%s) finished at %v with timings %v", op.ID, op.Kind, op.FinishedAt, op.Timings)
	}
	for _, name := range want {
		if _, ok := op.Timings.Get(name); !ok {
			t.Errorf("operation %s (%s) has no step %q: %v", op.ID, op.Kind, name, op.Timings)
		}
	}
	for _, st := range op.Timings {
		if st.MS < 0 {
			t.Errorf("operation %s: step %q took %.2f ms", op.ID, st.Name, st.MS)
		}
	}
	took := op.FinishedAt.Sub(op.CreatedAt)
	sum := op.Timings.Total()
	b, _ := json.Marshal(op.Timings)
	t.Logf("%s %s took %s: %s", op.Kind, op.ID, took, b)
	if diff := (took - sum).Abs(); diff > 10*time.Millisecond+took/20 {
		t.Errorf("operation %s (%s): its steps add up to %s, but it took %s: %v", op.ID, op.Kind, sum, took, op.Timings)
	}
}
