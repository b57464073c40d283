package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// testCommand returns a command just created in sandbox sandboxID.
func testCommand(id, sandboxID string) Command {
	return Command{
		ID: id, SandboxID: sandboxID, Owner: "key1",
		Request:        json.RawMessage(`{"argv":["python3","-c","print(1)"],"env":{"A":"1"},"pty":null}`),
		State:          "created",
		TokenHash:      []byte{1, 2, 3, 4},
		TokenExpiresAt: t0.Add(time.Hour),
		CreatedAt:      t0,
	}
}

func testCommandRoundTrip(t *testing.T, b backend) {
	started, finished := t0.Add(time.Second), t0.Add(2*time.Second)
	code, sig := 137, "KILL"
	exited := testCommand("cmdexited", "sbx1")
	exited.State, exited.AgentID, exited.PID = "exited", "p3", 4242
	exited.ExitCode, exited.Signal, exited.TimedOut = &code, &sig, true
	exited.TokenSpent, exited.StartedAt, exited.FinishedAt = true, &started, &finished
	zero := 0
	clean := testCommand("cmdclean", "sbx1")
	clean.State, clean.ExitCode = "exited", &zero
	bare := Command{ID: "cmdbare", SandboxID: "sbx1", State: "created", TokenHash: []byte{}}

	for _, tc := range []struct {
		name string
		c    Command
	}{
		{"created", testCommand("cmdnew", "sbx1")},
		{"exited by a signal", exited},
		{"exit code zero is not nil", clean},
		{"no request and zero times", bare},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := b.newStore(t)
			ctx := context.Background()
			mustInsertSandbox(t, s, "sbx1", "key1")
			if err := s.InsertCommand(ctx, tc.c); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetCommand(ctx, tc.c.ID)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.c
			if want.CreatedAt.IsZero() {
				if got.CreatedAt.IsZero() {
					t.Error("CreatedAt not set")
				}
				want.CreatedAt = got.CreatedAt
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func testInsertCommandRefusals(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	mustInsertSandbox(t, s, "sbx1", "key1")
	if err := s.InsertCommand(ctx, testCommand("cmd1", "sbx1")); err != nil {
		t.Fatal(err)
	}
	badRequest := testCommand("cmdbad", "sbx1")
	badRequest.Request = json.RawMessage(`{"argv":`)
	for _, tc := range []struct {
		name    string
		c       Command
		wantErr error
	}{
		{"missing sandbox", testCommand("cmd2", "sbxnope"), errdefs.ErrNotFound},
		{"ID taken", testCommand("cmd1", "sbx1"), errdefs.ErrConflict},
		{"request not JSON", badRequest, errdefs.ErrInvalid},
		{"empty ID", testCommand("", "sbx1"), errdefs.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.InsertCommand(ctx, tc.c); !errors.Is(err, tc.wantErr) {
				t.Errorf("got %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func testUpdateCommand(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	mustInsertSandbox(t, s, "sbx1", "key1")
	orig := testCommand("cmd1", "sbx1")
	if err := s.InsertCommand(ctx, orig); err != nil {
		t.Fatal(err)
	}

	started := t0.Add(time.Second)
	upd := orig
	upd.State, upd.AgentID, upd.PID, upd.StartedAt, upd.TokenSpent = "running", "p7", 99, &started, true
	upd.TokenHash, upd.TokenExpiresAt = []byte{9}, t0.Add(2*time.Hour)
	// Fixed at insert.
	upd.SandboxID, upd.Owner, upd.Request, upd.CreatedAt = "sbxother", "other", json.RawMessage(`{}`), t0.Add(time.Hour)
	if err := s.UpdateCommand(ctx, upd); err != nil {
		t.Fatal(err)
	}
	want := upd
	want.SandboxID, want.Owner, want.Request, want.CreatedAt = orig.SandboxID, orig.Owner, orig.Request, orig.CreatedAt
	// The token is fixed at insert too; only SpendCommandToken spends it,
	// so an update racing with a spend cannot undo it.
	want.TokenHash, want.TokenExpiresAt, want.TokenSpent = orig.TokenHash, orig.TokenExpiresAt, orig.TokenSpent
	got, err := s.GetCommand(ctx, "cmd1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	// Back to nil: exit code and signal cleared.
	code, sig := 1, "TERM"
	upd.ExitCode, upd.Signal = &code, &sig
	if err := s.UpdateCommand(ctx, upd); err != nil {
		t.Fatal(err)
	}
	upd.ExitCode, upd.Signal = nil, nil
	if err := s.UpdateCommand(ctx, upd); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetCommand(ctx, "cmd1"); got.ExitCode != nil || got.Signal != nil {
		t.Errorf("exit code %v, signal %v; want nil", got.ExitCode, got.Signal)
	}
}

func testSpendCommandToken(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	mustInsertSandbox(t, s, "sbx1", "key1")
	if err := s.InsertCommand(ctx, testCommand("cmd1", "sbx1")); err != nil {
		t.Fatal(err)
	}
	// Of concurrent spends, exactly one wins.
	const n = 10
	errs := make(chan error, n)
	for range n {
		go func() { errs <- s.SpendCommandToken(ctx, "cmd1") }()
	}
	won := 0
	for range n {
		switch err := <-errs; {
		case err == nil:
			won++
		case !errors.Is(err, errdefs.ErrConflict):
			t.Errorf("got %v, want nil or conflict", err)
		}
	}
	if won != 1 {
		t.Errorf("%d spends won, want 1", won)
	}
	if c, _ := s.GetCommand(ctx, "cmd1"); !c.TokenSpent {
		t.Error("token not marked spent")
	}
}

func testListCommands(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	mustInsertSandbox(t, s, "sbx1", "key1")
	mustInsertSandbox(t, s, "sbx2", "key1")
	// Interleaved between two sandboxes; IDs not in creation order.
	var ids1 []string
	for i := range 25 {
		id := fmt.Sprintf("cmd%02d", (i*7)%25)
		sbx := "sbx2"
		if i%5 != 0 {
			sbx = "sbx1"
			ids1 = append(ids1, id)
		}
		c := testCommand(id, sbx)
		if i%3 == 0 {
			c.State = "running"
		}
		if err := s.InsertCommand(ctx, c); err != nil {
			t.Fatal(err)
		}
	}

	var got []string
	var sizes []int
	after := ""
	for {
		page, err := s.ListCommands(ctx, "sbx1", after, 8)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
		if len(page) == 0 {
			break
		}
		for _, c := range page {
			if c.SandboxID != "sbx1" {
				t.Errorf("%s of %s listed for sbx1", c.ID, c.SandboxID)
			}
			got = append(got, c.ID)
		}
		after = page[len(page)-1].ID
	}
	if want := []int{8, 8, 4, 0}; !reflect.DeepEqual(sizes, want) {
		t.Errorf("page sizes %v, want %v", sizes, want)
	}
	if !reflect.DeepEqual(got, ids1) {
		t.Errorf("listed %v, want %v", got, ids1)
	}

	for _, tc := range []struct {
		name         string
		sandbox, cur string
		limit        int
	}{
		{"cursor of another sandbox", "sbx1", "cmd00", 10}, // cmd00 is the first, in sbx2
		{"unknown cursor", "sbx1", "cmdnope", 10},
		{"zero limit", "sbx1", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.ListCommands(ctx, tc.sandbox, tc.cur, tc.limit); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("got %v, want invalid", err)
			}
		})
	}

	running, err := s.ListCommandsByState(ctx, "running")
	if err != nil {
		t.Fatal(err)
	}
	var gotRunning []string
	for _, c := range running {
		gotRunning = append(gotRunning, c.ID)
	}
	var wantRunning []string
	for i := 0; i < 25; i += 3 {
		wantRunning = append(wantRunning, fmt.Sprintf("cmd%02d", (i*7)%25))
	}
	if !reflect.DeepEqual(gotRunning, wantRunning) {
		t.Errorf("running %v, want %v", gotRunning, wantRunning)
	}
	if none, err := s.ListCommandsByState(ctx, "exited"); err != nil || none == nil || len(none) != 0 {
		t.Errorf("exited = %v, %v; want empty", none, err)
	}
}
