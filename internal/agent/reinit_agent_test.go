package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestReinit checks that reinit is refused before init and with a bad
// request, that a placeholder init is reported by ping until a reinit,
// and that a reinit over a later session replaces the default
// environment of new processes.
func TestReinit(t *testing.T) {
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
	req := agentproto.ReinitRequest{Hostname: "sbx1", TimeUnixNano: time.Now().UnixNano(), Entropy: []byte("fresh"),
		Env: map[string]string{"AIRLOCK_WHO": "clone"}}

	c := dial(t, p)
	if _, err := c.Reinit(ctx, req); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("reinit before init: got %v, want a conflict", err)
	}
	if _, err := c.Init(ctx, agentproto.InitRequest{Hostname: "tpl", Placeholder: true,
		Env: map[string]string{"AIRLOCK_WHO": "template"}}); err != nil {
		t.Fatal(err)
	}
	if pong, err := c.Ping(ctx); err != nil || !pong.Initialized || !pong.Placeholder {
		t.Fatalf("ping after a placeholder init: %+v, %v", pong, err)
	}
	if out, _, _ := run(t, c, agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo $AIRLOCK_WHO"}}, nil); out != "template\n" {
		t.Fatalf("the template's process sees %q", out)
	}

	// As a clone does: a new session, then reinit.
	c2 := dial(t, p)
	bad := req
	bad.Hostname = "two\nlines"
	if _, err := c2.Reinit(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("reinit with a hostname of two lines: got %v, want invalid", err)
	}
	if pong, err := c2.Ping(ctx); err != nil || !pong.Placeholder {
		t.Fatalf("a refused reinit ended the placeholder: %+v, %v", pong, err)
	}
	// A warm pool's warm-up: a reinit that keeps the placeholder.
	if _, err := c2.Reinit(ctx, agentproto.ReinitRequest{TimeUnixNano: time.Now().UnixNano(), Entropy: []byte("warm"), Placeholder: true}); err != nil {
		t.Fatal(err)
	}
	if pong, err := c2.Ping(ctx); err != nil || !pong.Placeholder {
		t.Fatalf("a reinit that keeps the placeholder ended it: %+v, %v", pong, err)
	}
	if _, err := c2.Reinit(ctx, req); err != nil {
		t.Fatal(err)
	}
	if pong, err := c2.Ping(ctx); err != nil || !pong.Initialized || pong.Placeholder {
		t.Fatalf("ping after reinit: %+v, %v", pong, err)
	}
	if out, _, _ := run(t, c2, agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo $AIRLOCK_WHO"}}, nil); strings.TrimSpace(out) != "clone" {
		t.Errorf("a process after reinit sees %q, want the clone's environment", out)
	}
}
