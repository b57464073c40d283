package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestIdleSandbox creates a real sandbox with idle_s, which the server
// suspends once nothing uses it, with a sandbox.idle event; GETs of it
// leave it suspended; then an exec, a file read and a request to a port
// of its each wake it and get their answer, from the processes and files
// it had.
func TestIdleSandbox(t *testing.T) {
	s := sharedServer(t)
	idle := 3
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "base", IdleS: &idle})
	if sb.IdleS != idle || sb.OnIdle != "suspend" || !sb.WakeOnRequest {
		t.Fatalf("view: idle_s %d, on_idle %q, wake_on_request %v", sb.IdleS, sb.OnIdle, sb.WakeOnRequest)
	}
	p := "/v1/sandboxes/" + sb.ID
	s.must(t, 204, "PUT", p+"/files?path=/root/www/hello.txt", s.key, "hello from before", nil)
	var res apiv1.ExecResult
	s.must(t, 200, "POST", p+"/exec", s.key, apiv1.CommandRequest{
		Cmd: "cd /root/www && nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 & for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.2; done; exit 1",
	}, &res)
	if res.ExitCode != 0 {
		t.Fatalf("the guest's server did not start: %+v", res)
	}

	// suspended waits for the server to suspend the idle sandbox, reading
	// its state meanwhile, which is no use of it.
	suspended := func(after string) {
		t.Helper()
		if got := s.waitState(t, sb.ID, 2*time.Minute, apiv1.StateSuspended); got.State != apiv1.StateSuspended {
			t.Fatalf("%s, the idle sandbox is still %s", after, got.State)
		}
		if got := s.state(t, sb.ID); got.State != apiv1.StateSuspended {
			t.Fatalf("a GET woke the sandbox: %s", got.State)
		}
	}
	wakes := []struct {
		name string
		call func() string
	}{
		{"exec", func() string {
			var out apiv1.ExecResult
			s.must(t, 200, "POST", p+"/exec", s.key, apiv1.CommandRequest{Cmd: "cat /root/www/hello.txt"}, &out)
			return out.Stdout
		}},
		{"file read", func() string {
			status, b := s.call(t, "GET", p+"/files?path=/root/www/hello.txt", s.key, nil)
			if status != 200 {
				t.Fatalf("file read: %d %s", status, b)
			}
			return string(b)
		}},
		{"port request", func() string {
			status, b := s.call(t, "GET", p+"/ports/8000/hello.txt", s.key, nil)
			if status != 200 {
				t.Fatalf("port request: %d %s", status, b)
			}
			return string(b)
		}},
	}
	after := "after its setup"
	for _, w := range wakes {
		suspended(after)
		start := time.Now()
		if got := w.call(); strings.TrimSpace(got) != "hello from before" {
			t.Fatalf("%s on the suspended sandbox: %q", w.name, got)
		}
		t.Logf("%s woke the sandbox and answered in %v", w.name, time.Since(start).Round(time.Millisecond))
		if got := s.state(t, sb.ID); got.State != apiv1.StateRunning {
			t.Fatalf("after the %s the sandbox is %s", w.name, got.State)
		}
		after = "after the " + w.name
	}

	// Each suspend had its sandbox.idle event, each wake its woken.
	// The shared server's key has every other test's events too: read
	// them all, a page at a time.
	var got []string
	for after := int64(0); ; {
		var evs struct {
			Items []struct {
				Type      string          `json:"type"`
				SandboxID string          `json:"sandbox_id"`
				Data      json.RawMessage `json:"data"`
			} `json:"items"`
			LastSeq int64 `json:"last_seq"`
		}
		s.must(t, 200, "GET", fmt.Sprintf("/v1/events?type=sandbox.*&limit=1000&after_seq=%d", after), s.key, nil, &evs)
		for _, ev := range evs.Items {
			if ev.SandboxID == sb.ID && (ev.Type == apiv1.EventSandboxIdle || ev.Type == apiv1.EventSandboxSuspended || ev.Type == apiv1.EventSandboxWoken) {
				got = append(got, strings.TrimPrefix(ev.Type, "sandbox."))
			}
		}
		if len(evs.Items) == 0 || evs.LastSeq <= after {
			break
		}
		after = evs.LastSeq
	}
	// (It may have gone idle once more since.)
	want := "idle suspended woken idle suspended woken idle suspended woken"
	if !strings.HasPrefix(strings.Join(got, " "), want) {
		t.Errorf("events %v; want %s first", got, want)
	}
}
