package sandbox

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
)

// TestCheckpointVM checkpoints a real sandbox with a process counting all
// along: the source's count goes on through the checkpoint; two sandboxes
// made from it have the disk as it was at the checkpoint, the counting
// process running on from there, their own hostname and random state;
// the source, suspended and woken after, has its own later disk; and the
// checkpoint's directory stays while the source stands on it.
func TestCheckpointVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	rt := hostRuntime(t, ctx)

	src, err := rt.Create(ctx, Spec{Template: "tiny", MemoryMiB: 256, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	srcID := src.ID
	cur := src
	t.Cleanup(func() {
		if cur != nil {
			cur.Destroy(context.Background())
		}
		rt.Remove(context.Background(), srcID)
	})
	out := &syncBuffer{}
	if _, err := src.Exec(ctx, agentproto.ExecRequest{Cmd: counterScript}, agentclient.Stdio{Stdout: out}); err != nil {
		t.Fatal(err)
	}
	shell(ctx, t, src, "echo before > /data.txt && sync")
	counter := func(sb *Sandbox) int {
		t.Helper()
		n, err := strconv.Atoi(shell(ctx, t, sb, "cat /counter"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// counts waits until sb's counter is past n, within 10 s.
	counts := func(sb *Sandbox, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for counter(sb) <= n {
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s's counter stays at %d", sb.ID, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	counts(src, 2)

	id := NewCheckpointID()
	before := counter(src)
	cp, err := rt.Checkpoint(ctx, src, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.RemoveCheckpoint(id) })
	t.Logf("checkpoint: stall %s, %d bytes, %v", cp.Stall, cp.SizeBytes, cp.Timings)
	if cp.Spec.MemoryMiB != 256 || cp.Sandbox != srcID {
		t.Errorf("checkpoint %+v", cp)
	}
	// The source runs on, its counting process too, on a disk of its own
	// from here.
	counts(src, before)
	shell(ctx, t, src, "echo after > /data.txt && sync")
	srcRandom := shell(ctx, t, src, "head -c 16 /dev/urandom | od -An -tx1")

	seen := map[string]string{srcID: srcRandom}
	for range 2 {
		child, err := rt.Create(ctx, Spec{Checkpoint: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { child.Destroy(context.Background()) })
		if got := shell(ctx, t, child, "cat /data.txt"); got != "before" {
			t.Errorf("a sandbox from the checkpoint has /data.txt %q, want the checkpoint's %q", got, "before")
		}
		if got := shell(ctx, t, child, "hostname"); got != child.ID {
			t.Errorf("a sandbox from the checkpoint is named %q, want its ID %s", got, child.ID)
		}
		// The counting process came along and goes on.
		at := counter(child)
		if at < before {
			t.Errorf("the child's counter is at %d, before the checkpoint's %d", at, before)
		}
		counts(child, at)
		r := shell(ctx, t, child, "head -c 16 /dev/urandom | od -An -tx1")
		for other, o := range seen {
			if o == r {
				t.Errorf("sandboxes %s and %s drew the same random bytes %s", other, child.ID, r)
			}
		}
		seen[child.ID] = r
		checkClock(ctx, t, child)
	}

	// A second checkpoint of the same source, now on the first's layer.
	id2 := NewCheckpointID()
	if _, err := rt.Checkpoint(ctx, src, id2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.RemoveCheckpoint(id2) })
	second, err := rt.Create(ctx, Spec{Checkpoint: id2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Destroy(context.Background()) })
	if got := shell(ctx, t, second, "cat /data.txt"); got != "after" {
		t.Errorf("a sandbox from the second checkpoint has /data.txt %q, want %q", got, "after")
	}

	// The checkpoint is the source's disk's layer now: it stays.
	if removed, err := rt.RemoveCheckpoint(id); err != nil || removed {
		t.Fatalf("RemoveCheckpoint while the source stands on it: %v, %v", removed, err)
	}
	// The source's new disk chain holds across a suspend and a wake.
	if err := src.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	cur = nil
	// Checkpointed at rest: a sandbox from it has the disk and the
	// counting process as they were at the suspend.
	id3 := NewCheckpointID()
	if _, err := rt.CheckpointSuspended(ctx, srcID, id3); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.RemoveCheckpoint(id3) })
	if !SuspendedState(src.Dir) {
		t.Fatal("the checkpoint at rest used up the sandbox's saved state")
	}
	third, err := rt.Create(ctx, Spec{Checkpoint: id3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { third.Destroy(context.Background()) })
	if got := shell(ctx, t, third, "cat /data.txt; hostname"); got != "after\n"+third.ID {
		t.Errorf("a sandbox from the checkpoint at rest has /data.txt and hostname %q", got)
	}
	counts(third, counter(third))
	shell(ctx, t, third, "echo third > /data.txt && sync")
	woken, err := rt.Wake(ctx, srcID)
	if err != nil {
		t.Fatal(err)
	}
	cur = woken
	if got := shell(ctx, t, woken, "cat /data.txt"); got != "after" {
		t.Errorf("the woken source has /data.txt %q, want %q", got, "after")
	}
	counts(woken, counter(woken))

	// Rolled back to the first checkpoint: its disk and processes, the
	// same name, fresh random state; the second checkpoint's layer, which
	// stood on the disk left behind, stays whole.
	rolled, err := rt.Rollback(ctx, srcID, woken, id)
	if err != nil {
		t.Fatal(err)
	}
	cur = rolled
	if _, err := woken.Exec(ctx, agentproto.ExecRequest{Argv: []string{"true"}}, agentclient.Stdio{}); err == nil {
		t.Error("the VM rolled back from still runs commands")
	}
	if got := shell(ctx, t, rolled, "cat /data.txt; hostname"); got != "before\n"+srcID {
		t.Errorf("the rolled back source has /data.txt and hostname %q, want %q", got, "before\n"+srcID)
	}
	at := counter(rolled)
	counts(rolled, at)
	if r := shell(ctx, t, rolled, "head -c 16 /dev/urandom | od -An -tx1"); r == srcRandom {
		t.Errorf("the rolled back source drew the random bytes it drew after the checkpoint: %s", r)
	}
	checkClock(ctx, t, rolled)
	// A suspended sandbox rolls back too, to the second checkpoint.
	if err := rolled.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	cur = nil
	if cur, err = rt.Rollback(ctx, srcID, nil, id2); err != nil {
		t.Fatal(err)
	}
	if got := shell(ctx, t, cur, "cat /data.txt"); got != "after" {
		t.Errorf("rolled back to the second checkpoint, /data.txt is %q, want %q", got, "after")
	}
	if SuspendedState(cur.Dir) {
		t.Error("the saved state of the suspended sandbox outlived its rollback")
	}
}
