package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
)

// cloneRuntime returns a runtime over a data directory of its own, which
// shares the host's boot artifacts, templates and accelerator verdict but
// has no template snapshots yet. It skips the test under -short, or when
// the host is not set up for VMs or lacks the tiny template.
func cloneRuntime(t *testing.T, ctx context.Context) *Runtime {
	t.Helper()
	host := requireVMHost(t)
	// Not t.TempDir: sockets live under it, and their paths must be short.
	root, err := os.MkdirTemp("", "al-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	for _, name := range []string{"boot", "templates"} {
		if err := os.Symlink(filepath.Join(host.Root, name), filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	dd := datadir.Dir{Root: root}
	if b, err := os.ReadFile(host.AccelVerdict()); err == nil {
		os.WriteFile(dd.AccelVerdict(), b, 0o644)
	}
	return tinyRuntime(t, ctx, dd)
}

// TestTemplateSnapshotVM creates sandboxes of the tiny template as clones
// of its snapshot, against real VMs: concurrent first creates make the
// snapshot once; a create is a clone and a cold boot is not; clones have
// their own random state, hostname, clock and disk; a clone suspends and
// wakes; a damaged snapshot is made again, or, when QEMU refuses it,
// creates fall back to a boot.
func TestTemplateSnapshotVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rt := cloneRuntime(t, ctx)
	var live []*Sandbox
	t.Cleanup(func() {
		for _, sb := range live {
			sb.Destroy(context.Background())
		}
	})
	create := func(t *testing.T, spec Spec) (*Sandbox, time.Duration) {
		t.Helper()
		spec.Template = "tiny"
		start := time.Now()
		sb, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		live = append(live, sb)
		return sb, took
	}

	// Four creates at once, with no snapshot yet, make it once.
	const n = 4
	var clones [n]*Sandbox
	var errs [n]error
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := Spec{Template: "tiny"}
			if i == 1 {
				spec.DiskMiB = 400 // grown from the snapshot's disk (256 MiB)
			}
			clones[i], errs[i] = rt.Create(ctx, spec)
		}()
	}
	wg.Wait()
	firstTook := time.Since(start)
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d of %d at once: %v", i, n, errs[i])
		}
		live = append(live, clones[i])
	}
	if got := rt.built.Load(); got != 1 {
		t.Fatalf("%d concurrent creates made the snapshot %d times, want once", n, got)
	}
	snap, err := rt.TemplateSnapshot(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if rt.built.Load() != 1 {
		t.Fatal("TemplateSnapshot made the snapshot again")
	}
	for i, sb := range clones {
		if sb.Snapshot != snap.Dir {
			t.Fatalf("create %d: cloned from %q, want the snapshot %s", i, sb.Snapshot, snap.Dir)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(rt.cfg.Dir.Snapshots(), snapshotBuildPrefix+"*")); len(left) > 0 {
		t.Errorf("build directories left: %v", left)
	}
	rec, err := readSnapshotRecord(snap.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d concurrent first creates took %s; the snapshot took %d ms to make; memory file %s, state %d bytes",
		n, firstTook.Round(time.Millisecond), rec.BuildMillis, fileSize(t, snap.MemFile), rec.StateBytes)
	a, b := clones[0], clones[1]

	// How much faster a clone is than a boot, and how much less memory
	// it holds, is the bench's to say (clone_vs_boot, idle_pss), against
	// baselines measured in the same run; here, what each create is.
	t.Run("a cold boot is not a clone", func(t *testing.T) {
		clone, _ := create(t, Spec{})
		if clone.Snapshot != snap.Dir {
			t.Errorf("a create was cloned from %q, want the snapshot %s", clone.Snapshot, snap.Dir)
		}
		cold, _ := create(t, Spec{ColdBoot: true})
		if cold.Snapshot != "" {
			t.Fatalf("a cold boot was cloned from %s", cold.Snapshot)
		}
		if got := shell(ctx, t, cold, "hostname"); got != cold.ID {
			t.Errorf("the booted sandbox's hostname is %q, want %s", got, cold.ID)
		}
	})

	t.Run("clones differ", func(t *testing.T) {
		const probe = "hostname; cat /proc/sys/kernel/random/uuid; head -c 32 /dev/urandom | od -x | tr -s ' \\n' ' '; echo; date +%s"
		type view struct{ hostname, uuid, random string }
		look := func(sb *Sandbox) view {
			before := time.Now().Unix()
			lines := strings.Split(shell(ctx, t, sb, probe), "\n")
			after := time.Now().Unix()
			if len(lines) != 4 {
				t.Fatalf("%s: got %q", sb.ID, lines)
			}
			clock, err := strconv.ParseInt(strings.TrimSpace(lines[3]), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if clock < before-1 || clock > after+1 {
				t.Errorf("%s: the guest's clock says %d, the host's %d to %d", sb.ID, clock, before, after)
			}
			return view{lines[0], lines[1], lines[2]}
		}
		va, vb := look(a), look(b)
		t.Logf("clone a: %+v\nclone b: %+v", va, vb)
		if va.hostname != a.ID || vb.hostname != b.ID {
			t.Errorf("hostnames %q and %q, want the IDs %s and %s", va.hostname, vb.hostname, a.ID, b.ID)
		}
		if va.uuid == vb.uuid || va.random == vb.random {
			t.Errorf("two clones read the same random numbers: %+v and %+v", va, vb)
		}
	})

	t.Run("clones have their own disks", func(t *testing.T) {
		if got, want := b.Init.DiskBytes, int64(400)<<20; got != want {
			t.Errorf("the guest's disk is %d bytes, want %d", got, want)
		}
		if got := shell(ctx, t, b, "cat /sys/block/vda/size"); got != strconv.Itoa(400<<11) {
			t.Errorf("the guest's disk has %s sectors, want %d", got, 400<<11)
		}
		shell(ctx, t, a, "echo a > /only-in-a && sync")
		if got := shell(ctx, t, b, "cat /only-in-a 2>/dev/null || echo absent"); got != "absent" {
			t.Errorf("a file written in one clone is in another: %q", got)
		}
		if got := shell(ctx, t, a, "cat /only-in-a"); got != "a" {
			t.Errorf("the clone's own file reads %q", got)
		}
	})

	t.Run("clone suspends and wakes", func(t *testing.T) {
		sb := clones[2]
		shell(ctx, t, sb, "echo kept > /kept && sync")
		if err := sb.Suspend(ctx); err != nil {
			t.Fatal(err)
		}
		woken, err := rt.Wake(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		for i := range live {
			if live[i] == sb { // spent by the suspend
				live[i] = woken
			}
		}
		if woken.Snapshot != snap.Dir {
			t.Errorf("the woken clone says it was cloned from %q, want %s", woken.Snapshot, snap.Dir)
		}
		if got := shell(ctx, t, woken, "cat /kept; hostname"); got != "kept\n"+sb.ID {
			t.Errorf("after the wake: %q", got)
		}
		checkClock(ctx, t, woken)
	})

	for _, sb := range live {
		sb.Destroy(ctx)
	}
	live = nil

	t.Run("truncated state is made again", func(t *testing.T) {
		before := rt.built.Load()
		if err := os.Truncate(snap.StateFile, rec.StateBytes/2); err != nil {
			t.Fatal(err)
		}
		sb, took := create(t, Spec{})
		if sb.Snapshot != snap.Dir || rt.built.Load() != before+1 {
			t.Fatalf("cloned from %q after making %d snapshots; want a clone of the snapshot made again", sb.Snapshot, rt.built.Load()-before)
		}
		if _, err := rt.TemplateSnapshot(ctx, Spec{Template: "tiny"}); err != nil || rt.built.Load() != before+1 {
			t.Fatalf("the snapshot made again is not usable: %v", err)
		}
		t.Logf("create with a new snapshot took %s", took.Round(time.Millisecond))
		shell(ctx, t, sb, "true")
	})

	t.Run("a state QEMU refuses falls back to a boot", func(t *testing.T) {
		before := rt.built.Load()
		fi, err := os.Stat(snap.StateFile)
		if err != nil {
			t.Fatal(err)
		}
		// Whole by its size, but not a migration stream.
		if err := os.WriteFile(snap.StateFile, make([]byte, fi.Size()), 0o644); err != nil {
			t.Fatal(err)
		}
		sb, took := create(t, Spec{})
		if sb.Snapshot != "" {
			t.Fatalf("cloned from the damaged snapshot %s", sb.Snapshot)
		}
		if got := shell(ctx, t, sb, "hostname"); got != sb.ID {
			t.Errorf("the booted sandbox's hostname is %q", got)
		}
		t.Logf("create falling back to a boot took %s", took.Round(time.Millisecond))
		why, err := os.ReadFile(filepath.Join(snap.Dir, snapshotBrokenName))
		if err != nil {
			t.Fatalf("the snapshot is not marked broken: %v", err)
		}
		t.Logf("marked broken: %s", why)
		if rt.built.Load() != before {
			t.Fatal("the fallback made the snapshot again")
		}

		sb, _ = create(t, Spec{})
		if sb.Snapshot != snap.Dir || rt.built.Load() != before+1 {
			t.Fatalf("the next create cloned from %q after making %d snapshots; want a clone of the snapshot made again", sb.Snapshot, rt.built.Load()-before)
		}
		if _, err := os.Stat(filepath.Join(snap.Dir, snapshotBrokenName)); !os.IsNotExist(err) {
			t.Errorf("the snapshot made again is still marked broken: %v", err)
		}
		shell(ctx, t, sb, "true")
	})
}

// fileSize describes the apparent and allocated size of a file.
func fileSize(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d MiB (%d MiB allocated)", st.Size>>20, st.Blocks*512>>20)
}
