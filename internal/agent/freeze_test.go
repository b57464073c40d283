package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// The freeze state over the real protocol (on a host the agent keeps the
// state without freezing anything): a second freeze is a conflict, a thaw
// of a guest that is not frozen does nothing, and a freeze ends on its own
// at its deadline, which the next thaw reports.
func TestFreezeThaw(t *testing.T) {
	ctx := context.Background()
	_, c := startAgent(t)

	if res, err := c.Thaw(ctx); err != nil || res.Thawed || res.Expired {
		t.Fatalf("thaw while not frozen: %+v, %v; want nothing done", res, err)
	}
	if err := c.Freeze(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	err := c.Freeze(ctx, time.Minute)
	var ae *agentclient.Error
	if !errors.As(err, &ae) || ae.Code != agentproto.CodeState || !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second freeze: got %v, want a state error", err)
	}
	t.Log(err)
	if res, err := c.Thaw(ctx); err != nil || !res.Thawed || res.Expired {
		t.Fatalf("thaw: %+v, %v; want thawed", res, err)
	}
	if res, err := c.Thaw(ctx); err != nil || res.Thawed {
		t.Fatalf("second thaw: %+v, %v; want nothing done", res, err)
	}

	// The deadline thaws, and the next thaw says so, once.
	if err := c.Freeze(ctx, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := c.Freeze(ctx, time.Minute); err != nil {
		t.Fatalf("freeze after the last one expired: %v", err)
	}
	if res, err := c.Thaw(ctx); err != nil || !res.Thawed || res.Expired {
		t.Fatalf("thaw of the new freeze: %+v, %v; want thawed", res, err)
	}
	if err := c.Freeze(ctx, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if res, err := c.Thaw(ctx); err != nil || res.Thawed || !res.Expired {
		t.Fatalf("thaw after the deadline: %+v, %v; want expired", res, err)
	}
	if res, err := c.Thaw(ctx); err != nil || res.Thawed || res.Expired {
		t.Fatalf("thaw after that: %+v, %v; want nothing", res, err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFreezeErrors(t *testing.T) {
	ctx := context.Background()
	_, c := startAgent(t)
	for _, d := range []time.Duration{0, -time.Second, agentproto.MaxFreeze + time.Second} {
		if err := c.Freeze(ctx, d); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("freeze for %s: got %v, want invalid", d, err)
		}
	}

	// Before init there is no root filesystem of the sandbox's to freeze.
	p := newPort()
	a := agent.New(agent.Config{})
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Serve(actx, p, time.Millisecond)
	}()
	t.Cleanup(func() {
		cancel()
		if conn := p.current(); conn != nil {
			conn.Close()
		}
		<-done
	})
	fresh := dial(t, p)
	if err := fresh.Freeze(ctx, time.Minute); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("freeze before init: got %v, want a state error", err)
	}
	if err := fresh.Sync(ctx); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("sync before init: got %v, want a state error", err)
	}
}
