package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func testSandboxRoundTrip(t *testing.T, b backend) {
	full := testSandbox("sbxfull", "key1")
	full.LastError = &Error{Code: "internal", Message: "boot failed: <\"quoted\">"}
	full.IdleS, full.OnIdle, full.WakeOnRequest = 600, "pause", true

	minimal := Sandbox{ID: "sbxmin", Owner: "key1", State: "creating", CreatedAt: t0}
	minimalWant := minimal
	minimalWant.Env, minimalWant.Metadata = map[string]string{}, map[string]string{}

	odd := testSandbox("sbxodd", "key1")
	odd.Metadata = map[string]string{"a.b": "dotted", `q"uote`: "x", "ünï": "cödé", "empty": ""}
	odd.Env = map[string]string{}
	odd.Network = json.RawMessage(`null`)

	for _, tc := range []struct {
		name string
		in   Sandbox
		want Sandbox // without UpdatedAt, which equals CreatedAt
	}{
		{"every field", full, full},
		{"nil maps read back empty", minimal, minimalWant},
		{"odd metadata and null network", odd, odd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := b.newStore(t)
			ctx := context.Background()
			op := createOp("op"+tc.in.ID, tc.in.ID, tc.in.Owner)
			if err := s.InsertSandbox(ctx, tc.in, op); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetSandbox(ctx, tc.in.ID)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.UpdatedAt = want.CreatedAt
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			if got.Env == nil || got.Metadata == nil {
				t.Error("nil map read back")
			}
			gotOp, err := s.GetOperation(ctx, op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gotOp, op) {
				t.Errorf("operation %+v, want %+v", gotOp, op)
			}
		})
	}
}

func testInsertSandboxRefusals(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	mustInsertSandbox(t, s, "sbx1", "key1")
	if err := s.InsertOperation(ctx, Operation{ID: "optaken", Kind: "build", TargetID: "tpl1", Status: "running"}); err != nil {
		t.Fatal(err)
	}
	badNetwork := testSandbox("sbxnet", "key1")
	badNetwork.Network = json.RawMessage(`{"egress":`)

	for _, tc := range []struct {
		name    string
		sb      Sandbox
		op      Operation
		wantErr error
		// Neither half of a refused insert is stored.
		absentSandbox, absentOp string
	}{
		{"sandbox ID taken", testSandbox("sbx1", "key2"), createOp("opnew", "sbx1", "key2"),
			errdefs.ErrConflict, "", "opnew"},
		{"operation ID taken", testSandbox("sbx2", "key1"), createOp("optaken", "sbx2", "key1"),
			errdefs.ErrConflict, "sbx2", ""},
		{"operation targets another", testSandbox("sbx3", "key1"), createOp("op3", "sbx1", "key1"),
			errdefs.ErrInvalid, "sbx3", "op3"},
		{"network not JSON", badNetwork, createOp("opnet", "sbxnet", "key1"),
			errdefs.ErrInvalid, "sbxnet", "opnet"},
		{"empty ID", testSandbox("", "key1"), createOp("opempty", "", "key1"),
			errdefs.ErrInvalid, "", "opempty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.InsertSandbox(ctx, tc.sb, tc.op); !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			if tc.absentSandbox != "" {
				if _, err := s.GetSandbox(ctx, tc.absentSandbox); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("sandbox %s: %v, want not found", tc.absentSandbox, err)
				}
			}
			if tc.absentOp != "" {
				if _, err := s.GetOperation(ctx, tc.absentOp); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("operation %s: %v, want not found", tc.absentOp, err)
				}
			}
		})
	}
	// The records whose IDs were taken are untouched.
	if got, _ := s.GetSandbox(ctx, "sbx1"); got.Owner != "key1" {
		t.Errorf("sbx1 owner %q, want key1", got.Owner)
	}
	if got, _ := s.GetOperation(ctx, "optaken"); got.Kind != "build" {
		t.Errorf("optaken kind %q, want build", got.Kind)
	}
}

func testUpdateSandbox(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	orig := mustInsertSandbox(t, s, "sbx1", "key1")

	upd := orig
	upd.State = "failed"
	upd.VCPUs, upd.MemoryMiB, upd.DiskMiB, upd.TimeoutS = 4, 1024, 4096, 0
	upd.OnTimeout = "suspend"
	upd.Env = map[string]string{"B": "2"}
	upd.Metadata = nil
	upd.Network = nil
	upd.ExpiresAt = nil
	upd.LastError = &Error{Code: "unavailable", Message: "host busy"}
	upd.Owner = "intruder"            // fixed at insert
	upd.CreatedAt = t0.Add(time.Hour) // fixed at insert
	before := time.Now()
	if err := s.UpdateSandbox(ctx, upd); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	if got.UpdatedAt.Before(before) || got.UpdatedAt.After(time.Now()) {
		t.Errorf("UpdatedAt %v is not the time of the update", got.UpdatedAt)
	}
	want := upd
	want.Owner, want.CreatedAt = orig.Owner, orig.CreatedAt
	want.Metadata = map[string]string{}
	want.UpdatedAt = got.UpdatedAt
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func testTransitionSandbox(t *testing.T, b backend) {
	ctx := context.Background()
	done := t0.Add(time.Minute)
	for _, tc := range []struct {
		name    string
		state   string
		op      Operation
		wantOp  Operation
		wantErr error
	}{
		{
			name:   "new delete operation",
			state:  "deleting",
			op:     Operation{ID: "opdel", Kind: "delete", TargetID: "sbx1", Owner: "key1", Status: "running", CreatedAt: t0},
			wantOp: Operation{ID: "opdel", Kind: "delete", TargetID: "sbx1", Owner: "key1", Status: "running", CreatedAt: t0},
		},
		{
			name:  "create operation succeeded",
			state: "running",
			// Kind, owner and creation time of an existing operation stay.
			op:     Operation{ID: "opsbx1", Kind: "other", TargetID: "sbx1", Status: "succeeded", FinishedAt: &done},
			wantOp: Operation{ID: "opsbx1", Kind: "create", TargetID: "sbx1", Owner: "key1", Status: "succeeded", CreatedAt: t0, FinishedAt: &done},
		},
		{
			name:    "operation targets another sandbox",
			state:   "deleting",
			op:      Operation{ID: "opx", Kind: "delete", TargetID: "sbx2", Status: "running"},
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:    "invalid operation rolls back the sandbox",
			state:   "deleting",
			op:      Operation{ID: "", Kind: "delete", TargetID: "sbx1", Status: "running"},
			wantErr: errdefs.ErrInvalid,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := b.newStore(t)
			sb := mustInsertSandbox(t, s, "sbx1", "key1")
			sb.State = tc.state
			err := s.TransitionSandbox(ctx, sb, tc.op)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
			got, gerr := s.GetSandbox(ctx, "sbx1")
			if gerr != nil {
				t.Fatal(gerr)
			}
			if tc.wantErr != nil {
				if got.State != "creating" {
					t.Errorf("state %q after a failed transition, want creating", got.State)
				}
				return
			}
			if got.State != tc.state {
				t.Errorf("state %q, want %q", got.State, tc.state)
			}
			gotOp, err := s.GetOperation(ctx, tc.op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(gotOp, tc.wantOp) {
				t.Errorf("operation %+v, want %+v", gotOp, tc.wantOp)
			}
		})
	}
}

func testListSandboxesFilter(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	for _, sb := range []struct {
		id, owner, state string
		metadata         map[string]string
	}{
		{"sbxa", "key1", "running", map[string]string{"team": "infra", "env": "prod"}},
		{"sbxb", "key2", "running", map[string]string{"team": "infra", "env": "dev"}},
		{"sbxc", "key1", "paused", map[string]string{"team": "web", "a.b": "dot"}},
		{"sbxd", "key1", "deleted", nil},
		{"sbxe", "key2", "failed", map[string]string{"team": "infra", "n": "1"}},
	} {
		v := testSandbox(sb.id, sb.owner)
		v.State, v.Metadata = sb.state, sb.metadata
		if err := s.InsertSandbox(ctx, v, createOp("op"+sb.id, sb.id, sb.owner)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		filter SandboxFilter
		want   []string
	}{
		{"all", SandboxFilter{}, []string{"sbxa", "sbxb", "sbxc", "sbxd", "sbxe"}},
		{"owner", SandboxFilter{Owner: "key2"}, []string{"sbxb", "sbxe"}},
		{"one state", SandboxFilter{States: []string{"running"}}, []string{"sbxa", "sbxb"}},
		{"two states", SandboxFilter{States: []string{"paused", "failed"}}, []string{"sbxc", "sbxe"}},
		{"metadata pair", SandboxFilter{Metadata: map[string]string{"team": "infra"}}, []string{"sbxa", "sbxb", "sbxe"}},
		{"every pair must match", SandboxFilter{Metadata: map[string]string{"team": "infra", "env": "dev"}}, []string{"sbxb"}},
		{"key with a dot", SandboxFilter{Metadata: map[string]string{"a.b": "dot"}}, []string{"sbxc"}},
		{"value differs", SandboxFilter{Metadata: map[string]string{"team": "Infra"}}, nil},
		{"key absent", SandboxFilter{Metadata: map[string]string{"zone": ""}}, nil},
		{"number-like value is text", SandboxFilter{Metadata: map[string]string{"n": "1"}}, []string{"sbxe"}},
		{"owner, state and metadata", SandboxFilter{Owner: "key1", States: []string{"running", "paused"},
			Metadata: map[string]string{"team": "infra"}}, []string{"sbxa"}},
		{"after a cursor", SandboxFilter{After: "sbxb"}, []string{"sbxc", "sbxd", "sbxe"}},
		{"cursor outside the filter", SandboxFilter{Owner: "key2", After: "sbxc"}, []string{"sbxe"}},
		{"limit", SandboxFilter{Limit: 2}, []string{"sbxa", "sbxb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.filter
			if f.Limit == 0 {
				f.Limit = 100
			}
			list, err := s.ListSandboxes(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, sb := range list {
				got = append(got, sb.ID)
			}
			want := tc.want
			if want == nil {
				want = []string{}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}

	for _, tc := range []struct {
		name   string
		filter SandboxFilter
	}{
		{"zero limit", SandboxFilter{}},
		{"negative limit", SandboxFilter{Limit: -1}},
		{"unknown cursor", SandboxFilter{After: "sbxnope", Limit: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.ListSandboxes(ctx, tc.filter); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("got %v, want invalid", err)
			}
		})
	}
}

func testListSandboxesPagination(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	const total = 250
	var ids []string
	// IDs in an order unrelated to creation, as random IDs would be.
	for i := range total {
		id := fmt.Sprintf("sbx%03d", (i*97)%total)
		ids = append(ids, id)
		mustInsertSandbox(t, s, id, "key1")
	}

	var got []string
	var sizes []int
	after := ""
	extra := 0
	for {
		page, err := s.ListSandboxes(ctx, SandboxFilter{Owner: "key1", After: after, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
		if len(page) == 0 {
			break
		}
		for _, sb := range page {
			got = append(got, sb.ID)
		}
		after = page[len(page)-1].ID
		// Sandboxes created while paging belong to another owner: they must
		// not shift the pages of this one.
		for range 30 {
			mustInsertSandbox(t, s, fmt.Sprintf("sbxother%d", extra), "key2")
			extra++
		}
	}
	if want := []int{100, 100, 50, 0}; !reflect.DeepEqual(sizes, want) {
		t.Errorf("page sizes %v, want %v", sizes, want)
	}
	if !reflect.DeepEqual(got, ids) {
		t.Errorf("pages hold %d IDs, not the %d created in creation order", len(got), len(ids))
	}

	// Paging over every owner while sandboxes are created: each of the
	// sandboxes that existed before is seen once, and new ones come last.
	seen := map[string]int{}
	var order []string
	after = ""
	for {
		page, err := s.ListSandboxes(ctx, SandboxFilter{After: after, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, sb := range page {
			seen[sb.ID]++
			order = append(order, sb.ID)
		}
		after = page[len(page)-1].ID
		if extra < 400 {
			mustInsertSandbox(t, s, fmt.Sprintf("sbxother%d", extra), "key2")
			extra++
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s listed %d times", id, n)
		}
	}
	if len(seen) != total+extra {
		t.Errorf("listed %d sandboxes, want %d", len(seen), total+extra)
	}
	if !reflect.DeepEqual(order[:total], ids) {
		t.Error("the first sandboxes are not listed first")
	}
}

func testListExpired(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	leases := []struct {
		id    string
		state string
		in    time.Duration // lease end after t0; 0: no lease
	}{
		{"sbxa", "running", 3 * time.Minute},
		{"sbxb", "running", time.Minute},
		{"sbxc", "suspended", 2 * time.Minute},
		{"sbxd", "running", 0},
		{"sbxe", "running", time.Hour},
		{"sbxf", "deleted", time.Minute},
	}
	for _, l := range leases {
		sb := testSandbox(l.id, "key1")
		sb.State, sb.ExpiresAt = l.state, nil
		if l.in > 0 {
			exp := t0.Add(l.in)
			sb.ExpiresAt = &exp
		}
		if err := s.InsertSandbox(ctx, sb, createOp("op"+l.id, l.id, "key1")); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListExpired(ctx, t0.Add(5*time.Minute), []string{"running", "suspended"}, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range got {
		ids = append(ids, sb.ID)
	}
	if strings.Join(ids, ",") != "sbxb,sbxc,sbxa" {
		t.Errorf("expired: %v, want sbxb,sbxc,sbxa (soonest first; none without a lease, not yet due or deleted)", ids)
	}
	if got, _ := s.ListExpired(ctx, t0.Add(5*time.Minute), []string{"running"}, "", 1); len(got) != 1 || got[0].ID != "sbxb" {
		t.Errorf("limit 1: %+v", got)
	}
	if _, err := s.ListExpired(ctx, t0, nil, "", 10); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("no states: %v", err)
	}
	// A node sees its own only.
	if err := s.SetSandboxNode(ctx, "sbxc", "host-a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.ListExpired(ctx, t0.Add(5*time.Minute), []string{"running", "suspended"}, "host-a", 10); len(got) != 1 || got[0].ID != "sbxc" {
		t.Errorf("expired on host-a: %+v, want sbxc alone", got)
	}
	if got, _ := s.ListExpired(ctx, t0.Add(5*time.Minute), []string{"running", "suspended"}, "host-b", 10); len(got) != 0 {
		t.Errorf("expired on host-b: %+v, want none", got)
	}
}

// Of the servers that begin a lifecycle operation on one sandbox at once,
// one wins; while it is in flight no other begins, but a delete does and
// takes the sandbox over; the end of an operation frees the sandbox only if
// it is still the one in flight.
func testBeginOperation(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, racers)
	sb := mustInsertSandbox(t, stores[0], "sbx1", "key1")
	sb.State = "running"
	if err := stores[0].UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	pause := func(s *Store, id string) error {
		return s.BeginOperation(ctx, sb, Operation{ID: id, Kind: "pause", TargetID: "sbx1", Owner: "key1", Status: "pending"}, "running")
	}
	var mu sync.Mutex
	var won []string
	for _, err := range race(t, stores, func(s *Store) error {
		id := fmt.Sprintf("oppause%p", s)
		err := pause(s, id)
		if err == nil {
			mu.Lock()
			won = append(won, id)
			mu.Unlock()
		} else if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "pause operation in flight") {
			return fmt.Errorf("a loser got %v, want a conflict naming the pause in flight", err)
		}
		return nil
	}) {
		if err != nil {
			t.Error(err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d pauses began, want 1", len(won))
	}
	ops, err := stores[0].ListOperations(ctx)
	if err != nil || len(ops) != 2 { // the create and the one pause
		t.Fatalf("%d operations (%v), want 2: a losing begin left its operation", len(ops), err)
	}
	if id, _ := stores[1].operationInFlight(ctx, "sbx1"); id != won[0] {
		t.Errorf("in flight %q, want %q", id, won[0])
	}
	// A state the sandbox is not in, or a missing sandbox, is refused.
	wrong := stores[0].BeginOperation(ctx, sb, Operation{ID: "opwake", Kind: "wake", TargetID: "sbx1"}, "paused")
	if !errors.Is(wrong, errdefs.ErrConflict) || !strings.Contains(wrong.Error(), "is running now, not paused") {
		t.Errorf("wake from paused while running: %v", wrong)
	}
	ghost := testSandbox("sbxghost", "key1")
	if err := stores[0].BeginOperation(ctx, ghost, Operation{ID: "opghost", Kind: "pause", TargetID: "sbxghost"}, "running"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("begin on a missing sandbox: %v, want not found", err)
	}

	// Deletes race too: one wins, and takes the sandbox over from the pause.
	var deletes []string
	sb.State = "deleting"
	for _, err := range race(t, stores, func(s *Store) error {
		id := fmt.Sprintf("opdelete%p", s)
		err := s.BeginDelete(ctx, sb, Operation{ID: id, Kind: "delete", TargetID: "sbx1", Owner: "key1", Status: "pending"}, "running")
		if err == nil {
			mu.Lock()
			deletes = append(deletes, id)
			mu.Unlock()
		} else if !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
		return nil
	}) {
		if err != nil {
			t.Error(err)
		}
	}
	if len(deletes) != 1 {
		t.Fatalf("%d deletes began, want 1", len(deletes))
	}
	// The pause ends: it no longer holds the sandbox, so the delete stays.
	now := time.Now()
	sb.State = "deleting"
	if err := stores[2].TransitionSandbox(ctx, sb, Operation{ID: won[0], TargetID: "sbx1", Status: "failed", FinishedAt: &now}); err != nil {
		t.Fatal(err)
	}
	if id, _ := stores[1].operationInFlight(ctx, "sbx1"); id != deletes[0] {
		t.Errorf("after the pause ended, in flight %q, want the delete %q", id, deletes[0])
	}
	sb.State = "deleted"
	if err := stores[3].TransitionSandbox(ctx, sb, Operation{ID: deletes[0], TargetID: "sbx1", Status: "succeeded", FinishedAt: &now}); err != nil {
		t.Fatal(err)
	}
	if id, _ := stores[1].operationInFlight(ctx, "sbx1"); id != "" {
		t.Errorf("after the delete ended, in flight %q, want none", id)
	}
}

// An operation whose end is recorded on its own (UpdateOperation, without
// TransitionSandbox) frees its sandbox too.
func testFinishedOperationFreesSandbox(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	sb := mustInsertSandbox(t, s, "sbx1", "key1")
	sb.State = "running"
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	begin := func(id string) error {
		return s.BeginOperation(ctx, sb, Operation{ID: id, Kind: "pause", TargetID: "sbx1", Owner: "key1", Status: "pending"}, "running")
	}
	if err := begin("op1"); err != nil {
		t.Fatal(err)
	}
	if err := begin("op2"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("begin while op1 runs: %v, want conflict", err)
	}
	now := time.Now()
	if err := s.UpdateOperation(ctx, Operation{ID: "op1", Status: "failed", FinishedAt: &now}); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.operationInFlight(ctx, "sbx1"); id != "" {
		t.Errorf("after op1 finished, in flight %q, want none", id)
	}
	if err := begin("op3"); err != nil {
		t.Fatalf("begin after op1 finished: %v", err)
	}
	// An update that does not finish the operation keeps the sandbox busy.
	if err := s.UpdateOperation(ctx, Operation{ID: "op3", Status: "running"}); err != nil {
		t.Fatal(err)
	}
	if id, _ := s.operationInFlight(ctx, "sbx1"); id != "op3" {
		t.Errorf("after op3 started running, in flight %q, want op3", id)
	}
}
