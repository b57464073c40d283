package e2e

import (
	"strings"
	"testing"

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
