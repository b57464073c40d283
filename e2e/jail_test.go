package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/testenv"
)

// qemuOf returns the status fields of the QEMU of sandbox id of server s.
func qemuOf(t *testing.T, s *server, id string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.home, "sandboxes", id, "qemu.pid"))
	if err != nil {
		t.Fatalf("sandbox %s's qemu pid: %v", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return testenv.ProcStatus(t, pid)
}

// TestServeJail checks the jail through the server: a sandbox's QEMU runs
// unprivileged with seccomp and its limits show on the sandbox; --jail
// off runs QEMU as root, says so loudly, and is refused on a listener
// that is not loopback; bad jail flags are one clear line and exit 2.
func TestServeJail(t *testing.T) {
	s := sharedServer(t)
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	st := qemuOf(t, s, sb.ID)
	uid, _ := strconv.Atoi(strings.Fields(st["Uid"] + " 0")[0])
	if uid < 2000000000 || st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" || st["CapEff"] != "0000000000000000" {
		t.Errorf("a sandbox's QEMU runs as %s with seccomp %s, no_new_privs %s, capabilities %s", st["Uid"], st["Seccomp"], st["NoNewPrivs"], st["CapEff"])
	}
	if sb.Limits == nil || sb.Limits.CPUPct < 100 || sb.Limits.MemoryMiB <= sb.MemoryMiB || sb.Limits.Pids <= 0 {
		t.Errorf("a jailed sandbox's limits: %+v", sb.Limits)
	}
	s.deleteSandbox(t, s.key, sb.ID)

	off := newServer(t, "--jail", "off")
	sb = off.createSandbox(t, off.key, apiv1.CreateSandbox{Template: "tiny"})
	if st := qemuOf(t, off, sb.ID); !strings.HasPrefix(st["Uid"], "0\t") || st["Seccomp"] != "0" {
		t.Errorf("with the jail off QEMU runs as %s with seccomp %s", st["Uid"], st["Seccomp"])
	}
	if sb.Limits != nil {
		t.Errorf("an unjailed sandbox has limits %+v", sb.Limits)
	}
	if !strings.Contains(off.out.String(), "THE JAIL IS OFF") {
		t.Errorf("the server did not say that the jail is off: %s", off.out.String())
	}
	off.deleteSandbox(t, off.key, sb.ID)

	home := []string{"AIRLOCK_HOME=" + t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jail", "off", "--listen", "0.0.0.0:0"}, "is for debugging only and is refused on"},
		{[]string{"--jail", "off", "--listen", "127.0.0.1:0", "--e2b-listen", "0.0.0.0:0"}, "is for debugging only and is refused on"},
		{[]string{"--jail", "maybe"}, `--jail "maybe" is not on or off`},
		{[]string{"--jail-uids", "2000000000"}, "is not FIRST+COUNT"},
		{[]string{"--jail-uids", "0+100000"}, "must start at 1000"},
		{[]string{"--jail-uids", "1000+100000"}, "inside the jail user range"},
	} {
		out := runCLI(t, home, nil, append([]string{"serve"}, tc.args...)...)
		if out.code != 2 || !strings.Contains(out.stderr, tc.want) || strings.Count(strings.TrimSpace(out.stderr), "\n") != 0 {
			t.Errorf("serve %v: exit %d, stderr %q, want one line with %q", tc.args, out.code, out.stderr, tc.want)
		}
	}
}
