package e2e

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// limitRefusal is the error of a 429 that names a limit.
type limitRefusal struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details struct {
			Limit     string `json:"limit"`
			Max       int64  `json:"max"`
			InUse     int64  `json:"in_use"`
			Requested int64  `json:"requested"`
		} `json:"details"`
	} `json:"error"`
}

func refusal(t *testing.T, status int, body []byte) limitRefusal {
	t.Helper()
	var r limitRefusal
	if status != 429 {
		t.Fatalf("status %d, want 429: %s", status, body)
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Error.Code != "resource_exhausted" {
		t.Fatalf("a 429 that is not resource_exhausted: %s", body)
	}
	return r
}

// TestKeyLimits checks a user key's limits through the API and the CLI:
// its defaults from the server, usage, creates racing for its last slot,
// a memory limit, and limits only an admin may change.
func TestKeyLimits(t *testing.T) {
	s := newServer(t, "--default-limits", "sandboxes=2,builds=0")
	var k apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.key, map[string]any{"name": "limited", "role": "user", "limits": map[string]any{"vcpus": 64}}, &k)
	if k.Limits.Sandboxes == nil || *k.Limits.Sandboxes != 2 || k.Limits.VCPUs == nil || *k.Limits.VCPUs != 64 || k.Limits.MemoryMiB != nil {
		t.Fatalf("limits of the new key %+v: want its own vcpus 64 and the default sandboxes 2", k.Limits)
	}
	var self apiv1.Key
	s.must(t, 200, "GET", "/v1/keys/self", k.Key, nil, &self)
	if self.ID != k.ID || self.Usage == nil || *self.Usage != (apiv1.Usage{}) {
		t.Fatalf("self %+v", self)
	}
	// A user key sees only itself, and changes no limits.
	if status, b := s.call(t, "GET", "/v1/keys/"+adminKeyID(t, s), k.Key, nil); status != 404 {
		t.Errorf("a user key reading the admin key: %d %s", status, b)
	}
	if status, b := s.call(t, "PATCH", "/v1/keys/"+k.ID, k.Key, `{"limits":{"sandboxes":100}}`); status != 403 {
		t.Errorf("a user key raising its own limits: %d %s", status, b)
	}
	for _, bad := range []string{`{"limits":{"sandboxes":-1}}`, `{"limits":{"sandboxes":"x"}}`, `{"limits":{"bogus":1}}`, `{}`} {
		if status, b := s.call(t, "PATCH", "/v1/keys/"+k.ID, s.key, bad); status != 400 {
			t.Errorf("PATCH %s: %d %s, want 400", bad, status, b)
		}
	}

	first := s.createSandbox(t, k.Key, apiv1.CreateSandbox{})
	// Four creates race for the one slot left: one gets it.
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	var bodies [][]byte
	for range 4 {
		wg.Go(func() {
			status, b := s.call(t, "POST", "/v1/sandboxes", k.Key, apiv1.CreateSandbox{Template: "tiny"})
			mu.Lock()
			statuses[status]++
			if status == 429 {
				bodies = append(bodies, b)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if statuses[202] != 1 || statuses[429] != 3 {
		t.Fatalf("racing creates answered %v, want one 202 and three 429", statuses)
	}
	r := refusal(t, 429, bodies[0])
	if d := r.Error.Details; d.Limit != "sandboxes" || d.Max != 2 || d.InUse != 2 || d.Requested != 1 {
		t.Errorf("details %+v, want sandboxes 2 in use of 2, 1 requested", d)
	}
	s.must(t, 200, "GET", "/v1/keys/self", k.Key, nil, &self)
	if u := self.Usage; u.Sandboxes != 2 || u.MemoryMiB < 2*int64(first.MemoryMiB) || u.VCPUs < 2 {
		t.Errorf("usage %+v after two creates of %d MiB", u, first.MemoryMiB)
	}

	// The admin raises sandboxes and caps memory at what is held.
	var got apiv1.Key
	s.must(t, 200, "PATCH", "/v1/keys/"+k.ID, s.key, map[string]any{"limits": map[string]any{"sandboxes": 10, "memory_mib": self.Usage.MemoryMiB}}, &got)
	if got.Limits.Sandboxes == nil || *got.Limits.Sandboxes != 10 || got.Limits.VCPUs != nil {
		t.Errorf("limits after PATCH %+v: want sandboxes 10 and vcpus back to the default (none)", got.Limits)
	}
	status, b := s.call(t, "POST", "/v1/sandboxes", k.Key, apiv1.CreateSandbox{Template: "tiny"})
	if d := refusal(t, status, b).Error.Details; d.Limit != "memory_mib" || d.InUse != self.Usage.MemoryMiB {
		t.Errorf("details %+v, want memory_mib", d)
	}
	// builds=0 by default: a build is refused before anything is recorded.
	status, b = s.call(t, "POST", "/v1/templates", k.Key, `{"name":"limited","from":"tiny","steps":[{"run":"true"}]}`)
	if d := refusal(t, status, b).Error.Details; d.Limit != "builds" || d.Max != 0 {
		t.Errorf("build details %+v", d)
	}
	// The admin key has no limits of its own.
	s.createSandbox(t, s.key, apiv1.CreateSandbox{})

	// The CLI: create with limits, show them, change them.
	res := serverCLI(t, s, "", "key", "create", "--name", "cli-limited", "--limit", "sandboxes=5", "--limit", "disk_mib=100", "--json")
	var ck apiv1.KeyCreated
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &ck) != nil || ck.Limits.Sandboxes == nil || *ck.Limits.Sandboxes != 5 || *ck.Limits.DiskMiB != 100 {
		t.Fatalf("key create --limit: %d %s %s", res.code, res.stdout, res.stderr)
	}
	res = serverCLI(t, s, "", "key", "set-limits", ck.ID, "--limit", "vcpus=3")
	if res.code != 0 || !strings.Contains(res.stdout, "vcpus") || !strings.Contains(res.stdout, "3") {
		t.Fatalf("key set-limits: %d %s %s", res.code, res.stdout, res.stderr)
	}
	res = serverCLI(t, s, "", "key", "get", ck.ID, "--json")
	var shown apiv1.Key
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &shown) != nil || *shown.Limits.VCPUs != 3 || *shown.Limits.Sandboxes != 2 {
		t.Fatalf("key get after set-limits (vcpus 3, sandboxes back to the default 2): %d %s %s", res.code, res.stdout, res.stderr)
	}
	for _, bad := range [][]string{{"key", "create", "--limit", "sandboxes=x"}, {"key", "create", "--limit", "nope=1"}, {"key", "set-limits", ck.ID}, {"key", "set-limits"}} {
		if res := serverCLI(t, s, "", bad...); res.code == 0 {
			t.Errorf("%v succeeded: %s", bad, res.stdout)
		}
	}
}

// adminKeyID is the ID of the server's admin key.
func adminKeyID(t *testing.T, s *server) string {
	t.Helper()
	var self apiv1.Key
	s.must(t, 200, "GET", "/v1/keys/self", s.key, nil, &self)
	return self.ID
}

// TestMemoryBudget checks the host's memory budget on creates and wakes.
func TestMemoryBudget(t *testing.T) {
	s := newServer(t, "--memory-budget", "400MiB")
	a := s.createSandbox(t, s.key, apiv1.CreateSandbox{MemoryMiB: 256})
	status, b := s.call(t, "POST", "/v1/sandboxes", s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 256})
	r := refusal(t, status, b)
	if d := r.Error.Details; d.Limit != "memory_budget_mib" || d.Max != 400 || d.InUse != 256 || d.Requested != 256 {
		t.Errorf("details %+v", d)
	}
	if !strings.Contains(r.Error.Message, "--memory-budget") {
		t.Errorf("message %q does not name the flag", r.Error.Message)
	}
	// Suspended, a's memory is free for another; then a cannot wake.
	s.lifecycle(t, a.ID, "suspend")
	s.createSandbox(t, s.key, apiv1.CreateSandbox{MemoryMiB: 256})
	status, b = s.call(t, "POST", "/v1/sandboxes/"+a.ID+"/wake", s.key, nil)
	if d := refusal(t, status, b).Error.Details; d.Limit != "memory_budget_mib" {
		t.Errorf("wake details %+v", d)
	}
	if st := s.state(t, a.ID).State; st != apiv1.StateSuspended {
		t.Errorf("a refused wake left the sandbox %s", st)
	}
}
