package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func eventTypes(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type + " " + ev.SandboxID
	}
	return out
}

// Each change of state callers are told of is an event of the sandbox's
// owner, written with the change; the states in between are not.
func testEventsOfSandboxes(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	woke := s.EventsWritten()
	sb := mustInsertSandbox(t, s, "sbx1", "key1")
	select {
	case <-woke:
	default:
		t.Fatal("a committed event did not wake EventsWritten's readers")
	}
	mustInsertSandbox(t, s, "sbx2", "key2")
	steps := []struct {
		state string
		op    bool // by TransitionSandbox, else UpdateSandbox
	}{
		{apiv1.StateRunning, true},
		{apiv1.StateRunning, false}, // no change of state: no event
		{apiv1.StateSuspending, false},
		{apiv1.StateSuspended, true},
		{apiv1.StateWaking, false},
		{apiv1.StateRunning, true},
		{apiv1.StatePaused, false},
		{apiv1.StateRunning, false},
		{apiv1.StateDeleting, false},
		{apiv1.StateDeleted, true},
	}
	for i, st := range steps {
		sb.State = st.state
		var err error
		if st.op {
			err = s.TransitionSandbox(ctx, sb, Operation{ID: fmt.Sprintf("op%d", i), Kind: "x", TargetID: sb.ID, Owner: "key1", Status: "succeeded"})
		} else {
			err = s.UpdateSandbox(ctx, sb)
		}
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, st.state, err)
		}
	}
	got, err := s.ListEvents(ctx, EventFilter{Owner: "key1", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sandbox.created sbx1", "sandbox.running sbx1", "sandbox.suspended sbx1", "sandbox.woken sbx1",
		"sandbox.paused sbx1", "sandbox.running sbx1", "sandbox.deleted sbx1"}
	if !slices.Equal(eventTypes(got), want) {
		t.Fatalf("key1's events %v, want %v", eventTypes(got), want)
	}
	for i, ev := range got {
		if ev.Owner != "key1" || ev.ID == "" || ev.Time.IsZero() || (i > 0 && ev.Seq <= got[i-1].Seq) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	var d struct{ From, State string }
	if err := json.Unmarshal(got[3].Data, &d); err != nil || d.From != apiv1.StateWaking || d.State != apiv1.StateRunning {
		t.Fatalf("woken's data %s: %+v %v", got[3].Data, d, err)
	}
	// Another key's events are its own; all of them without an owner.
	if other, err := s.ListEvents(ctx, EventFilter{Owner: "key2", Limit: 100}); err != nil || !slices.Equal(eventTypes(other), []string{"sandbox.created sbx2"}) {
		t.Fatalf("key2's events %v, %v", eventTypes(other), err)
	}
	if all, err := s.ListEvents(ctx, EventFilter{Limit: 100}); err != nil || len(all) != len(want)+1 {
		t.Fatalf("all events: %d, %v", len(all), err)
	}
	// after_seq, limit and types.
	after, err := s.ListEvents(ctx, EventFilter{Owner: "key1", AfterSeq: got[4].Seq, Limit: 1})
	if err != nil || !slices.Equal(eventTypes(after), want[5:6]) {
		t.Fatalf("after seq %d limit 1: %v, %v", got[4].Seq, eventTypes(after), err)
	}
	typed, err := s.ListEvents(ctx, EventFilter{Owner: "key1", Types: []string{"sandbox.running", "sandbox.deleted"}, Limit: 100})
	if err != nil || !slices.Equal(eventTypes(typed), []string{"sandbox.running sbx1", "sandbox.running sbx1", "sandbox.deleted sbx1"}) {
		t.Fatalf("typed: %v, %v", eventTypes(typed), err)
	}
	if kinds, err := s.ListEvents(ctx, EventFilter{Types: []string{"build.*"}, Limit: 100}); err != nil || len(kinds) != 0 {
		t.Fatalf("build.* before any build: %v, %v", eventTypes(kinds), err)
	}
	if _, err := s.ListEvents(ctx, EventFilter{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("no limit: %v", err)
	}
	if last, err := s.LastEventSeq(ctx); err != nil || last < got[len(got)-1].Seq {
		t.Fatalf("last seq %d, %v", last, err)
	}
}

// A change refused writes no event: the event and the change are one.
func testEventsOnlyWithTheirChange(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	sb := mustInsertSandbox(t, s, "sbx1", "key1")
	if err := s.InsertSandbox(ctx, sb, createOp("opdup", "sbx1", "key1")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("insert of a taken ID: %v", err)
	}
	sb.State = apiv1.StateRunning
	if err := s.BeginOperation(ctx, sb, Operation{ID: "opx", Kind: "x", TargetID: sb.ID, Owner: "key1", Status: "running"}, apiv1.StatePaused); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("begin from a state it is not in: %v", err)
	}
	ghost := testSandbox("sbxnone", "key1")
	ghost.State = apiv1.StateRunning
	if err := s.UpdateSandbox(ctx, ghost); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("update of an unknown sandbox: %v", err)
	}
	got, err := s.ListEvents(ctx, EventFilter{Limit: 100})
	if err != nil || !slices.Equal(eventTypes(got), []string{"sandbox.created sbx1"}) {
		t.Fatalf("events %v, %v; want the one create", eventTypes(got), err)
	}
}

// The suspend or pause that idleness begins carries a sandbox.idle event,
// written before the state's own event and only if the operation begins.
func testEventsOfIdleness(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	sb := mustInsertSandbox(t, s, "sbx1", "key1")
	sb.State = apiv1.StateRunning
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	data := json.RawMessage(`{"idle_s":60,"on_idle":"suspend"}`)
	sb.State = apiv1.StateSuspending
	op := Operation{ID: "op1", Kind: "suspend", TargetID: sb.ID, Owner: "key1", Status: "pending"}
	if err := s.BeginIdleOperation(ctx, sb, op, apiv1.StateRunning, data); err != nil {
		t.Fatal(err)
	}
	// A second one finds the first in flight: no event of its own.
	op.ID = "op2"
	if err := s.BeginIdleOperation(ctx, sb, op, apiv1.StateRunning, data); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second idle begin: %v; want a conflict", err)
	}
	got, err := s.ListEvents(ctx, EventFilter{Limit: 100, Types: []string{apiv1.EventSandboxIdle}})
	if err != nil || len(got) != 1 || got[0].Owner != "key1" || got[0].SandboxID != "sbx1" {
		t.Fatalf("idle events %v, %v; want one of sbx1", eventTypes(got), err)
	}
	var d map[string]any
	if err := json.Unmarshal(got[0].Data, &d); err != nil || d["idle_s"] != 60.0 || d["on_idle"] != "suspend" {
		t.Errorf("idle event data %s, %v", got[0].Data, err)
	}
}

// A build's end is an event of its owner, with the template and digest.
func testEventsOfBuilds(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	for _, c := range []struct{ id, status string }{{"bld1", apiv1.TemplateReady}, {"bld2", apiv1.TemplateFailed}} {
		bd := Build{ID: c.id, Owner: "key1", Name: "web", Tag: c.id, Status: apiv1.TemplateBuilding, Request: json.RawMessage("{}")}
		op := Operation{ID: "op" + c.id, Kind: "build", TargetID: c.id, Owner: "key1", Status: "running"}
		if err := s.InsertBuild(ctx, bd, op); err != nil {
			t.Fatal(err)
		}
		bd.Status, bd.Digest = c.status, "sha256:aa"
		if c.status == apiv1.TemplateFailed {
			bd.Digest, bd.Error = "", &Error{Code: "invalid", Message: "step 2 failed"}
		}
		op.Status = "succeeded"
		// Only the ID and the outcome are given, as the builder does.
		if err := s.FinishBuild(ctx, Build{ID: bd.ID, Status: bd.Status, Digest: bd.Digest, Error: bd.Error}, op); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListEvents(ctx, EventFilter{Owner: "key1", Types: []string{"build.*"}, Limit: 10})
	if err != nil || !slices.Equal(eventTypes(got), []string{"build.succeeded ", "build.failed "}) {
		t.Fatalf("build events %v, %v", eventTypes(got), err)
	}
	var d struct {
		BuildID  string `json:"build_id"`
		Template string `json:"template"`
		Digest   string `json:"digest"`
		Error    *Error `json:"error"`
	}
	if err := json.Unmarshal(got[0].Data, &d); err != nil || d.BuildID != "bld1" || d.Template != "web:bld1" || d.Digest != "sha256:aa" {
		t.Fatalf("succeeded's data %s", got[0].Data)
	}
	if err := json.Unmarshal(got[1].Data, &d); err != nil || d.Error == nil || d.Error.Message != "step 2 failed" {
		t.Fatalf("failed's data %s", got[1].Data)
	}
}

// Readers that follow the events while several processes change
// sandboxes at once see every event once, in seq order, never one with a
// seq below one they have seen already.
func testEventsNeverSkip(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, 4)
	const writers, each = 3, 30
	var sbs []Sandbox
	for w := range writers {
		sbs = append(sbs, mustInsertSandbox(t, stores[0], fmt.Sprintf("sbxw%d", w), "key1"))
	}
	first, err := stores[0].LastEventSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Updates of different rows do not wait for one another: only the
	// events' own order holds them in line.
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			sb := sbs[w]
			for i := range each {
				sb.State = []string{apiv1.StateRunning, apiv1.StatePaused}[i%2]
				if err := stores[w].UpdateSandbox(ctx, sb); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	seen := map[int64]bool{}
	last := first
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < writers*each && time.Now().Before(deadline) {
		page, err := stores[3].ListEvents(ctx, EventFilter{AfterSeq: last, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page {
			if seen[ev.Seq] || ev.Seq <= last {
				t.Fatalf("event seq %d after %d, or twice", ev.Seq, last)
			}
			seen[ev.Seq], last = true, ev.Seq
		}
	}
	wg.Wait()
	all, err := stores[3].ListEvents(ctx, EventFilter{AfterSeq: first, Limit: 1000})
	if err != nil || len(all) != writers*each {
		t.Fatalf("%d events in all, %v; want %d", len(all), err, writers*each)
	}
	for _, ev := range all {
		if !seen[ev.Seq] {
			t.Fatalf("the reader skipped event %d", ev.Seq)
		}
	}
}

// Events older than the bound are pruned; newer ones stay.
func testPruneEvents(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	mustInsertSandbox(t, s, "sbx1", "key1")
	if n, err := s.PruneEvents(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("prune of nothing old: %d, %v", n, err)
	}
	if n, err := s.PruneEvents(ctx, time.Now().Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("prune of all: %d, %v", n, err)
	}
	if got, err := s.ListEvents(ctx, EventFilter{Limit: 10}); err != nil || len(got) != 0 {
		t.Fatalf("after prune: %v, %v", eventTypes(got), err)
	}
}

// A lease that ends within the window is told once, by one of the
// servers that look at once; a keep that moves it is told again; a lease
// further off, already past, or of a sandbox in another state is not.
func testAnnounceExpiring(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, racers)
	s := stores[0]
	now := time.Now()
	lease := func(id, state string, in time.Duration) Sandbox {
		sb := mustInsertSandbox(t, s, id, "key1")
		exp := now.Add(in)
		sb.State, sb.ExpiresAt = state, &exp
		if err := s.UpdateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	soon := lease("sbxsoon", apiv1.StateRunning, 30*time.Second)
	lease("sbxlater", apiv1.StateRunning, 10*time.Minute)
	lease("sbxpast", apiv1.StateRunning, -time.Second)
	lease("sbxdeleting", apiv1.StateDeleting, 30*time.Second)
	states := []string{apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended}
	for _, err := range race(t, stores, func(s *Store) error {
		_, err := s.AnnounceExpiring(ctx, now, time.Minute, states)
		return err
	}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	expiring := func() []string {
		got, err := s.ListEvents(ctx, EventFilter{Types: []string{apiv1.EventSandboxExpiring}, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return eventTypes(got)
	}
	if got := expiring(); !slices.Equal(got, []string{"sandbox.expiring sbxsoon"}) {
		t.Fatalf("after %d servers looked: %v; want sbxsoon's once", racers, got)
	}
	if n, err := s.AnnounceExpiring(ctx, now, time.Minute, states); err != nil || n != 0 {
		t.Fatalf("a second look: %d, %v; want none", n, err)
	}
	// A keep moves the lease end: the new one is told when it nears.
	exp := now.Add(45 * time.Second)
	soon.ExpiresAt = &exp
	if err := s.UpdateSandbox(ctx, soon); err != nil {
		t.Fatal(err)
	}
	if n, err := s.AnnounceExpiring(ctx, now, time.Minute, states); err != nil || n != 1 {
		t.Fatalf("after a keep: %d, %v; want 1", n, err)
	}
	if _, err := s.AnnounceExpiring(ctx, now, time.Minute, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("no states: %v", err)
	}
}
