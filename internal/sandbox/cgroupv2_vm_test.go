package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// TestCgroupV2VM runs internal/cgroup's suite on cgroup v2. This host's
// controllers are on v1 (a hybrid layout), so the suite runs where v2 is
// the whole story: in a guest, whose agent mounts cgroup2 with the cpu,
// memory, pids and io controllers, as root. The suite itself (limits
// written and read back, threads moved, OOM kills, fork limits, CPU
// quotas, deletes, bad input) is the one TestHost runs on the host; in
// the guest TestHost runs it on the hierarchy Open picks and TestV2
// through openV2, and both must pass.
func TestCgroupV2VM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rt := hostRuntime(t, ctx)
	bin := filepath.Join(t.TempDir(), "cgroup.test")
	cmd := exec.Command(goTool(t), "test", "-c", "-trimpath", "-o", bin, "github.com/airlockhq/airlock/internal/cgroup")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the cgroup tests: %v: %s", err, out)
	}
	sb, err := rt.Create(ctx, Spec{Template: "tiny", MemoryMiB: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := sb.Agent().WriteFile(ctx, "/root/cgroup.test", 0o755, f); err != nil {
		t.Fatal(err)
	}
	out, stderr, exit := execIn(ctx, t, sb, agentproto.ExecRequest{
		Cmd: "cat /sys/fs/cgroup/cgroup.controllers && " +
			"cd /root && CI=true ./cgroup.test -test.v -test.count=1 -test.run '^(TestHost|TestV2)$'",
		TimeoutMS: 150_000,
	})
	if exit.ExitCode != 0 || !strings.Contains(out, "cgroup v2, parent") || !strings.Contains(out, "--- PASS: TestHost") || !strings.Contains(out, "--- PASS: TestV2") {
		t.Fatalf("the cgroup suite on v2 in the guest: exit %+v\n%s\n%s", exit, out, stderr)
	}
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !strings.Contains(strings.SplitN(out, "\n", 2)[0], c) {
			t.Errorf("the guest's cgroup2 lacks %s: %s", c, strings.SplitN(out, "\n", 2)[0])
		}
	}
	t.Logf("%s", out)
}
