package sandbox

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestForkBombVM runs fork bombs as root, with a 15 s timeout, in guests
// of this tree's agent: busybox ash's in tiny and bash's in base. The
// agent starts commands in a cgroup of their own whose pids.max and
// memory.max keep room below what the kernel has, the pids limit low
// enough for the group to run out of pids before memory
// (internal/agent/cgroup.go), and stays in the root group itself. Each
// bomb must run out of pids in the group (its pids.events counts hits
// of the limit) while execs and file reads keep the agent making
// threads; it must end by its timeout within a minute of it; and the
// guest must answer afterwards. Without the group, the ash bomb
// exhausted the kernel's tasks and the agent died when its Go runtime
// could not make a thread (one run in four); the bash bomb filled the
// guest's memory, which stalled in global OOM kills for minutes (an exit
// 3 minutes late, or none), and so it did with a memory limit alone.
func TestForkBombVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	rt.cfg.ColdBoot = false
	linkHostTemplate(t, requireVMHost(t), rt.cfg.Dir, "base")
	for _, tc := range []struct {
		template string
		bomb     []string
	}{
		// ash: the bomb is a function named f, since ":" is a builtin.
		{"tiny", []string{"sh", "-c", "f(){ f|f& };f; sleep 600"}},
		{"base", []string{"bash", "-c", ":(){ :|:& };:; sleep 600"}},
	} {
		t.Run(tc.template, func(t *testing.T) {
			sb, err := rt.Create(ctx, Spec{Template: tc.template})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			forkBomb(ctx, t, sb, tc.bomb)
			expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: "cat /sys/fs/cgroup/commands/pids.events"}, `(?m)^max [1-9]`)
			expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: "echo alive"}, `^alive\n$`)
		})
	}
}

// forkBomb checks that the commands' group holds the commands and not the
// agent, with limits below the kernel's, then runs bomb with a 15 s
// timeout while it keeps the agent busy, and checks the bomb ends by its
// timeout within a minute of it.
func forkBomb(ctx context.Context, t *testing.T, sb *Sandbox, bomb []string) {
	t.Helper()
	out := expectOutput(ctx, t, sb, agentproto.ExecRequest{
		Cmd: "cat /proc/self/cgroup /proc/1/cgroup /sys/fs/cgroup/commands/pids.max /proc/sys/kernel/threads-max " +
			"/sys/fs/cgroup/commands/memory.max; grep MemTotal /proc/meminfo",
	}, `^0::/commands\n0::/\n\d+\n\d+\n\d+\nMemTotal: +\d+ kB\n$`)
	if f := strings.Fields(out); len(f) == 8 {
		pidsMax, _ := strconv.Atoi(f[2])
		threadsMax, _ := strconv.Atoi(f[3])
		memMax, _ := strconv.ParseInt(f[4], 10, 64)
		memTotal, _ := strconv.ParseInt(f[6], 10, 64)
		if pidsMax <= 0 || pidsMax > threadsMax-256 {
			t.Errorf("the commands' pids.max is %d for a kernel of %d threads: it keeps no room for the agent", pidsMax, threadsMax)
		}
		t.Logf("commands may hold %d pids of %d and %d MiB of %d", pidsMax, threadsMax, memMax>>20, memTotal>>10)
		if memMax <= 0 || memMax > memTotal<<10-32<<20 {
			t.Errorf("the commands' memory.max is %d for a guest of %d KiB: it keeps no room for the agent", memMax, memTotal)
		}
	}

	began := time.Now()
	var stderr bytes.Buffer
	p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: bomb, TimeoutMS: 15_000}, agentclient.Stdio{Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	// Once the bomb fills the commands' group (its pids limit refused a
	// fork), execs and file reads keep the agent starting processes and
	// blocking in system calls, for which its Go runtime makes threads.
	// Their own results do not matter: starting a process may well fail
	// with EAGAIN then.
	testenv.Eventually(t, 30*time.Second, "the bomb at the commands' pids limit", func() (bool, string) {
		var ev bytes.Buffer
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := sb.Agent().ReadFile(tctx, "/sys/fs/cgroup/commands/pids.events", &ev); err != nil {
			return false, err.Error()
		}
		return regexp.MustCompile(`(?m)^max [1-9]`).Match(ev.Bytes()), ev.String()
	})
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
	type result struct {
		exit agentproto.Exit
		err  error
	}
	done := make(chan result, 1)
	go func() {
		exit, err := sb.Wait(p)
		done <- result{exit, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Until(began.Add(75 * time.Second))):
		console, _ := os.ReadFile(filepath.Join(sb.Dir, "console.log"))
		t.Fatalf("the bomb did not end by its 15 s timeout within a minute; stderr ends %q; the console ends:\n%s",
			stderr.String()[max(0, stderr.Len()-300):], console[max(0, len(console)-3000):])
	}
	took := time.Since(began)
	if r.err != nil {
		t.Fatalf("waiting for the bomb's exit: %v", r.err)
	}
	if !r.exit.TimedOut {
		t.Errorf("the bomb ended %+v, not by its timeout; stderr ends %q", r.exit, stderr.String()[max(0, stderr.Len()-300):])
	}
	t.Logf("the bomb's exit came after %s", took.Round(time.Millisecond))
}
