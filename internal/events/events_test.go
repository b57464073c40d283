package events

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

var (
	admin = tenancy.Principal{KeyID: "keyadmin", Role: apiv1.RoleAdmin}
	alice = tenancy.Principal{KeyID: "keyalice", Role: apiv1.RoleUser}
	bob   = tenancy.Principal{KeyID: "keybob", Role: apiv1.RoleUser}
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// newSandbox records a sandbox of owner, running, whose lease ends in
// lease (none for 0).
func newSandbox(t *testing.T, st *store.Store, id, owner string, lease time.Duration) store.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{ID: id, Owner: owner, State: apiv1.StateCreating, TemplateRef: "tiny:latest", TemplateDigest: "sha256:aa",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{}, Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: "op" + id, Kind: apiv1.OpCreate, TargetID: id, Owner: owner, Status: apiv1.OpPending}); err != nil {
		t.Fatal(err)
	}
	sb.State = apiv1.StateRunning
	if lease > 0 {
		exp := time.Now().Add(lease)
		sb.ExpiresAt = &exp
	}
	if err := st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

func types(evs apiv1.Events) string {
	var out []string
	for _, ev := range evs.Items {
		out = append(out, ev.Type+" "+ev.SandboxID)
	}
	return strings.Join(out, ", ")
}

// A key sees the events of its own sandboxes only, an admin key every
// key's; after_seq, limit and types select among them.
func TestListIsTheTenants(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	s := New(Config{Store: st})
	newSandbox(t, st, "sbxalice", alice.KeyID, 0)
	newSandbox(t, st, "sbxbob", bob.KeyID, 0)

	got, err := s.List(ctx, alice, Query{})
	if err != nil || types(got) != "sandbox.created sbxalice, sandbox.running sbxalice" {
		t.Fatalf("alice's events: %s, %v", types(got), err)
	}
	if got.LastSeq != got.Items[1].Seq {
		t.Fatalf("last_seq %d, want the last item's %d", got.LastSeq, got.Items[1].Seq)
	}
	if got, err := s.List(ctx, bob, Query{Types: []string{"sandbox.running"}}); err != nil || types(got) != "sandbox.running sbxbob" {
		t.Fatalf("bob's running events: %s, %v", types(got), err)
	}
	all, err := s.List(ctx, admin, Query{Types: []string{"sandbox.*"}})
	if err != nil || len(all.Items) != 4 {
		t.Fatalf("the admin's events: %s, %v", types(all), err)
	}
	after, err := s.List(ctx, alice, Query{AfterSeq: got.LastSeq, Limit: 1})
	if err != nil || len(after.Items) != 0 || after.LastSeq != got.LastSeq {
		t.Fatalf("after alice's last: %s (last_seq %d), %v; want none and the same last_seq", types(after), after.LastSeq, err)
	}
	if one, err := s.List(ctx, admin, Query{Limit: 1}); err != nil || len(one.Items) != 1 {
		t.Fatalf("limit 1: %s, %v", types(one), err)
	}
}

// Bad queries are refused with what to do, before any read.
func TestListRefusals(t *testing.T) {
	s := New(Config{Store: openStore(t)})
	for _, q := range []Query{
		{AfterSeq: -1},
		{Limit: -1},
		{Limit: 1001},
		{Wait: -time.Second},
		{Wait: MaxWait + time.Second},
		{Types: []string{"sandbox.nope"}},
		{Types: []string{"*"}},
		{Types: []string{"sandbox.%"}},
		{Types: []string{"nokind.*"}},
		{Types: []string{"sandbox.created\x00"}},
		{Types: make([]string, MaxTypes+1)},
	} {
		if _, err := s.List(context.Background(), alice, q); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("query %+v: %v, want invalid", q, err)
		}
	}
}

// A waiting reader is answered as soon as an event of its tenant comes,
// not at the end of its wait, and not by another tenant's.
func TestListWaits(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	s := New(Config{Store: st, Poll: time.Hour}) // only this process's writes wake it
	last, err := s.List(ctx, alice, Query{})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		evs  apiv1.Events
		err  error
		took time.Duration
	}
	got := make(chan answer, 1)
	go func() {
		start := time.Now()
		evs, err := s.List(ctx, alice, Query{AfterSeq: last.LastSeq, Wait: 30 * time.Second})
		got <- answer{evs, err, time.Since(start)}
	}()
	time.Sleep(200 * time.Millisecond)
	newSandbox(t, st, "sbxbob", bob.KeyID, 0) // another tenant's: no answer
	select {
	case a := <-got:
		t.Fatalf("answered by another tenant's event: %s, %v", types(a.evs), a.err)
	case <-time.After(300 * time.Millisecond):
	}
	newSandbox(t, st, "sbxalice", alice.KeyID, 0)
	a := <-got
	if a.err != nil || len(a.evs.Items) == 0 || a.evs.Items[0].SandboxID != "sbxalice" || a.took > 10*time.Second {
		t.Fatalf("waiting reader got %s after %s, %v", types(a.evs), a.took, a.err)
	}

	// With nothing coming it answers at the end of its wait, empty.
	start := time.Now()
	none, err := s.List(ctx, alice, Query{AfterSeq: a.evs.LastSeq + 100, Wait: time.Second})
	if err != nil || len(none.Items) != 0 || none.LastSeq != a.evs.LastSeq+100 || time.Since(start) < time.Second {
		t.Fatalf("a wait with nothing: %s (last_seq %d) after %s, %v", types(none), none.LastSeq, time.Since(start), err)
	}
	// A caller that goes away ends the wait.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.List(cctx, alice, Query{AfterSeq: 1 << 40, Wait: 30 * time.Second}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a cancelled wait: %v", err)
	}
}

// Tick writes sandbox.expiring for a lease about to end, once, and
// prunes events past their retention.
func TestTick(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	now := time.Now()
	s := New(Config{Store: st, Now: func() time.Time { return now }})
	newSandbox(t, st, "sbxsoon", alice.KeyID, 30*time.Second)
	newSandbox(t, st, "sbxlater", alice.KeyID, time.Hour)
	s.Tick(ctx, false)
	s.Tick(ctx, false)
	got, err := s.List(ctx, alice, Query{Types: []string{apiv1.EventSandboxExpiring}})
	if err != nil || types(got) != "sandbox.expiring sbxsoon" {
		t.Fatalf("expiring events: %s, %v", types(got), err)
	}
	// A week and more later, everything is past its retention.
	now = now.Add(8 * 24 * time.Hour)
	s.Tick(ctx, true)
	if got, err := s.List(ctx, admin, Query{}); err != nil || len(got.Items) != 0 {
		t.Fatalf("events after their retention: %s, %v", types(got), err)
	}
}
