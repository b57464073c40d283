package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// keyCLI runs the airlock binary as a client of s with the API key key.
func keyCLI(t *testing.T, s *server, key string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(binPath(), args...)
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url, "AIRLOCK_API_KEY="+key)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return cliResult{out.String(), errb.String(), code}
}

// TestCLITop runs `airlock sandbox top` against a real server, with a
// key of its own so that it sees only its sandbox: one table, JSON lines,
// a live run ended by SIGINT, a paused sandbox and bad flags.
func TestCLITop(t *testing.T) {
	s := sharedServer(t)
	var key apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.key, apiv1.CreateKey{Name: "top-e2e", Role: apiv1.RoleUser}, &key)
	sb := s.createSandbox(t, key.Key, apiv1.CreateSandbox{Template: "tiny", VCPUs: 1, MemoryMiB: 256, DiskMiB: 512})

	r := keyCLI(t, s, key.Key, "sandbox", "top", "--once")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("top --once: exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	// The server runs its VMs jailed, so its sandboxes also have the
	// host side, from their cgroups.
	if h := strings.Fields(lines[0]); strings.Join(h, " ") != "ID TEMPLATE STATE CPU% MEM(MiB) DISK(MiB) VCPUS VMM_CPU% VMM_MEM(MiB)" {
		t.Errorf("header %q", lines[0])
	}
	row := strings.Fields(lines[1])
	var memUsed, memTotal, diskUsed, diskTotal, vmmMem int
	var cpu float64
	if len(row) != 9 || row[0] != sb.ID || row[1] != "tiny:latest" || row[2] != "running" || row[6] != "1" {
		t.Fatalf("row %q", lines[1])
	}
	_, err1 := fmt.Sscanf(row[3], "%g", &cpu)
	_, err2 := fmt.Sscanf(row[4], "%d/%d", &memUsed, &memTotal)
	_, err3 := fmt.Sscanf(row[5], "%d/%d", &diskUsed, &diskTotal)
	if err := errors.Join(err1, err2, err3); err != nil || cpu < 0 || cpu > 100 || memUsed <= 0 || memTotal < 160 || memTotal > 256 ||
		diskUsed <= 0 || diskTotal < 400 || diskTotal > 512 {
		t.Errorf("measures of a 256 MiB, 512 MiB-disk sandbox: %q (%v)", lines[1], err)
	}
	if _, err := fmt.Sscanf(row[8], "%d", &vmmMem); err != nil || vmmMem < memUsed/2 {
		t.Errorf("the VMM's memory %q beside the guest's %d MiB", row[8], memUsed)
	}

	r = keyCLI(t, s, key.Key, "sandbox", "top", "--once", "--json")
	var got struct {
		ID      string                `json:"id"`
		State   string                `json:"state"`
		VCPUs   int                   `json:"vcpus"`
		Metrics *apiv1.SandboxMetrics `json:"metrics"`
		Error   *apiv1.Status         `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil || got.ID != sb.ID || got.VCPUs != 1 || got.Error != nil ||
		got.Metrics == nil || got.Metrics.MemTotalMiB != int64(memTotal) || got.Metrics.Time.IsZero() {
		t.Errorf("top --once --json: exit %d, %v: %s", r.code, err, r.stdout)
	}

	// Live: tables one after another (stdout is not a terminal), until
	// SIGINT, which exits 0.
	cmd := exec.Command(binPath(), "sandbox", "top", "--interval", "500ms")
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+s.url, "AIRLOCK_API_KEY="+key.Key)
	var out, errb safeBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(out.String(), "\n\nID") < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("top after SIGINT: %v (stderr %q), want exit 0", err, errb.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("top still running 10 s after SIGINT")
	}
	if tables := strings.Split(strings.TrimRight(out.String(), "\n"), "\n\n"); len(tables) < 3 || !strings.Contains(tables[2], sb.ID+" ") ||
		strings.Contains(out.String(), "\033") {
		t.Errorf("live top with stdout not a terminal, %d tables:\n%s", len(tables), out.String())
	}

	// A paused sandbox is listed with its state and no measures.
	var op apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+sb.ID+"/pause", key.Key, nil, &op)
	s.waitOp(t, key.Key, op.Operation.ID)
	r = keyCLI(t, s, key.Key, "sandbox", "top", "--once")
	if f := strings.Fields(strings.Split(r.stdout, "\n")[1]); r.code != 0 || strings.Join(f, " ") != sb.ID+" tiny:latest paused - - - 1" {
		t.Errorf("top of a paused sandbox: exit %d:\n%s", r.code, r.stdout)
	}

	for _, args := range [][]string{{"--interval", "soon"}, {"--interval", "0s"}, {"--no-such-flag"}} {
		r = keyCLI(t, s, key.Key, append([]string{"sandbox", "top"}, args...)...)
		if r.code != 2 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "airlock: sandbox top") {
			t.Errorf("top %q: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
	if r = keyCLI(t, s, key.Key, "sandbox", "top", "-h"); r.code != 0 || !strings.Contains(r.stderr, "-interval") || !strings.Contains(r.stderr, "-once") {
		t.Errorf("top -h: exit %d, %q", r.code, r.stderr)
	}
}
