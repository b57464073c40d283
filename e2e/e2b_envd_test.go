package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestE2BEnvd drives the envd routes of `airlock serve --e2b-listen` over
// raw HTTP against a real VM, with the request shapes of E2B's Python SDK
// 2.34 (research 9.4): pretty-printed JSON in unary bodies and stream
// envelopes, explicit defaults and nulls, connect-content-encoding
// identity, Keepalive-Ping-Interval and Connect-Timeout-Ms. It checks the
// wire, where TestE2BSDK checks what the SDKs make of it.
func TestE2BEnvd(t *testing.T) {
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "--e2b-listen", addr)
	var key apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.key, apiv1.CreateKey{Name: "e2b-envd", Format: apiv1.KeyFormatE2B}, &key)
	e2b := "http://" + addr

	// Create as the Python SDK does (POST /sandboxes, v1 body).
	body := `{"templateID": "base", "allow_internet_access": true, "autoPause": false, "autoResume": {"enabled": false}, ` +
		`"envVars": {"FOO": "bar"}, "metadata": {}, "secure": true, "timeout": 300}`
	req, _ := http.NewRequest("POST", e2b+"/sandboxes", strings.NewReader(body))
	req.Header.Set("X-API-KEY", key.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %s\nserver output:\n%s", resp.StatusCode, b, s.output())
	}
	var sb struct{ SandboxID, EnvdVersion, EnvdAccessToken string }
	if err := json.Unmarshal(b, &sb); err != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create: %s %v", b, err)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest("DELETE", e2b+"/sandboxes/"+sb.SandboxID, nil)
		req.Header.Set("X-API-KEY", key.Key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	c := &envdClient{url: e2b, id: sb.SandboxID, token: sb.EnvdAccessToken}

	t.Run("run", func(t *testing.T) {
		st := c.start(t, pyStart("echo hi; echo err >&2; echo $FOO; exit 3", nil, false))
		pid := st.startPID(t)
		out, errOut, end := st.drain(t)
		if pid == 0 || out != "hi\nbar\n" || errOut != "err\n" {
			t.Fatalf("pid %d stdout %q stderr %q", pid, out, errOut)
		}
		if end.ExitCode != 3 || !end.Exited || end.Status != "exit status 3" || end.Error == nil || *end.Error != "exit status 3" {
			t.Fatalf("end %+v", end)
		}
		if st.endErr != "" {
			t.Fatalf("the stream ended with %s", st.endErr)
		}
		st = c.start(t, pyStart("true", nil, false))
		st.startPID(t)
		if _, _, end := st.drain(t); end.ExitCode != 0 || !end.Exited || end.Error != nil {
			t.Fatalf("exit 0: %+v", end)
		}
	})

	t.Run("envs and health", func(t *testing.T) {
		status, b := c.do(t, "GET", "/envs", nil)
		if status != 200 || string(b) != `{"FOO":"bar"}` {
			t.Fatalf("envs: %d %s", status, b)
		}
		if status, _ := c.doNoToken(t, "GET", "/health", nil); status != 204 {
			t.Fatalf("health: %d", status)
		}
	})

	t.Run("background, list, connect, stdin", func(t *testing.T) {
		tag := "job-1"
		st := c.start(t, pyStart("cat", &tag, true))
		pid := st.startPID(t)
		st.close() // the client goes away; the process does not
		list := c.unaryOK(t, "/process.Process/List", []byte("{}"))
		if !strings.Contains(list, fmt.Sprintf(`"pid":%d`, pid)) || !strings.Contains(list, `"tag":"job-1"`) ||
			!strings.Contains(list, `"args":["-l","-c","cat"]`) {
			t.Fatalf("list: %s", list)
		}
		conn := c.open(t, "/process.Process/Connect", pretty(`{"process": {"tag": "job-1"}}`), 60000)
		if got := conn.startPID(t); got != pid {
			t.Fatalf("connect: start pid %d, want %d", got, pid)
		}
		c.unaryOK(t, "/process.Process/SendInput", pretty(fmt.Sprintf(`{"process": {"pid": %d}, "input": {"stdin": %q}}`,
			pid, base64.StdEncoding.EncodeToString([]byte("hello\n")))))
		if ev := conn.next(t); ev.Event.Data == nil || string(ev.Event.Data.Stdout) != "hello\n" {
			t.Fatalf("echo of stdin: %+v", ev)
		}
		c.unaryOK(t, "/process.Process/CloseStdin", pretty(fmt.Sprintf(`{"process": {"pid": %d}}`, pid)))
		if _, _, end := conn.drain(t); end.ExitCode != 0 || !end.Exited {
			t.Fatalf("cat after EOF: %+v", end)
		}
		// A late Connect gets the start and the end.
		late := c.open(t, "/process.Process/Connect", pretty(fmt.Sprintf(`{"process": {"pid": %d}}`, pid)), 60000)
		late.startPID(t)
		if _, _, end := late.drain(t); !end.Exited {
			t.Fatalf("late connect: %+v", end)
		}
		status, b := c.unary(t, "/process.Process/SendSignal", pretty(fmt.Sprintf(`{"process": {"pid": %d}, "signal": "SIGNAL_SIGKILL"}`, pid)))
		if status != 404 || !strings.Contains(string(b), `"not_found"`) {
			t.Fatalf("signal to an exited process: %d %s", status, b)
		}
	})

	t.Run("stream input", func(t *testing.T) {
		tag := "fed"
		st := c.start(t, pyStart("cat", &tag, true))
		pid := st.startPID(t)
		// The client stream stays open while its input reaches cat and
		// comes back on the Start stream, message by message.
		pr, pw := io.Pipe()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "POST", c.url+"/process.Process/StreamInput", pr)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]string{"E2b-Sandbox-Id": c.id, "E2b-Sandbox-Port": "49983", "X-Access-Token": c.token,
			"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", "Connect-Content-Encoding": "identity"} {
			req.Header.Set(k, v)
		}
		answer := make(chan *http.Response, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("StreamInput: %v", err)
				pr.CloseWithError(err)
			}
			answer <- resp
		}()
		send := func(msg string) {
			t.Helper()
			if _, err := pw.Write(envelopeOf([]byte(msg))); err != nil {
				t.Fatalf("send %s: %v", msg, err)
			}
		}
		send(`{"start": {"process": {"tag": "fed"}}}`)
		for _, line := range []string{"hello\n", "again\n"} {
			send(`{"keepalive": {}}`)
			send(fmt.Sprintf(`{"data": {"input": {"stdin": %q}}}`, base64.StdEncoding.EncodeToString([]byte(line))))
			if ev := st.next(t); ev.Event.Data == nil || string(ev.Event.Data.Stdout) != line {
				t.Fatalf("cat echoed %+v, want %q", ev, line)
			}
		}
		pw.Close()
		resp := <-answer
		if resp == nil {
			t.FailNow()
		}
		in := &envdStream{resp: resp, cancel: cancel}
		defer in.close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
			t.Fatalf("StreamInput answered %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if msg := in.nextRaw(t); msg != "{}" || in.ended {
			t.Fatalf("StreamInput's message %q (ended %v, %s), want {}", msg, in.ended, in.endErr)
		}
		if in.nextRaw(t); !in.ended || in.endErr != "" {
			t.Fatalf("StreamInput's end: ended %v, error %s", in.ended, in.endErr)
		}
		// The stream's end left stdin open; CloseStdin ends cat.
		c.unaryOK(t, "/process.Process/CloseStdin", pretty(fmt.Sprintf(`{"process": {"pid": %d}}`, pid)))
		if _, _, end := st.drain(t); end.ExitCode != 0 || !end.Exited {
			t.Fatalf("cat after EOF: %+v", end)
		}
	})

	t.Run("kill", func(t *testing.T) {
		st := c.start(t, pyStart("sleep 600", nil, false))
		pid := st.startPID(t)
		c.unaryOK(t, "/process.Process/SendSignal", pretty(fmt.Sprintf(`{"process": {"pid": %d}, "signal": "SIGNAL_SIGKILL"}`, pid)))
		if _, _, end := st.drain(t); end.ExitCode != -1 || end.Exited || end.Status != "signal: killed" {
			t.Fatalf("killed: %+v", end)
		}
	})

	t.Run("lifetime is Connect-Timeout-Ms", func(t *testing.T) {
		st := c.open(t, "/process.Process/Start", pyStart("sleep 600", nil, false), 2000)
		pid := st.startPID(t)
		st.drainToEnd(t)
		if !strings.Contains(st.endErr, "deadline_exceeded") {
			t.Fatalf("stream end %q, want deadline_exceeded", st.endErr)
		}
		deadline := time.Now().Add(30 * time.Second)
		for strings.Contains(c.unaryOK(t, "/process.Process/List", []byte("{}")), fmt.Sprintf(`"pid":%d`, pid)) {
			if time.Now().After(deadline) {
				t.Fatal("the process outlived its Connect-Timeout-Ms")
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("pty", func(t *testing.T) {
		body := pretty(`{"process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm-256color", "LANG": "C.UTF-8"}, "cwd": null},
			"pty": {"size": {"cols": 80, "rows": 24}}, "tag": null, "stdin": true}`)
		st := c.start(t, body)
		pid := st.startPID(t)
		c.unaryOK(t, "/process.Process/Update", pretty(fmt.Sprintf(`{"process": {"pid": %d}, "pty": {"size": {"cols": 100, "rows": 30}}}`, pid)))
		in := base64.StdEncoding.EncodeToString([]byte("stty size; echo pty-$((40+2)); exit 0\n"))
		c.unaryOK(t, "/process.Process/SendInput", pretty(fmt.Sprintf(`{"process": {"pid": %d}, "input": {"pty": %q}}`, pid, in)))
		var out strings.Builder
		for {
			ev := st.next(t)
			if ev.Event.Data != nil {
				if ev.Event.Data.Stdout != nil || ev.Event.Data.Stderr != nil {
					t.Fatalf("terminal output as stdout/stderr: %+v", ev.Event.Data)
				}
				out.Write(ev.Event.Data.Pty)
			}
			if ev.Event.End != nil {
				break
			}
		}
		if !strings.Contains(out.String(), "pty-42") || !strings.Contains(out.String(), "30 100") {
			t.Fatalf("terminal output %q", out.String())
		}
	})

	t.Run("files", func(t *testing.T) {
		// Multipart, one file: the path in the query (Python, one file).
		var mp bytes.Buffer
		mw := multipart.NewWriter(&mp)
		fw, _ := mw.CreateFormFile("file", "/tmp/e2b/a.txt")
		fw.Write([]byte("hello"))
		mw.Close()
		status, b := c.do(t, "POST", "/files?path=%2Ftmp%2Fe2b%2Fa.txt", mp.Bytes(), "Content-Type", mw.FormDataContentType())
		if status != 200 || string(b) != `[{"path":"/tmp/e2b/a.txt","name":"a.txt","type":"file"}]` {
			t.Fatalf("multipart upload: %d %s", status, b)
		}
		// Multipart, two files: each part's file name is its destination.
		mp.Reset()
		mw = multipart.NewWriter(&mp)
		for _, f := range []struct{ name, data string }{{"/tmp/e2b/m/one.txt", "1"}, {"rel/two.txt", "22"}} {
			fw, _ := mw.CreateFormFile("file", f.name)
			fw.Write([]byte(f.data))
		}
		mw.Close()
		status, b = c.do(t, "POST", "/files", mp.Bytes(), "Content-Type", mw.FormDataContentType())
		if status != 200 || !strings.Contains(string(b), `"path":"/tmp/e2b/m/one.txt"`) || !strings.Contains(string(b), `"path":"/root/rel/two.txt"`) {
			t.Fatalf("multipart upload of two: %d %s", status, b)
		}
		// Octet-stream, relative to the user's home.
		status, b = c.do(t, "POST", "/files?path=raw.bin", []byte{0, 1, 2, 255}, "Content-Type", "application/octet-stream")
		if status != 200 || !strings.Contains(string(b), `"path":"/root/raw.bin"`) {
			t.Fatalf("octet-stream upload: %d %s", status, b)
		}
		status, b = c.do(t, "GET", "/files?path=%2Froot%2Fraw.bin", nil)
		if status != 200 || !bytes.Equal(b, []byte{0, 1, 2, 255}) {
			t.Fatalf("download: %d %q", status, b)
		}
		if status, b = c.do(t, "GET", "/files?path=/tmp/e2b/nope", nil); status != 404 {
			t.Fatalf("download of a missing file: %d %s", status, b)
		}
		if status, b = c.do(t, "GET", "/files?path=/tmp/e2b", nil); status != 400 {
			t.Fatalf("download of a directory: %d %s", status, b)
		}
		// A signed URL without the token, as downloadUrl() makes it.
		exp := time.Now().Add(time.Minute).Unix()
		signed := "/files?" + url.Values{"path": {"/tmp/e2b/a.txt"}, "signature": {sign("/tmp/e2b/a.txt", "read", "", sb.EnvdAccessToken, &exp)},
			"signature_expiration": {strconv.FormatInt(exp, 10)}}.Encode()
		if status, b = c.doNoToken(t, "GET", signed, nil); status != 200 || string(b) != "hello" {
			t.Fatalf("signed download: %d %s", status, b)
		}
		if status, _ = c.doNoToken(t, "GET", strings.Replace(signed, "signature=v1_", "signature=v1_x", 1), nil); status != 401 {
			t.Fatalf("download with a bad signature: %d", status)
		}
	})

	t.Run("filesystem", func(t *testing.T) {
		c.do(t, "POST", "/files?path=/tmp/fs/a.txt", []byte("hello"), "Content-Type", "application/octet-stream")
		var stat struct{ Entry entry }
		c.unaryJSON(t, "/filesystem.Filesystem/Stat", pretty(`{"path": "/tmp/fs/a.txt"}`), &stat)
		if e := stat.Entry; e.Name != "a.txt" || e.Type != "FILE_TYPE_FILE" || e.Path != "/tmp/fs/a.txt" || e.Size != "5" ||
			e.Mode != 0o644 || e.Permissions != "-rw-r--r--" || e.Owner != "root" || time.Since(e.ModifiedTime) > time.Hour {
			t.Fatalf("stat: %+v", e)
		}
		if status, b := c.unary(t, "/filesystem.Filesystem/Stat", pretty(`{"path": "/tmp/fs/nope"}`)); status != 404 || !strings.Contains(string(b), "not_found") {
			t.Fatalf("stat of a missing path: %d %s", status, b)
		}
		var made struct{ Entry entry }
		c.unaryJSON(t, "/filesystem.Filesystem/MakeDir", pretty(`{"path": "/tmp/fs/d/e"}`), &made)
		if made.Entry.Type != "FILE_TYPE_DIRECTORY" || made.Entry.Path != "/tmp/fs/d/e" {
			t.Fatalf("make dir: %+v", made.Entry)
		}
		if status, b := c.unary(t, "/filesystem.Filesystem/MakeDir", pretty(`{"path": "/tmp/fs/d/e"}`)); status != 409 || !strings.Contains(string(b), "already_exists") {
			t.Fatalf("make dir again: %d %s", status, b)
		}
		st := c.start(t, pyStart("ln -s /tmp/fs/d /tmp/fs/link", nil, false))
		st.startPID(t)
		st.drain(t)
		var list struct{ Entries []entry }
		c.unaryJSON(t, "/filesystem.Filesystem/ListDir", pretty(`{"path": "/tmp/fs", "depth": 1}`), &list)
		names := []string{}
		for _, e := range list.Entries {
			names = append(names, e.Name+":"+e.Type)
		}
		if strings.Join(names, " ") != "a.txt:FILE_TYPE_FILE d:FILE_TYPE_DIRECTORY link:FILE_TYPE_DIRECTORY" {
			t.Fatalf("list: %v", names)
		}
		if l := list.Entries[2]; l.SymlinkTarget == nil || *l.SymlinkTarget != "/tmp/fs/d" || !strings.HasPrefix(l.Permissions, "L") {
			t.Fatalf("link: %+v", l)
		}
		c.unaryJSON(t, "/filesystem.Filesystem/ListDir", pretty(`{"path": "/tmp/fs", "depth": 2}`), &list)
		if len(list.Entries) != 4 || list.Entries[2].Path != "/tmp/fs/d/e" {
			t.Fatalf("list depth 2: %+v", list.Entries)
		}
		var moved struct{ Entry entry }
		c.unaryJSON(t, "/filesystem.Filesystem/Move", pretty(`{"source": "/tmp/fs/a.txt", "destination": "/tmp/fs/d/b.txt"}`), &moved)
		if moved.Entry.Path != "/tmp/fs/d/b.txt" || moved.Entry.Size != "5" {
			t.Fatalf("move: %+v", moved.Entry)
		}
		c.unaryOK(t, "/filesystem.Filesystem/Remove", pretty(`{"path": "/tmp/fs/d"}`))
		c.unaryOK(t, "/filesystem.Filesystem/Remove", pretty(`{"path": "/tmp/fs/d"}`)) // gone already: no error
		if status, _ := c.unary(t, "/filesystem.Filesystem/Stat", pretty(`{"path": "/tmp/fs/d/b.txt"}`)); status != 404 {
			t.Fatalf("stat after remove: %d", status)
		}
	})

	t.Run("watch", func(t *testing.T) {
		c.unaryOK(t, "/filesystem.Filesystem/MakeDir", pretty(`{"path": "/tmp/w"}`))
		w := c.open(t, "/filesystem.Filesystem/WatchDir", pretty(`{"path": "/tmp/w", "recursive": false}`), 0)
		if ev := w.nextRaw(t); ev != `{"start":{}}` {
			t.Fatalf("first watch message %s", ev)
		}
		c.do(t, "POST", "/files?path=/tmp/w/x.txt", []byte("1"), "Content-Type", "application/octet-stream")
		if ev := w.nextRaw(t); ev != `{"filesystem":{"name":"x.txt","type":"EVENT_TYPE_CREATE"}}` {
			t.Fatalf("create event %s", ev)
		}
		c.unaryOK(t, "/filesystem.Filesystem/Remove", pretty(`{"path": "/tmp/w/x.txt"}`))
		if ev := w.nextRaw(t); ev != `{"filesystem":{"name":"x.txt","type":"EVENT_TYPE_REMOVE"}}` {
			t.Fatalf("remove event %s", ev)
		}
		w.close()

		// The sync watcher of the Python SDK's sync client.
		var cw struct{ WatcherID string }
		c.unaryJSON(t, "/filesystem.Filesystem/CreateWatcher", pretty(`{"path": "/tmp/w", "recursive": true, "includeEntry": false}`), &cw)
		c.do(t, "POST", "/files?path=/tmp/w/sub/y.txt", []byte("2"), "Content-Type", "application/octet-stream")
		deadline := time.Now().Add(30 * time.Second)
		seen := ""
		for !strings.Contains(seen, `"name":"sub/y.txt","type":"EVENT_TYPE_CREATE"`) {
			if time.Now().After(deadline) {
				t.Fatalf("sync watcher events: %s", seen)
			}
			time.Sleep(300 * time.Millisecond)
			seen += c.unaryOK(t, "/filesystem.Filesystem/GetWatcherEvents", pretty(fmt.Sprintf(`{"watcherId": %q}`, cw.WatcherID)))
		}
		c.unaryOK(t, "/filesystem.Filesystem/RemoveWatcher", pretty(fmt.Sprintf(`{"watcherId": %q}`, cw.WatcherID)))
		if status, _ := c.unary(t, "/filesystem.Filesystem/GetWatcherEvents", pretty(fmt.Sprintf(`{"watcherId": %q}`, cw.WatcherID))); status != 404 {
			t.Fatalf("events of a removed watcher: %d", status)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		if status, b := c.unary(t, "/process.Process/Nope", []byte("{}")); status != 501 || !strings.Contains(string(b), "unimplemented") {
			t.Fatalf("unknown procedure: %d %s", status, b)
		}
		st := c.openRaw(t, "/process.Process/Start", []byte{0, 0x7f, 0xff, 0xff, 0xff}, 0)
		st.drainToEnd(t)
		if !strings.Contains(st.endErr, "resource_exhausted") {
			t.Fatalf("oversized envelope: %q", st.endErr)
		}
		if status, _ := c.doNoToken(t, "POST", "/process.Process/List", []byte("{}"), "Content-Type", "application/json"); status != 401 {
			t.Fatalf("no token: %d", status)
		}
		// A process that cannot start ends the stream with an error and no
		// start event, as envd's does.
		for _, body := range []string{`{"process": {"cmd": "/nonexistent"}}`, `{"process": {"cmd": "/bin/true", "cwd": "/nonexistent"}}`} {
			st := c.start(t, pretty(body))
			if raw := st.nextRaw(t); !st.ended || !strings.Contains(st.endErr, "invalid_argument") {
				t.Fatalf("%s: message %s, end %s", body, raw, st.endErr)
			}
		}
	})

	t.Run("user", func(t *testing.T) {
		st := c.openRaw(t, "/process.Process/Start", envelopeOf(pyStart("id -un; echo $HOME", nil, false)), 60000,
			"Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
		st.startPID(t)
		if out, _, end := st.drain(t); out != "root\n/root\n" || end.ExitCode != 0 {
			t.Fatalf("as root: %q %+v", out, end)
		}
		st = c.openRaw(t, "/process.Process/Start", envelopeOf(pyStart("true", nil, false)), 60000,
			"Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nosuchuser:")))
		if st.nextRaw(t); !st.ended || !strings.Contains(st.endErr, "nosuchuser") {
			t.Fatalf("as a user that does not exist: %s", st.endErr)
		}
	})

	// Last: the server restarts, and finds the process by pid and tag again.
	t.Run("server restart", func(t *testing.T) {
		tag := "survivor"
		st := c.start(t, pyStart("sleep 600", &tag, false))
		pid := st.startPID(t)
		st.close()
		s.stop(syscall.SIGTERM)
		if err := s.start(); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(s.output(), "airlock serving on"); n != 2 {
			t.Fatalf("the server started %d times, want 2", n)
		}
		list := c.unaryOK(t, "/process.Process/List", []byte("{}"))
		if !strings.Contains(list, fmt.Sprintf(`"pid":%d`, pid)) || !strings.Contains(list, `"tag":"survivor"`) {
			t.Fatalf("list after a restart: %s", list)
		}
		conn := c.open(t, "/process.Process/Connect", pretty(`{"process": {"tag": "survivor"}}`), 60000)
		if got := conn.startPID(t); got != pid {
			t.Fatalf("connect after a restart: pid %d, want %d", got, pid)
		}
		c.unaryOK(t, "/process.Process/SendSignal", pretty(fmt.Sprintf(`{"process": {"pid": %d}, "signal": "SIGNAL_SIGTERM"}`, pid)))
		if _, _, end := conn.drain(t); end.Status != "signal: terminated" {
			t.Fatalf("end after SIGTERM: %+v", end)
		}
	})
}

// entry is EntryInfo as read back.
type entry struct {
	Name, Type, Path, Size, Permissions, Owner, Group string
	Mode                                              uint32
	ModifiedTime                                      time.Time
	SymlinkTarget                                     *string
}

// sign makes an envd file URL signature, as the SDKs do.
func sign(path, op, user, token string, exp *int64) string {
	s := path + ":" + op + ":" + user + ":" + token
	if exp != nil {
		s += ":" + strconv.FormatInt(*exp, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// pretty re-indents JSON as Python's json_format writes it.
func pretty(s string) []byte {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(s), "", "  "); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// pyStart is a StartRequest as the Python SDK's commands.run sends it.
func pyStart(cmd string, tag *string, stdin bool) []byte {
	m := map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", cmd}, "envs": map[string]string{}}, "stdin": stdin}
	if tag != nil {
		m["tag"] = *tag
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	return b
}

// envdClient calls a sandbox's envd through the E2B listener, routed by
// the E2b-Sandbox-* headers.
type envdClient struct {
	url, id, token string
}

func (c *envdClient) request(t *testing.T, ctx context.Context, method, path string, body []byte, token bool, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, c.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", c.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("User-Agent", "e2b-python-sdk/2.34.0")
	if token {
		req.Header.Set("X-Access-Token", c.token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func (c *envdClient) call(t *testing.T, method, path string, body []byte, token bool, headers ...string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp := c.request(t, ctx, method, path, body, token, headers...)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (c *envdClient) do(t *testing.T, method, path string, body []byte, headers ...string) (int, []byte) {
	t.Helper()
	return c.call(t, method, path, body, true, headers...)
}

func (c *envdClient) doNoToken(t *testing.T, method, path string, body []byte, headers ...string) (int, []byte) {
	t.Helper()
	return c.call(t, method, path, body, false, headers...)
}

// unary calls a unary procedure as the Python SDK does.
func (c *envdClient) unary(t *testing.T, proc string, body []byte) (int, []byte) {
	t.Helper()
	return c.do(t, "POST", proc, body, "Content-Type", "application/json", "Connect-Protocol-Version", "1",
		"Content-Encoding", "identity", "Connect-Timeout-Ms", "60000")
}

func (c *envdClient) unaryOK(t *testing.T, proc string, body []byte) string {
	t.Helper()
	status, b := c.unary(t, proc, body)
	if status != 200 {
		t.Fatalf("%s %s: %d %s", proc, body, status, b)
	}
	return string(b)
}

func (c *envdClient) unaryJSON(t *testing.T, proc string, body []byte, out any) {
	t.Helper()
	if err := json.Unmarshal([]byte(c.unaryOK(t, proc, body)), out); err != nil {
		t.Fatalf("%s: %v", proc, err)
	}
}

// envdStream is a server stream being read.
type envdStream struct {
	resp   *http.Response
	cancel context.CancelFunc
	endErr string // the end-of-stream message's error, "" if none
	ended  bool
}

// envelopeOf puts msg in an envelope.
func envelopeOf(msg []byte) []byte {
	env := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(env[1:], uint32(len(msg)))
	return append(env, msg...)
}

// open starts a streaming call with msg in an envelope, as the Python SDK
// does; timeoutMS 0 sends no Connect-Timeout-Ms.
func (c *envdClient) open(t *testing.T, proc string, msg []byte, timeoutMS int) *envdStream {
	t.Helper()
	return c.openRaw(t, proc, envelopeOf(msg), timeoutMS)
}

// openRaw starts a streaming call with body as it is, and more headers.
func (c *envdClient) openRaw(t *testing.T, proc string, body []byte, timeoutMS int, more ...string) *envdStream {
	t.Helper()
	headers := []string{"Content-Type", "application/connect+json", "Connect-Protocol-Version", "1",
		"Connect-Content-Encoding", "identity", "Keepalive-Ping-Interval", "50"}
	headers = append(headers, more...)
	if timeoutMS > 0 {
		headers = append(headers, "Connect-Timeout-Ms", strconv.Itoa(timeoutMS))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	resp := c.request(t, ctx, "POST", proc, body, true, headers...)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		b, _ := io.ReadAll(resp.Body)
		cancel()
		t.Fatalf("%s: %d %s", proc, resp.StatusCode, b)
	}
	st := &envdStream{resp: resp, cancel: cancel}
	t.Cleanup(st.close)
	return st
}

// start opens Process.Start with the SDK's default 60 s timeout.
func (c *envdClient) start(t *testing.T, msg []byte) *envdStream {
	t.Helper()
	return c.open(t, "/process.Process/Start", msg, 60000)
}

func (st *envdStream) close() {
	st.cancel()
	st.resp.Body.Close()
}

// nextRaw returns the next message, skipping keepalives; it fails the
// test at the end of the stream.
func (st *envdStream) nextRaw(t *testing.T) string {
	t.Helper()
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(st.resp.Body, hdr[:]); err != nil {
			t.Fatalf("read envelope: %v", err)
		}
		p := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(st.resp.Body, p); err != nil {
			t.Fatalf("read message: %v", err)
		}
		if hdr[0]&2 != 0 {
			st.ended = true
			var e struct{ Error *json.RawMessage }
			json.Unmarshal(p, &e)
			if e.Error != nil {
				st.endErr = string(*e.Error)
			}
			return ""
		}
		if s := string(p); s != `{"event":{"keepalive":{}}}` && s != `{"keepalive":{}}` {
			return s
		}
	}
}

type processEvent struct {
	Event struct {
		Start *struct{ PID uint32 }
		Data  *struct{ Stdout, Stderr, Pty []byte }
		End   *struct {
			ExitCode int32
			Exited   bool
			Status   string
			Error    *string
		}
	}
}

func (st *envdStream) next(t *testing.T) processEvent {
	t.Helper()
	raw := st.nextRaw(t)
	if st.ended {
		t.Fatalf("the stream ended early: %s", st.endErr)
	}
	var ev processEvent
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		t.Fatalf("event %s: %v", raw, err)
	}
	return ev
}

func (st *envdStream) startPID(t *testing.T) uint32 {
	t.Helper()
	ev := st.next(t)
	if ev.Event.Start == nil {
		t.Fatalf("the first event is not start: %+v", ev)
	}
	return ev.Event.Start.PID
}

// drain reads to the end event and then the end of the stream.
func (st *envdStream) drain(t *testing.T) (stdout, stderr string, end struct {
	ExitCode int32
	Exited   bool
	Status   string
	Error    *string
}) {
	t.Helper()
	for {
		ev := st.next(t)
		switch {
		case ev.Event.Data != nil:
			stdout += string(ev.Event.Data.Stdout)
			stderr += string(ev.Event.Data.Stderr)
		case ev.Event.End != nil:
			end = *ev.Event.End
			if raw := st.nextRaw(t); !st.ended {
				t.Fatalf("a message after the end: %s", raw)
			}
			return
		}
	}
}

// drainToEnd reads to the end of the stream, whatever comes.
func (st *envdStream) drainToEnd(t *testing.T) {
	t.Helper()
	for !st.ended {
		st.nextRaw(t)
	}
}
