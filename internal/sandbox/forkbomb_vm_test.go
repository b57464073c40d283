package sandbox

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
)

// TestForkBombVM runs a fork bomb as root, with a 15 s timeout, in a
// guest of this tree's agent. The agent starts commands in a cgroup of
// their own whose pids.max keeps room below the kernel's limit on tasks
// (internal/agent/cgroup.go): the bomb must run out of pids there (the
// group's pids.events counts hits of its limit) while the agent, PID 1,
// stays in the root group and is kept busy with execs and file reads;
// the timeout must end the bomb; and the guest must answer afterwards.
// Without the group the bomb exhausts the kernel's tasks, and the agent
// dies the first time its Go runtime cannot make a thread, taking the
// guest with it (seen in one run of four).
func TestForkBombVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	rt.cfg.ColdBoot = false
	sb, err := rt.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())

	out := expectOutput(ctx, t, sb, agentproto.ExecRequest{
		Cmd: "cat /proc/self/cgroup /proc/1/cgroup /sys/fs/cgroup/commands/pids.max /proc/sys/kernel/threads-max",
	}, `^0::/commands\n0::/\n\d+\n\d+\n$`)
	if f := strings.Fields(out); len(f) == 4 {
		pidsMax, _ := strconv.Atoi(f[2])
		threadsMax, _ := strconv.Atoi(f[3])
		if pidsMax <= 0 || pidsMax > threadsMax-256 {
			t.Errorf("the commands' pids.max is %d for a kernel of %d threads: it keeps no room for the agent", pidsMax, threadsMax)
		}
	}

	began := time.Now()
	// ash: the bomb is a function named f, since ":" is a builtin.
	var stderr bytes.Buffer
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Cmd: "f(){ f|f& };f; sleep 600", TimeoutMS: 15_000}, agentclient.Stdio{Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	// While the bomb fills the guest, execs and file reads keep the agent
	// starting processes and blocking in system calls, for which its Go
	// runtime makes threads. Their own results do not matter: starting a
	// process may well fail with EAGAIN then.
	time.Sleep(5 * time.Second)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 3 {
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if q, err := sb.Exec(tctx, agentproto.ExecRequest{Cmd: "cat /proc/loadavg"}, agentclient.Stdio{}); err == nil {
					q.Wait()
				}
				sb.Agent().ReadFile(tctx, "/proc/loadavg", io.Discard)
				cancel()
			}
		})
	}
	wg.Wait()
	exit, err := sb.Wait(p)
	took := time.Since(began)
	if err != nil {
		t.Fatalf("waiting for the bomb's exit: %v", err)
	}
	if !exit.TimedOut {
		t.Errorf("the bomb ended %+v, not by its timeout; stderr ends %q", exit, stderr.String()[max(0, stderr.Len()-300):])
	}
	t.Logf("the bomb's exit came after %s", took.Round(time.Millisecond))
	expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: "cat /sys/fs/cgroup/commands/pids.events"}, `(?m)^max [1-9]`)
	expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: "echo alive"}, `^alive\n$`)
}
