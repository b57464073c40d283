package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/testenv"
)

// waitPool waits until the runtime's one pool has want members ready.
func waitPool(ctx context.Context, t *testing.T, rt *Runtime, want int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ps := rt.Pools()
		if len(ps) == 1 && ps[0].Ready == want {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the warm pool has %+v, want %d ready", ps, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWarmPoolVM keeps a pool of two tiny clones: sandboxes made of its
// members are each their own (hostname, random numbers, disk, size,
// environment, policy), a create takes only the sandbox's part, the pool
// refills after use and after a claim given back, and a runtime that
// starts after one that died removes the members it left.
func TestWarmPoolVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	rt.cfg.ColdBoot = false
	var live []*Sandbox
	t.Cleanup(func() {
		rt.StopPools(context.Background())
		for _, sb := range live {
			sb.Destroy(context.Background())
		}
	})
	if err := rt.StartPools(ctx, []PoolSpec{{Template: "tiny", Size: 2}}, nil); err != nil {
		t.Fatal(err)
	}
	waitPool(ctx, t, rt, 2)

	spec, _, err := rt.Resolve(Spec{Template: "tiny", Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rt.Claim(Spec{Template: spec.Template, VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB * 2, DiskMiB: spec.DiskMiB, Detach: true}); ok {
		t.Fatal("a spec with other memory took a pool member")
	}
	if _, ok := rt.Claim(Spec{Template: spec.Template, VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB, DiskMiB: spec.DiskMiB}); ok {
		t.Fatal("a spec that does not detach took a pool member")
	}
	create := func(t *testing.T, s Spec) *Sandbox {
		t.Helper()
		id, ok := rt.Claim(s)
		if !ok {
			t.Fatalf("no pool member for %+v (pools %+v)", s, rt.Pools())
		}
		s.ID = id
		sb, err := rt.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, sb)
		if _, err := os.Stat(filepath.Join(sb.Dir, poolMarkName)); !os.IsNotExist(err) {
			t.Errorf("the sandbox's directory is still marked a pool member: %v", err)
		}
		if _, ok := sb.Timings.Get("take warm pool member"); !ok {
			t.Errorf("the create's steps %v do not say it took a pool member", sb.Timings)
		}
		if _, ok := sb.Timings.Get("start vm"); ok {
			t.Errorf("a create from the pool started a VM: %v", sb.Timings)
		}
		t.Logf("create from the pool: %s, %v", sb.Timings.Total().Round(time.Millisecond), sb.Timings)
		return sb
	}
	sa := spec
	sa.Env = map[string]string{"WHO": "a"}
	sa.Network = &policy.Policy{Egress: "allow"} // members start denying all egress
	a := create(t, sa)
	sb := spec
	sb.DiskMiB = 400
	b := create(t, sb)

	t.Run("each is its own", func(t *testing.T) {
		for _, s := range []*Sandbox{a, b} {
			if got := shell(ctx, t, s, "hostname"); got != s.ID {
				t.Errorf("hostname %q, want %s", got, s.ID)
			}
		}
		ra := shell(ctx, t, a, "head -c 16 /dev/urandom | od -An -tx1")
		rb := shell(ctx, t, b, "head -c 16 /dev/urandom | od -An -tx1")
		if ra == rb {
			t.Errorf("two members read the same random bytes: %s", ra)
		}
		if got := shell(ctx, t, a, "echo $WHO"); got != "a" {
			t.Errorf("WHO in a = %q, want a", got)
		}
		if got := shell(ctx, t, b, "echo ${WHO:-unset}"); got != "unset" {
			t.Errorf("WHO in b = %q, want unset", got)
		}
		if b.Init.DiskBytes != 400<<20 {
			t.Errorf("b's disk is %d bytes, want 400 MiB", b.Init.DiskBytes)
		}
		shell(ctx, t, a, "echo a > /only-in-a && sync")
		if got := shell(ctx, t, b, "cat /only-in-a 2>/dev/null || echo absent"); got != "absent" {
			t.Errorf("a file written in one member is in another: %q", got)
		}
		rec, err := readRecord(a.Dir)
		if err != nil || rec.Spec.Env["WHO"] != "a" || rec.Spec.ID != a.ID {
			t.Errorf("a's record: %+v, %v", rec.Spec, err)
		}
		if g := a.Gateway(); g == nil || g.Policy().Egress != "allow" {
			t.Errorf("a's gateway does not have the spec's policy (egress allow)")
		}
		if g := b.Gateway(); g == nil || g.Policy().Egress != "deny" {
			t.Errorf("b's gateway does not deny egress, as a spec without a policy asks")
		}
	})

	t.Run("refills after use and after a claim given back", func(t *testing.T) {
		waitPool(ctx, t, rt, 2)
		id, ok := rt.Claim(spec)
		if !ok {
			t.Fatal("no pool member")
		}
		rt.Unclaim(id)
		if _, err := os.Stat(rt.cfg.Dir.Sandbox(id)); !os.IsNotExist(err) {
			t.Errorf("a member given back is still there: %v", err)
		}
		id, ok = rt.Claim(spec)
		if !ok {
			t.Fatal("no pool member")
		}
		if err := rt.Remove(ctx, id); err != nil {
			t.Errorf("remove a claimed member: %v", err)
		}
		waitPool(ctx, t, rt, 2)
	})

	t.Run("a runtime started after a dead one removes its members", func(t *testing.T) {
		// As a server killed outright leaves them: VMs running, detached,
		// nobody holding their directories.
		p := rt.pools[0]
		rt.mu.Lock()
		rt.pools = nil
		rt.mu.Unlock()
		p.mu.Lock()
		p.closed = true
		left := p.ready
		p.ready = nil
		p.mu.Unlock()
		p.wake()
		<-p.done
		var pids []int
		for _, m := range left {
			pids = append(pids, m.vm.PID())
			m.Release()
		}
		if len(left) != 2 {
			t.Fatalf("%d members left, want 2", len(left))
		}
		rt2, err := New(ctx, rt.cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range left {
			if _, err := os.Stat(m.Dir); !os.IsNotExist(err) {
				t.Errorf("the member %s left by the dead runtime is still there: %v", m.ID, err)
			}
			if testenv.ProcessAlive(pids[i]) {
				t.Errorf("the QEMU %d of a member left behind still runs", pids[i])
			}
		}
		if err := rt2.StartPools(ctx, []PoolSpec{{Template: "tiny", Size: 1}}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt2.StopPools(context.Background()) })
		waitPool(ctx, t, rt2, 1)
		c := rt2
		id, ok := c.Claim(spec)
		if !ok {
			t.Fatal("no member in the new runtime's pool")
		}
		s := spec
		s.ID = id
		sc, err := c.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, sc)
		if got := shell(ctx, t, sc, "hostname"); got != sc.ID {
			t.Errorf("hostname %q, want %s", got, sc.ID)
		}
	})
}
