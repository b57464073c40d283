package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/template"
)

// GET /v1/events: a key reads its own sandboxes' changes of state in
// order and waits for the next; another key sees none of them; bad
// parameters are refused with what to do.
func TestEventsAPI(t *testing.T) {
	s := newSecretServer(t)
	if _, err := s.rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	var so apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.user, `{"template": "base"}`, &so)

	// Held until the create's events come, in order.
	want := []string{apiv1.EventSandboxCreated, apiv1.EventSandboxRunning}
	var got []string
	var last int64
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		var evs apiv1.Events
		s.must(t, 200, "GET", fmt.Sprintf("/v1/events?after_seq=%d&wait_s=5", last), s.user, "", &evs)
		for _, ev := range evs.Items {
			if ev.SandboxID != so.Sandbox.ID || ev.Seq <= last || !strings.HasPrefix(ev.ID, "evt") {
				t.Fatalf("event %+v after seq %d", ev, last)
			}
			got, last = append(got, ev.Type), ev.Seq
		}
		if evs.LastSeq != last {
			t.Fatalf("last_seq %d, want %d", evs.LastSeq, last)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", got, want)
	}

	// Another key's view: nothing, at once without wait_s.
	var k apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.admin, `{"name": "other"}`, &k)
	var none apiv1.Events
	s.must(t, 200, "GET", "/v1/events", k.Key, "", &none)
	if len(none.Items) != 0 || none.LastSeq != 0 {
		t.Fatalf("another key sees %+v", none)
	}
	// The admin sees them all; the type filter keeps what it names.
	var running apiv1.Events
	a := s.must(t, 200, "GET", "/v1/events?type=sandbox.running,build.*&limit=10", s.admin, "", &running)
	if len(running.Items) != 1 || running.Items[0].Type != apiv1.EventSandboxRunning {
		t.Fatalf("admin, type filtered: %s", a.body)
	}
	var raw map[string]any
	if err := json.Unmarshal(a.body, &raw); err != nil || raw["items"] == nil || raw["last_seq"] == nil {
		t.Fatalf("the answer's shape: %s", a.body)
	}

	for _, bad := range []string{
		"?after_seq=-1", "?after_seq=x", "?after_seq=99999999999999999999", "?limit=0x10", "?limit=5000",
		"?wait_s=61", "?wait_s=-1", "?type=sandbox.exploded", "?type=%00", "?type=" + strings.Repeat("a", 5000),
		"?since=3",
	} {
		a := s.must(t, 400, "GET", "/v1/events"+bad, s.user, "", nil)
		if !strings.Contains(string(a.body), "invalid") {
			t.Errorf("%s answered %s", bad, a.body)
		}
	}
	s.must(t, 401, "GET", "/v1/events", "alk_nope", "", nil)
}
