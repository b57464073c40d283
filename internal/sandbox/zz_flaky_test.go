package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
)

func TestZZCheckpointLoop(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 14*time.Minute)
	defer cancel()
	rt := hostRuntime(t, ctx)
	src, err := rt.Create(ctx, Spec{Template: "tiny", MemoryMiB: 256, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Destroy(context.Background()) })
	out := &syncBuffer{}
	if _, err := src.Exec(ctx, agentproto.ExecRequest{Cmd: counterScript}, agentclient.Stdio{Stdout: out}); err != nil {
		t.Fatal(err)
	}
	fails := 0
	for i := 0; i < 16; i++ {
		id := NewCheckpointID()
		cp, err := rt.Checkpoint(ctx, src, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.RemoveCheckpoint(id) })
		child, err := rt.Create(ctx, Spec{Checkpoint: id})
		if err != nil {
			fails++
			t.Logf("round %d: stall %s: child failed: %.300s", i, cp.Stall, err)
			continue
		}
		got := shell(ctx, t, child, "cat /counter")
		t.Logf("round %d: stall %s: child ok, counter %s %v", i, cp.Stall, got, cp.Timings)
		child.Destroy(context.Background())
	}
	t.Logf("fails: %d of 16", fails)
}
