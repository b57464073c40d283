package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestRefreshNeedsInit checks that refresh is refused until init and then
// accepted, with a session that a later host opened.
func TestRefreshNeedsInit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := newPort()
	a := agent.New(agent.Config{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Serve(ctx, p, time.Millisecond)
	}()
	t.Cleanup(func() {
		cancel()
		if conn := p.current(); conn != nil {
			conn.Close()
		}
		<-done
	})
	req := agentproto.RefreshRequest{TimeUnixNano: time.Now().UnixNano(), Entropy: []byte("fresh")}

	c := dial(t, p)
	err := c.Refresh(ctx, req)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("refresh before init: got %v, want a conflict", err)
	}
	if _, err := c.Init(ctx, agentproto.InitRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(ctx, req); err != nil {
		t.Fatalf("refresh after init: %v", err)
	}

	// A host that comes back (as after a restore) refreshes over its own
	// session.
	c2 := dial(t, p)
	if err := c2.Refresh(ctx, req); err != nil {
		t.Fatalf("refresh over a new session: %v", err)
	}
}
