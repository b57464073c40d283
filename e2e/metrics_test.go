package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestSandboxMetrics measures a sandbox from its guest: sizes as asked,
// disk use that grows with a file, CPU use with a spinner, and 409 once
// the sandbox is paused.
func TestSandboxMetrics(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny", VCPUs: 1, MemoryMiB: 256, DiskMiB: 512})
	var before apiv1.SandboxMetrics
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/metrics", s.key, nil, &before)
	if before.CPUCount != 1 || before.MemTotalMiB < 160 || before.MemTotalMiB > 256 || before.DiskTotalMiB < 400 || before.DiskTotalMiB > 512 ||
		before.MemUsedMiB <= 0 || before.DiskUsedMiB <= 0 || before.Time.IsZero() {
		t.Errorf("metrics of a 1-vCPU, 256 MiB, 512 MiB-disk sandbox: %+v", before)
	}
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key,
		apiv1.CommandRequest{Cmd: "dd if=/dev/zero of=/root/fill bs=1M count=64 2>/dev/null && sync; (while :; do :; done) >/dev/null 2>&1 &"}, &res)
	if res.ExitCode != 0 {
		t.Fatalf("fill and spin: %+v", res)
	}
	var after apiv1.SandboxMetrics
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/metrics", s.key, nil, &after)
	if grown := after.DiskUsedMiB - before.DiskUsedMiB; grown < 60 || grown > 80 {
		t.Errorf("a 64 MiB file grew disk use by %d MiB (%d to %d)", grown, before.DiskUsedMiB, after.DiskUsedMiB)
	}
	if after.CPUUsedPct < 50 {
		t.Errorf("with a spinner on its only vCPU the sandbox uses %.1f%% CPU", after.CPUUsedPct)
	}
	// The host side, from the VMM's cgroup: the spinning vCPU shows as
	// QEMU's CPU (its quota is 125% of a CPU), and QEMU holds at least the
	// guest memory in use.
	if after.VMMCPUPct < 30 || after.VMMCPUPct > 140 || after.VMMMemMiB < after.MemUsedMiB/2 {
		t.Errorf("host side with a spinner: vmm cpu %.1f%%, vmm memory %d MiB (guest uses %d)", after.VMMCPUPct, after.VMMMemMiB, after.MemUsedMiB)
	}
	var got apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil, &got)
	if l := got.Limits; l == nil || l.CPUPct != 125 || l.MemoryMiB <= 256 || l.Pids <= 0 {
		t.Errorf("limits of a 1-vCPU, 256 MiB sandbox: %+v", got.Limits)
	}

	var op apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/pause", s.key, nil, &op)
	s.waitOp(t, s.key, op.Operation.ID)
	if status, body := s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/metrics", s.key, nil); status != 409 || !strings.Contains(string(body), "paused") {
		t.Errorf("metrics of a paused sandbox: %d %s", status, body)
	}
	if status, _ := s.call(t, "GET", "/v1/sandboxes/sbxnosuch/metrics", s.key, nil); status != 404 {
		t.Errorf("metrics of an unknown sandbox: %d", status)
	}
}

// TestMetricsPerSandbox scrapes /metrics for the gauges of each running
// sandbox: two appear with their IDs and template; over
// --metrics-per-sandbox none do and a gauge says why; a deleted sandbox
// disappears.
func TestMetricsPerSandbox(t *testing.T) {
	s := newServer(t)
	a := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 256})
	b := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny", MemoryMiB: 256})
	series := func(name, id string) string {
		return name + `{sandbox="` + id + `",template="tiny:latest"}`
	}
	// scrape waits (a few scrapes at most) until the sandboxes in want
	// have series and those in gone have none.
	scrape := func(want, gone []string) map[string]float64 {
		t.Helper()
		var values map[string]float64
		for try := 0; try < 10; try++ {
			status, body := s.call(t, "GET", "/metrics", "", nil)
			if status != 200 {
				t.Fatalf("metrics: %d %s", status, body)
			}
			values = map[string]float64{}
			for _, line := range strings.Split(string(body), "\n") {
				var v float64
				if name, val, ok := strings.Cut(line, " "); ok && strings.HasPrefix(name, "airlock_sandbox_") {
					if _, err := fmt.Sscan(val, &v); err == nil {
						values[name] = v
					}
				}
			}
			ok := true
			for _, id := range want {
				_, has := values[series("airlock_sandbox_mem_used_bytes", id)]
				ok = ok && has
			}
			for _, id := range gone {
				_, has := values[series("airlock_sandbox_mem_used_bytes", id)]
				ok = ok && !has
			}
			if ok {
				return values
			}
			time.Sleep(time.Second)
		}
		t.Fatalf("after 10 scrapes, want series of %q and none of %q; have %v", want, gone, values)
		return nil
	}

	got := scrape([]string{a.ID, b.ID}, nil)
	for _, id := range []string{a.ID, b.ID} {
		cpu, hasCPU := got[series("airlock_sandbox_cpu_used_pct", id)]
		memTotal := got[series("airlock_sandbox_mem_total_bytes", id)]
		diskUsed, diskTotal := got[series("airlock_sandbox_disk_used_bytes", id)], got[series("airlock_sandbox_disk_total_bytes", id)]
		if !hasCPU || cpu < 0 || cpu > 100 || memTotal < 160<<20 || memTotal > 256<<20 || got[series("airlock_sandbox_mem_used_bytes", id)] <= 0 ||
			diskUsed <= 0 || diskTotal < diskUsed {
			t.Errorf("series of %s: cpu %v (%v), mem total %v, disk %v of %v", id, cpu, hasCPU, memTotal, diskUsed, diskTotal)
		}
		// The host side, from the sandbox's cgroup: QEMU has used CPU
		// and holds at least the guest memory it touched.
		if vcpu, vmem := got[series("airlock_sandbox_vmm_cpu_seconds_total", id)], got[series("airlock_sandbox_vmm_memory_bytes", id)]; vcpu <= 0 || vmem < 16<<20 {
			t.Errorf("vmm series of %s: cpu %v s, memory %v", id, vcpu, vmem)
		}
	}
	if got[`airlock_sandbox_metrics_limit`] != 100 || got[`airlock_sandbox_metrics_suppressed{reason="over_limit"}`] != 0 {
		t.Errorf("limit and suppressed gauges under the default limit: %v", got)
	}

	// Two running over a limit of one: no per-sandbox series at all.
	s.stop(syscall.SIGTERM)
	s.args = append(s.args, "--metrics-per-sandbox", "1")
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	status, body := s.call(t, "GET", "/metrics", "", nil)
	if status != 200 || strings.Contains(string(body), "airlock_sandbox_cpu_used_pct{") ||
		!strings.Contains(string(body), `airlock_sandbox_metrics_suppressed{reason="over_limit"} 1`) ||
		!strings.Contains(string(body), "airlock_sandbox_metrics_limit 1") {
		t.Errorf("metrics with 2 sandboxes running over a limit of 1: %d\n%s", status, grepLines(string(body), "airlock_sandbox_"))
	}

	// The deleted one goes, and the other, now alone under the limit, is back.
	s.deleteSandbox(t, s.key, b.ID)
	got = scrape([]string{a.ID}, []string{b.ID})
	if got[`airlock_sandbox_metrics_suppressed{reason="over_limit"}`] != 0 {
		t.Errorf("over_limit with one sandbox running under a limit of 1: %v", got)
	}
	for name := range got {
		if strings.Contains(name, b.ID) {
			t.Errorf("series of the deleted sandbox %s: %s", b.ID, name)
		}
	}
}

// grepLines is the lines of text that hold sub.
func grepLines(text, sub string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
