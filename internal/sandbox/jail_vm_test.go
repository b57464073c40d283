package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/testenv"
	"github.com/airlockhq/airlock/internal/vm"
)

// TestJailEscapeVM tries to get out of a jailed sandbox, from the guest
// as root and from its QEMU's side: QEMU runs as a user of its own with
// no capabilities, no_new_privs and seccomp on; its root holds none of
// the sandbox's other files nor another sandbox's; that user can open
// neither, on the host nor in QEMU's mount namespace; and the guest has
// no device that shows it the host's files or processes.
func TestJailEscapeVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rt := cloneRuntime(t, ctx)
	if !rt.Jailed() {
		t.Fatal("the runtime is not jailed")
	}
	a, err := rt.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy(context.Background())
	b, err := rt.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy(context.Background())
	defer func() {
		// Destroyed, a sandbox's cgroup is gone.
		a.Destroy(context.Background())
		b.Destroy(context.Background())
		names, err := rt.cg.List()
		if err != nil || len(names) != 0 {
			t.Errorf("cgroups left after the sandboxes: %v, %v", names, err)
		}
	}()

	uids := map[int]string{}
	for _, sb := range []*Sandbox{a, b} {
		st := testenv.ProcStatus(t, sb.vm.PID())
		rec, err := readRecord(sb.Dir)
		if err != nil || rec.VM.Jail == nil {
			t.Fatalf("sandbox %s's record has no jail: %v", sb.ID, err)
		}
		uid := rec.VM.Jail.UID
		if !vm.DefaultUIDs.Contains(uid) {
			t.Errorf("sandbox %s's QEMU runs as %d, outside the jail range", sb.ID, uid)
		}
		if other, ok := uids[uid]; ok {
			t.Errorf("sandboxes %s and %s share user %d", other, sb.ID, uid)
		}
		uids[uid] = sb.ID
		want := strings.Repeat(strconv.Itoa(uid)+"\t", 3) + strconv.Itoa(uid)
		for k, v := range map[string]string{
			"Uid": want, "Gid": want, "Groups": "", "NoNewPrivs": "1", "Seccomp": "2",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		} {
			if st[k] != v {
				t.Errorf("sandbox %s's QEMU has %s %q, want %q", sb.ID, k, st[k], v)
			}
		}
	}
	aUID := strconv.Itoa(mustJail(t, a).UID)

	// Each QEMU is in its sandbox's cgroup, with the limits of its size.
	for _, sb := range []*Sandbox{a, b} {
		if sb.cg == nil {
			t.Fatalf("sandbox %s has no cgroup", sb.ID)
		}
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(sb.vm.PID()) + "/cgroup")
		if !strings.Contains(string(b), ":/"+sb.cg.Path()+"\n") {
			t.Errorf("sandbox %s's QEMU is not in cgroup %s: %s", sb.ID, sb.cg.Path(), b)
		}
		if got, want := sb.cg.Resources(), *rt.Limits(sb.Spec.VCPUs, sb.Spec.MemoryMiB); got.MemoryBytes != want.MemoryBytes || got.CPUQuotaUS != want.CPUQuotaUS || got.Pids != want.Pids {
			t.Errorf("sandbox %s's cgroup has %+v, want %+v", sb.ID, got, want)
		}
		st, err := sb.VMMStats()
		if err != nil || st.MemoryBytes == 0 || st.CPUUsageNS == 0 || st.Pids == 0 {
			t.Errorf("sandbox %s's VMM stats: %+v, %v", sb.ID, st, err)
		}
	}

	// QEMU's root: outside /usr, only the boot files, its disk chain and
	// devices; nothing else of either sandbox's directory.
	root := "/proc/" + strconv.Itoa(a.vm.PID()) + "/root"
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		rel := strings.TrimPrefix(p, root)
		if err != nil || rel == "/usr" || rel == "/proc" {
			return filepath.SkipDir
		}
		if fi.IsDir() || fi.Mode()&os.ModeSymlink != 0 {
			return nil
		}
		switch {
		case rel == filepath.Join(a.Dir, diskName), strings.HasPrefix(rel, "/dev/"), rel == "/etc/ld.so.cache",
			rel == rt.cfg.Dir.Kernel(), rel == rt.cfg.Dir.Initramfs(), strings.HasSuffix(rel, ".ext4"):
		default:
			t.Errorf("sandbox %s's QEMU sees %s", a.ID, rel)
		}
		return nil
	})

	// As A's QEMU's user: B's disk and directory, A's own gateway key and
	// record, the snapshot's memory, the data directory; on the host and
	// in A's mount namespace.
	targets := []string{filepath.Join(b.Dir, diskName), b.Dir, filepath.Join(a.Dir, gatewayDirName), filepath.Join(a.Dir, RecordName), rt.cfg.Dir.Root}
	if a.Snapshot != "" {
		targets = append(targets, filepath.Join(a.Snapshot, snapshotMemName))
	}
	for _, target := range targets {
		probe := []string{"setpriv", "--reuid", aUID, "--regid", aUID, "--clear-groups", "--", "sh", "-c", `cat "$1" >/dev/null 2>&1 || ls "$1" >/dev/null 2>&1`, "probe", target}
		for _, ns := range []bool{false, true} {
			if ns && target == rt.cfg.Dir.Root {
				// In the namespace it is the skeleton of directories
				// leading to the jail's files, which may be listed.
				continue
			}
			argv := probe
			if ns {
				argv = append([]string{"nsenter", "-t", strconv.Itoa(a.vm.PID()), "-m", "--"}, probe...)
			}
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err == nil {
				t.Errorf("A's QEMU user read %s (in its namespace: %v): %s", target, ns, out)
			}
		}
	}
	// The probe itself works: A's user reads A's disk in its namespace.
	if out, err := exec.Command("nsenter", "-t", strconv.Itoa(a.vm.PID()), "-m", "--",
		"setpriv", "--reuid", aUID, "--regid", aUID, "--clear-groups", "--", "head", "-c", "4", filepath.Join(a.Dir, diskName)).CombinedOutput(); err != nil || string(out) != "QFI\xfb" {
		t.Errorf("the probe cannot read A's own disk: %v %q", err, out)
	}

	// From the guest as root: its devices are the disk, the console, the
	// agent's port, the NIC and the RNG; no shared filesystem; and no
	// process of the host. A process that ends between the glob and its
	// read is no failure of the probe.
	out, _, exit := execIn(ctx, t, a, agentproto.ExecRequest{Cmd: `cat /sys/bus/virtio/devices/*/device; echo; cat /proc/filesystems; echo; cat /proc/[0-9]*/comm 2>/dev/null; true`})
	if exit.ExitCode != 0 {
		t.Fatalf("probe in the guest: %+v %s", exit, out)
	}
	devices, rest, _ := strings.Cut(out, "\n\n")
	for _, id := range strings.Fields(devices) {
		switch id {
		case "0x0001", "0x0002", "0x0003", "0x0004": // net, block, console, rng
		default:
			t.Errorf("the guest has virtio device %s", id)
		}
	}
	filesystems, comms, _ := strings.Cut(rest, "\n\n")
	for _, fs := range []string{"9p", "virtiofs", "fuse"} {
		for _, line := range strings.Split(filesystems, "\n") {
			if strings.HasSuffix(strings.TrimSpace(line), "\t"+fs) || strings.TrimSpace(strings.TrimPrefix(line, "nodev")) == fs {
				t.Errorf("the guest kernel offers %s", fs)
			}
		}
	}
	for _, c := range strings.Fields(comms) {
		if strings.HasPrefix(c, "qemu") || c == "airlock" {
			t.Errorf("the guest sees process %s", c)
		}
	}
}

func mustJail(t *testing.T, sb *Sandbox) *vm.Jail {
	t.Helper()
	rec, err := readRecord(sb.Dir)
	if err != nil || rec.VM.Jail == nil {
		t.Fatalf("sandbox %s has no jail: %v", sb.ID, err)
	}
	return rec.VM.Jail
}
