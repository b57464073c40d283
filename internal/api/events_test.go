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

// /v1/webhooks as a user key would attack it: addresses egress denies,
// bad bodies, another key's webhook, more than a key may have.
func TestWebhooksAPI(t *testing.T) {
	s := newSecretServer(t)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:7700/v1/keys", "http://[::1]/", "http://10.0.0.5/"} {
		a := s.must(t, 403, "POST", "/v1/webhooks", s.user, fmt.Sprintf(`{"url": %q}`, u), nil)
		if !strings.Contains(string(a.body), "--webhook-private") {
			t.Errorf("%s refused without saying how to open it: %s", u, a.body)
		}
	}
	for _, body := range []string{`{"url": 5}`, `{"url": "https://example.com/", "extra": 1}`, `{}`, `{"url": "file:///etc/passwd"}`,
		`{"url": "https://example.com/", "types": ["x"]}`, `not json`, `{"url": "https://example.com/` + strings.Repeat("a", 2<<20) + `"}`} {
		if a := s.do(t, "POST", "/v1/webhooks", s.user, body); a.status != 400 && a.status != 413 {
			t.Errorf("body %.60q: %d %s", body, a.status, a.body)
		}
	}
	var created apiv1.WebhookCreated
	s.must(t, 201, "POST", "/v1/webhooks", s.user, `{"url": "https://hooks.example.com/a", "types": ["sandbox.*"]}`, &created)
	if !strings.HasPrefix(created.ID, "whk") || !strings.HasPrefix(created.Secret, "whsec_") || created.Types[0] != "sandbox.*" {
		t.Fatalf("created %+v", created)
	}
	var k apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.admin, `{"name": "other"}`, &k)
	s.must(t, 404, "GET", "/v1/webhooks/"+created.ID+"/deliveries", k.Key, "", nil)
	s.must(t, 404, "DELETE", "/v1/webhooks/"+created.ID, k.Key, "", nil)
	var theirs apiv1.List[apiv1.Webhook]
	s.must(t, 200, "GET", "/v1/webhooks", k.Key, "", &theirs)
	if len(theirs.Items) != 0 {
		t.Fatalf("another key lists %+v", theirs.Items)
	}
	var mine apiv1.List[apiv1.Webhook]
	a := s.must(t, 200, "GET", "/v1/webhooks", s.user, "", &mine)
	if len(mine.Items) != 1 || strings.Contains(string(a.body), created.Secret) || strings.Contains(string(a.body), "secret") {
		t.Fatalf("the list: %s", a.body)
	}
	var ds apiv1.List[apiv1.Delivery]
	s.must(t, 200, "GET", "/v1/webhooks/"+created.ID+"/deliveries", s.user, "", &ds)
	if ds.Items == nil || len(ds.Items) != 0 {
		t.Fatalf("deliveries of a new webhook: %+v", ds)
	}
	for i := 1; i < 10; i++ {
		s.must(t, 201, "POST", "/v1/webhooks", s.user, `{"url": "https://hooks.example.com/more"}`, nil)
	}
	s.must(t, 429, "POST", "/v1/webhooks", s.user, `{"url": "https://hooks.example.com/one-too-many"}`, nil)
	s.must(t, 204, "DELETE", "/v1/webhooks/"+created.ID, s.user, "", nil)
	s.must(t, 404, "DELETE", "/v1/webhooks/"+created.ID, s.user, "", nil)
	s.must(t, 404, "DELETE", "/v1/webhooks/whk..%2F..%2Fkeys", s.user, "", nil)
}
