package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

var (
	admin    = tenancy.Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}
	alice    = tenancy.Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	bob      = tenancy.Principal{KeyID: "keybob", Role: apiv1.RoleUser}
	loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
)

type fixture struct {
	st  *store.Store
	box *secrets.Box
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	box, err := secrets.OpenBox(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, box: box}
}

func (f *fixture) service(cfg Config) *Service {
	cfg.Store, cfg.Secrets = f.st, f.box
	if cfg.Private == nil {
		cfg.Private = loopback
	}
	return New(cfg)
}

// run runs s until the test ends.
func run(t *testing.T, s *Service) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// sandbox records a sandbox of owner going to running: two events.
func (f *fixture) sandbox(t *testing.T, id, owner string) {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{ID: id, Owner: owner, State: apiv1.StateCreating, TemplateRef: "tiny:latest", TemplateDigest: "sha256:aa",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{}, Metadata: map[string]string{}}
	if err := f.st.InsertSandbox(ctx, sb, store.Operation{ID: "op" + id, Kind: apiv1.OpCreate, TargetID: id, Owner: owner, Status: apiv1.OpPending}); err != nil {
		t.Fatal(err)
	}
	sb.State = apiv1.StateRunning
	if err := f.st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

// receiver is a webhook receiver on loopback that answers each request
// with the next of answers (200 once they run out) and keeps what came.
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	answers []int
	got     []received
}

type received struct {
	header http.Header
	body   []byte
	event  apiv1.Event
	status int
}

func newReceiver(t *testing.T, answers ...int) *receiver {
	r := &receiver{answers: answers}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var ev apiv1.Event
		json.Unmarshal(body, &ev)
		r.mu.Lock()
		status := 200
		if len(r.answers) > 0 {
			status, r.answers = r.answers[0], r.answers[1:]
		}
		r.got = append(r.got, received{req.Header.Clone(), body, ev, status})
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

// wait returns what came once n requests did, failing after 20 s.
func (r *receiver) wait(t *testing.T, n int) []received {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r.mu.Lock()
		got := append([]received(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
	}
	t.Fatalf("the receiver got fewer than %d requests", n)
	return nil
}

// deliveries returns webhook id's recorded attempts once there are n,
// failing after 20 s: an attempt is recorded just after its receiver
// answers.
func deliveries(t *testing.T, s *Service, p tenancy.Principal, id string, n int) []apiv1.Delivery {
	t.Helper()
	var ds apiv1.List[apiv1.Delivery]
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ds, err = s.Deliveries(context.Background(), p, id); err != nil || len(ds.Items) >= n {
			break
		}
	}
	if err != nil || len(ds.Items) < n {
		t.Fatalf("deliveries of %s: %+v, %v; want %d", id, ds.Items, err, n)
	}
	return ds.Items
}

func checkSigned(t *testing.T, rc received, secret string) {
	t.Helper()
	sig := rc.header.Get("Airlock-Signature")
	ts, _, _ := strings.Cut(strings.TrimPrefix(sig, "t="), ",")
	var at int64
	if err := json.Unmarshal([]byte(ts), &at); err != nil {
		t.Fatalf("signature %q has no time", sig)
	}
	if want := Sign([]byte(secret), time.Unix(at, 0), rc.body); sig != want {
		t.Fatalf("signature %q, want %q", sig, want)
	}
	if rc.header.Get("Airlock-Event-Id") != rc.event.ID || !strings.HasPrefix(rc.event.ID, "evt") {
		t.Fatalf("Airlock-Event-Id %q for event %+v", rc.header.Get("Airlock-Event-Id"), rc.event)
	}
}

// A webhook gets its key's events from its creation on, in order, each
// signed under the secret shown once; other keys' events are not sent.
func TestDeliversInOrderSigned(t *testing.T) {
	f := newFixture(t)
	f.sandbox(t, "sbxbefore", alice.KeyID) // before the webhook: not sent
	s := f.service(Config{})
	rcv := newReceiver(t)
	created, err := s.Create(context.Background(), alice, apiv1.CreateWebhook{URL: rcv.URL + "/hook", Types: []string{"sandbox.*"}})
	if err != nil || !strings.HasPrefix(created.Secret, "whsec_") || !strings.HasPrefix(created.ID, "whk") {
		t.Fatalf("create: %+v, %v", created, err)
	}
	run(t, s)
	f.sandbox(t, "sbxbob", bob.KeyID)
	f.sandbox(t, "sbxone", alice.KeyID)
	f.sandbox(t, "sbxtwo", alice.KeyID)
	rcv.wait(t, 4)
	time.Sleep(300 * time.Millisecond) // nothing more comes
	got := rcv.wait(t, 4)
	var seq []string
	for i, rc := range got {
		checkSigned(t, rc, created.Secret)
		if i > 0 && rc.event.Seq <= got[i-1].event.Seq {
			t.Fatalf("out of order: %d after %d", rc.event.Seq, got[i-1].event.Seq)
		}
		seq = append(seq, rc.event.Type+" "+rc.event.SandboxID)
	}
	if want := "sandbox.created sbxone,sandbox.running sbxone,sandbox.created sbxtwo,sandbox.running sbxtwo"; strings.Join(seq, ",") != want {
		t.Fatalf("delivered %v, want %s", seq, want)
	}
	ds := deliveries(t, s, alice, created.ID, 4)
	if len(ds) != 4 || ds[0].Status != 200 || ds[0].Attempt != 1 || ds[0].Error != "" {
		t.Fatalf("deliveries %+v", ds)
	}
}

// A receiver that fails gets the event again after a backoff, signed
// again, and the next event only after it; every attempt is recorded.
func TestRetriesInOrder(t *testing.T) {
	f := newFixture(t)
	s := f.service(Config{})
	rcv := newReceiver(t, 500, 503)
	created, err := s.Create(context.Background(), alice, apiv1.CreateWebhook{URL: rcv.URL, Secret: "a-secret-of-mine-16+"})
	if err != nil || created.Secret != "" {
		t.Fatalf("create with a secret: %+v, %v; the secret is not shown back", created, err)
	}
	run(t, s)
	start := time.Now()
	f.sandbox(t, "sbxone", alice.KeyID)
	got := rcv.wait(t, 4)
	if got[0].event.ID != got[1].event.ID || got[1].event.ID != got[2].event.ID || got[3].event.Type != apiv1.EventSandboxRunning {
		t.Fatalf("attempts: %s %s %s %s", got[0].event.Type, got[1].event.Type, got[2].event.Type, got[3].event.Type)
	}
	for _, rc := range got {
		checkSigned(t, rc, "a-secret-of-mine-16+")
	}
	if took := time.Since(start); took < Backoff(1)+Backoff(2)-time.Second || took > 20*time.Second {
		t.Errorf("three attempts and the next event took %s; backoffs %s and %s", took, Backoff(1), Backoff(2))
	}
	ds := deliveries(t, s, alice, created.ID, 4)
	if len(ds) != 4 {
		t.Fatalf("deliveries %+v", ds)
	}
	// Newest first: the running event, then the created one's third,
	// second and first attempts.
	if d := ds[3]; d.Attempt != 1 || d.Status != 500 || !strings.Contains(d.Error, "500") {
		t.Errorf("first attempt recorded as %+v", d)
	}
	if d := ds[1]; d.Attempt != 3 || d.Status != 200 || d.Error != "" {
		t.Errorf("third attempt recorded as %+v", d)
	}
}

// An event that fails for RetryFor is given up, said so, and the next
// one goes.
func TestGivesUp(t *testing.T) {
	f := newFixture(t)
	// An attempt (an HTTP round trip) takes longer than RetryFor: the
	// first failure is past it.
	s := f.service(Config{RetryFor: time.Nanosecond})
	rcv := newReceiver(t, 500, 500, 500, 500)
	created, err := s.Create(context.Background(), alice, apiv1.CreateWebhook{URL: rcv.URL, Types: []string{"sandbox.running"}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s)
	f.sandbox(t, "sbxone", alice.KeyID)
	f.sandbox(t, "sbxtwo", alice.KeyID)
	got := rcv.wait(t, 2)
	if got[0].event.SandboxID != "sbxone" || got[1].event.SandboxID != "sbxtwo" {
		t.Fatalf("after giving up on sbxone's event: %+v", got[1].event)
	}
	ds := deliveries(t, s, alice, created.ID, 2)
	if !strings.Contains(ds[len(ds)-1].Error, "given up") {
		t.Fatalf("deliveries %+v", ds)
	}
}

// Addresses egress always denies are refused when the webhook is made,
// and, for a name that resolves to one, when a delivery connects.
func TestAddressChecks(t *testing.T) {
	f := newFixture(t)
	s := f.service(Config{Private: []netip.Prefix{}})
	ctx := context.Background()
	for _, u := range []string{
		"http://169.254.169.254/latest/meta-data", "http://127.0.0.1:8080/", "http://10.0.0.1/", "http://192.168.1.1/",
		"http://[::1]:9/", "http://[::ffff:169.254.169.254]/", "http://0.0.0.0/", "http://100.64.0.1/", "http://224.0.0.1/",
	} {
		if _, err := s.Create(ctx, alice, apiv1.CreateWebhook{URL: u}); !errors.Is(err, errdefs.ErrPermission) || !strings.Contains(err.Error(), "--webhook-private") {
			t.Errorf("%s: %v, want refused with how to open it", u, err)
		}
	}
	for _, u := range []string{
		"", "ftp://example.com/", "example.com/hook", "http://", "http://user:pw@example.com/", "http://example.com/#frag",
		"http://example.com/\x00", "http://example.com/" + strings.Repeat("a", MaxURL), "javascript:alert(1)", "http://exa mple.com/",
	} {
		if _, err := s.Create(ctx, alice, apiv1.CreateWebhook{URL: u}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v, want invalid", u, err)
		}
	}
	for _, bad := range []apiv1.CreateWebhook{
		{URL: "https://example.com/", Types: []string{"sandbox.nope"}},
		{URL: "https://example.com/", Secret: "short"},
		{URL: "https://example.com/", Secret: strings.Repeat("s", MaxSecret+1)},
		{URL: "https://example.com/", Secret: "sixteen-bytes-and\x00nul"},
	} {
		if _, err := s.Create(ctx, alice, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", bad, err)
		}
	}
	if ws, _ := s.List(ctx, admin); len(ws.Items) != 0 {
		t.Fatalf("refused webhooks were stored: %+v", ws.Items)
	}

	// A name is checked where it leads: localhost is loopback.
	rcv := newReceiver(t)
	u := strings.Replace(rcv.URL, "127.0.0.1", "localhost", 1)
	created, err := s.Create(ctx, alice, apiv1.CreateWebhook{URL: u})
	if err != nil {
		t.Fatal(err)
	}
	f.sandbox(t, "sbxone", alice.KeyID)
	w, err := f.st.GetWebhook(ctx, created.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Attempt(ctx, w); ok || err != nil {
		t.Fatalf("attempt to a name that resolves to loopback: delivered %v, %v", ok, err)
	}
	ds, _ := s.Deliveries(ctx, alice, created.ID)
	if len(ds.Items) != 1 || !strings.Contains(ds.Items[0].Error, "always denied") || len(rcv.got) != 0 {
		t.Fatalf("delivery to localhost: %+v; receiver got %d", ds.Items, len(rcv.got))
	}
}

// A key sees, lists and deletes its own webhooks only; an admin key's
// webhook gets every key's events; a key has MaxPerKey at most.
func TestTenancy(t *testing.T) {
	f := newFixture(t)
	s := f.service(Config{})
	ctx := context.Background()
	rcv := newReceiver(t)
	mine, err := s.Create(ctx, alice, apiv1.CreateWebhook{URL: rcv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Deliveries(ctx, bob, mine.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob read alice's deliveries: %v", err)
	}
	if err := s.Delete(ctx, bob, mine.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("bob deleted alice's webhook: %v", err)
	}
	for _, id := range []string{"whk/../x", "whk\x00", strings.Repeat("w", 5000), ""} {
		if err := s.Delete(ctx, alice, id); !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("delete %q: %v", id, err)
		}
	}
	if l, _ := s.List(ctx, bob); len(l.Items) != 0 {
		t.Errorf("bob lists %+v", l.Items)
	}
	if l, _ := s.List(ctx, admin); len(l.Items) != 1 {
		t.Errorf("admin lists %+v", l.Items)
	}
	for i := 1; i < MaxPerKey; i++ {
		if _, err := s.Create(ctx, alice, apiv1.CreateWebhook{URL: rcv.URL}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, alice, apiv1.CreateWebhook{URL: rcv.URL}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Errorf("webhook %d: %v, want refused", MaxPerKey+1, err)
	}
	l, _ := s.List(ctx, alice)
	for _, w := range l.Items {
		if err := s.Delete(ctx, alice, w.ID); err != nil {
			t.Fatal(err)
		}
	}

	all := newReceiver(t)
	if _, err := s.Create(ctx, admin, apiv1.CreateWebhook{URL: all.URL, Types: []string{"sandbox.created"}}); err != nil {
		t.Fatal(err)
	}
	run(t, s)
	f.sandbox(t, "sbxalice", alice.KeyID)
	f.sandbox(t, "sbxbob", bob.KeyID)
	got := all.wait(t, 2)
	if got[0].event.SandboxID != "sbxalice" || got[1].event.SandboxID != "sbxbob" {
		t.Fatalf("the admin's webhook got %s, %s", got[0].event.SandboxID, got[1].event.SandboxID)
	}
}

// Several servers delivering from one store send each event once, in
// order: the lease lets one at a time work on a webhook.
func TestServersShareTheWork(t *testing.T) {
	f := newFixture(t)
	rcv := newReceiver(t)
	first := f.service(Config{})
	if _, err := first.Create(context.Background(), alice, apiv1.CreateWebhook{URL: rcv.URL}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		run(t, f.service(Config{}))
	}
	for _, id := range []string{"sbxa", "sbxb", "sbxc", "sbxd", "sbxe"} {
		f.sandbox(t, id, alice.KeyID)
	}
	rcv.wait(t, 10)
	time.Sleep(500 * time.Millisecond) // nothing more comes
	got := rcv.wait(t, 10)
	if len(got) != 10 {
		t.Fatalf("%d deliveries of 10 events", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].event.Seq <= got[i-1].event.Seq {
			t.Fatalf("delivery %d: seq %d after %d", i, got[i].event.Seq, got[i-1].event.Seq)
		}
	}
}

func TestParsePrivate(t *testing.T) {
	if got, err := ParsePrivate("127.0.0.1, 10.1.0.0/16,::1"); err != nil || len(got) != 3 || got[0].Bits() != 32 {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"0.0.0.0/0", "10.0.0.0/7", "nope", "::/0", "1.2.3.4/33"} {
		if _, err := ParsePrivate(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
