//go:build probe

package bench

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
)

func TestProbeIdle(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: datadir.Default()})
	if err != nil { t.Fatal(err) }
	sb, err := rt.Create(ctx, sandbox.Spec{Template: "tiny"})
	if err != nil { t.Fatal(err) }
	defer destroy(sb)
	run := func(between func()) time.Duration {
		var ds []time.Duration
		for i := 0; i < 60; i++ {
			between()
			t1 := time.Now()
			p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}}, agentclient.Stdio{})
			if err != nil { t.Fatal(err) }
			sb.Wait(p)
			ds = append(ds, time.Since(t1))
		}
		return p50(ds[10:])
	}
	for round := 0; round < 2; round++ {
		t.Logf("back to back between %v", run(func() {}))
		var ds []time.Duration
		for i := 0; i < 60; i++ {
			exec.CommandContext(ctx, "/bin/true").Run()
			t1 := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if err := runInSandbox(cctx, sb, []string{"true"}, nil); err != nil { t.Fatal(err) }
			cancel()
			ds = append(ds, time.Since(t1))
		}
		t.Logf("like bench between %v", p50(ds[10:]))
		t.Logf("host fork between %v", run(func() { exec.Command("/bin/true").Run() }))
		t.Logf("sleep 2ms between %v", run(func() { time.Sleep(2 * time.Millisecond) }))
		t.Logf("sleep 20ms between %v", run(func() { time.Sleep(20 * time.Millisecond) }))
		t.Logf("ping before %v", run(func() { sb.Agent().Ping(ctx) }))
	}
}
