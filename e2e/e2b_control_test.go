package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestE2BControlPlane drives E2B's control plane over raw HTTP against
// real VMs: create (v1 and v2), info, list, setTimeout, pause, connect,
// kill, with the sandbox traffic of the same listener routed by header
// and by Host. It checks the wire, where TestE2BSDK checks what the SDK
// makes of it.
func TestE2BControlPlane(t *testing.T) {
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	const domain = "e2b.ctl.test"
	s := newServer(t, "--e2b-listen", addr, "--e2b-domain", domain)
	var key apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.key, apiv1.CreateKey{Name: "e2b-ctl", Format: apiv1.KeyFormatE2B}, &key)

	e2b := "http://" + addr
	// call sends a request to the E2B listener with the key (unless
	// header says otherwise) and returns the status, header and body.
	call := func(t *testing.T, method, path, body string, header ...string) (int, http.Header, []byte) {
		t.Helper()
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, e2b+path, r)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-KEY", key.Key)
		for i := 0; i+1 < len(header); i += 2 {
			if header[i] == "Host" {
				req.Host = header[i+1]
			} else {
				req.Header.Set(header[i], header[i+1])
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header, b
	}
	must := func(t *testing.T, want int, method, path, body string, out any) http.Header {
		t.Helper()
		status, h, b := call(t, method, path, body)
		if status != want {
			t.Fatalf("%s %s: %d %s, want %d\nserver output:\n%s", method, path, status, b, want, s.output())
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s %s: %v in %s", method, path, err, b)
			}
		}
		return h
	}
	type sandbox struct {
		SandboxID, TemplateID, ClientID, EnvdVersion, EnvdAccessToken string
		Domain                                                        *string
	}
	type detail struct {
		SandboxID, State string
		EndAt            time.Time
		CPUCount         int
		Metadata         map[string]string
	}
	health := func(t *testing.T, id string) int {
		t.Helper()
		status, _, _ := call(t, "GET", "/health", "", "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49983")
		return status
	}

	// v2 create: 201 once it runs, with an envd token that works.
	start := time.Now()
	var sb sandbox
	must(t, 201, "POST", "/v2/sandboxes", `{"templateID":"tiny","timeout":120,"metadata":{"suite":"e2b-ctl"}}`, &sb)
	id := sb.SandboxID
	t.Cleanup(func() { call(t, "DELETE", "/sandboxes/"+id, "") })
	if !strings.HasPrefix(id, "sbx") || sb.TemplateID != "tiny" || sb.ClientID != "6532622b" ||
		sb.EnvdAccessToken == "" || sb.EnvdVersion == "" || sb.Domain == nil || *sb.Domain != domain {
		t.Fatalf("create: %+v", sb)
	}
	t.Logf("create answered in %v", time.Since(start))
	if h := health(t, id); h != http.StatusNoContent {
		t.Errorf("envd /health by header: %d", h)
	}
	status, _, body := call(t, "POST", "/process.Process/List", "{}", "Host", "49983-"+id+"."+domain,
		"Content-Type", "application/json", "Connect-Protocol-Version", "1", "X-Access-Token", sb.EnvdAccessToken)
	if status != 200 {
		t.Errorf("envd List by Host with the token: %d %s", status, body)
	}
	status, _, _ = call(t, "POST", "/process.Process/List", "{}", "E2b-Sandbox-Id", id,
		"Content-Type", "application/json", "Connect-Protocol-Version", "1", "X-Access-Token", "ea_wrong")
	if status != 401 {
		t.Errorf("envd List with a wrong token: %d, want 401", status)
	}

	// A guest port, through the sandbox's gateway, by Host.
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec", s.key, apiv1.CommandRequest{
		Cmd: "mkdir -p /tmp/www && echo hello-e2b > /tmp/www/index.html && busybox httpd -p 8080 -h /tmp/www",
	}, &res)
	if res.ExitCode != 0 {
		t.Fatalf("start httpd: %+v", res)
	}
	var page []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if status, _, page = call(t, "GET", "/index.html", "", "Host", "8080-"+id+"."+domain); status == 200 {
			break
		}
	}
	if strings.TrimSpace(string(page)) != "hello-e2b" {
		t.Errorf("port 8080 by Host: %d %q", status, page)
	}

	// Info and list.
	var d detail
	must(t, 200, "GET", "/sandboxes/"+id, "", &d)
	if d.State != "running" || d.CPUCount < 1 || d.Metadata["suite"] != "e2b-ctl" || time.Until(d.EndAt) > 121*time.Second {
		t.Errorf("info: %+v", d)
	}
	var list []detail
	h := must(t, 200, "GET", "/v2/sandboxes?state=running", "", &list)
	if len(list) != 1 || list[0].SandboxID != id || h.Get("X-Total-Running") != "1" {
		t.Errorf("list running: %+v %v", list, h)
	}

	// setTimeout moves the end.
	must(t, 204, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":900}`, nil)
	must(t, 200, "GET", "/sandboxes/"+id, "", &d)
	if e := time.Until(d.EndAt); e < 890*time.Second || e > 901*time.Second {
		t.Errorf("after setTimeout 900 the end is in %v", e)
	}

	// pause: suspended, no traffic, 409 the second time.
	must(t, 204, "POST", "/sandboxes/"+id+"/pause", `{}`, nil)
	must(t, 200, "GET", "/sandboxes/"+id, "", &d)
	if d.State != "paused" || d.EndAt.Year() != 9999 {
		t.Errorf("after pause: %+v", d)
	}
	if status, _, b := call(t, "POST", "/sandboxes/"+id+"/pause", `{}`); status != 409 || !strings.Contains(string(b), `"code":409`) {
		t.Errorf("second pause: %d %s", status, b)
	}
	if h := health(t, id); h != http.StatusBadGateway {
		t.Errorf("envd /health of a paused sandbox: %d, want 502", h)
	}
	must(t, 200, "GET", "/v2/sandboxes?state=paused", "", &list)
	if len(list) != 1 || list[0].State != "paused" {
		t.Errorf("list paused: %+v", list)
	}

	// connect wakes it (201), with the file the server wrote still there,
	// and a second connect finds it running (200).
	var again sandbox
	must(t, 201, "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":300}`, &again)
	if again.SandboxID != id || again.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("connect: %+v, want the same sandbox and token", again)
	}
	if h := health(t, id); h != http.StatusNoContent {
		t.Errorf("envd /health after connect: %d", h)
	}
	s.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec", s.key, apiv1.CommandRequest{Cmd: "cat /tmp/www/index.html"}, &res)
	if strings.TrimSpace(res.Stdout) != "hello-e2b" {
		t.Errorf("after pause and connect: %+v", res)
	}
	must(t, 200, "POST", "/sandboxes/"+id+"/connect", `{"timeout":60}`, &again)
	must(t, 200, "GET", "/sandboxes/"+id, "", &d)
	if e := time.Until(d.EndAt); d.State != "running" || e < 290*time.Second {
		t.Errorf("after connects: %+v (a shorter connect must not shorten the lease; ends in %v)", d, e)
	}

	// v1 create as the Python SDK sends it, then kill both.
	var sb1 sandbox
	must(t, 201, "POST", "/sandboxes", `{"templateID":"tiny","allow_internet_access":true,"autoPause":false,"autoResume":{"enabled":false},"envVars":{"E2B_CTL":"1"},"metadata":{},"secure":true,"timeout":300}`, &sb1)
	t.Cleanup(func() { call(t, "DELETE", "/sandboxes/"+sb1.SandboxID, "") })
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb1.SandboxID+"/exec", s.key, apiv1.CommandRequest{Cmd: "echo $E2B_CTL"}, &res)
	if strings.TrimSpace(res.Stdout) != "1" {
		t.Errorf("envVars: %+v", res)
	}
	// E2B's network calls meet the same closed ranges as airlock's: 403
	// naming the entry, and nothing changes.
	for _, bad := range []struct{ path, method, body string }{
		{"/sandboxes/" + sb1.SandboxID + "/network", "PUT", `{"allowOut":["169.254.169.254"],"denyOut":["0.0.0.0/0"]}`},
		{"/sandboxes", "POST", `{"templateID":"tiny","network":{"allowOut":["127.0.0.1"],"denyOut":["0.0.0.0/0"]}}`},
	} {
		if status, _, b := call(t, bad.method, bad.path, bad.body); status != 403 || !strings.Contains(string(b), "always denied") {
			t.Errorf("%s %s %s: %d %s, want 403", bad.method, bad.path, bad.body, status, b)
		}
	}
	for _, kill := range []string{id, sb1.SandboxID} {
		must(t, 204, "DELETE", "/sandboxes/"+kill, "", nil)
		if status, _, b := call(t, "GET", "/sandboxes/"+kill, ""); status != 404 || !strings.Contains(string(b), `"code":404`) {
			t.Errorf("info after kill: %d %s", status, b)
		}
		if status, _, _ := call(t, "DELETE", "/sandboxes/"+kill, ""); status != 404 {
			t.Errorf("second kill: %d", status)
		}
		if h := health(t, kill); h != http.StatusBadGateway {
			t.Errorf("envd /health of a killed sandbox: %d, want 502", h)
		}
	}
	must(t, 200, "GET", "/v2/sandboxes", "", &list)
	if len(list) != 0 {
		t.Errorf("list after kills: %+v", list)
	}
}
