//go:build probe

package bench

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/sandbox"
)

func p50(ds []time.Duration) time.Duration { s := slices.Clone(ds); slices.Sort(s); return percentile(s, 50) }

func TestProbeExec(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: datadir.Default()})
	if err != nil { t.Fatal(err) }
	sb, err := rt.Create(ctx, sandbox.Spec{Template: "tiny"})
	if err != nil { t.Fatal(err) }
	defer destroy(sb)
	const n = 100
	var ping, started, exited, total, agentDur []time.Duration
	for i := 0; i < n+5; i++ {
		t0 := time.Now()
		if _, err := sb.Agent().Ping(ctx); err != nil { t.Fatal(err) }
		t1 := time.Now()
		p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}}, agentclient.Stdio{})
		if err != nil { t.Fatal(err) }
		t2 := time.Now()
		ex, err := sb.Wait(p)
		if err != nil { t.Fatal(err) }
		t3 := time.Now()
		if i < 5 { continue }
		ping = append(ping, t1.Sub(t0)); started = append(started, t2.Sub(t1)); exited = append(exited, t3.Sub(t2)); total = append(total, t3.Sub(t1))
		agentDur = append(agentDur, time.Duration(ex.DurationMS)*time.Millisecond)
	}
	var abs []time.Duration
	for i := 0; i < n; i++ {
		t1 := time.Now()
		p, _ := sb.Exec(ctx, agentproto.ExecRequest{Argv: []string{"/bin/true"}}, agentclient.Stdio{})
		sb.Wait(p)
		abs = append(abs, time.Since(t1))
	}
	t.Logf("p50 ping %v; exec: request->started %v, started->exit %v, total %v; agent-side process duration %v; /bin/true total %v",
		p50(ping), p50(started), p50(exited), p50(total), p50(agentDur), p50(abs))
	// guest-side cost of fork/exec: run 100 trues inside one exec
	t0 := time.Now()
	p, _ := sb.Exec(ctx, agentproto.ExecRequest{Cmd: "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done"}, agentclient.Stdio{Stderr: os.Stderr})
	sb.Wait(p)
	t.Logf("100 x /bin/true inside the guest shell: %v per run", time.Since(t0)/100)
}
