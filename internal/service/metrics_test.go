package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/testenv"
)

// storeService is a service with a store and nothing running: the
// sandboxes it lists are rows only, with no VM behind them.
func storeService(t *testing.T, states map[string]string) *Service {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ids := make([]string, 0, len(states))
	for id := range states {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for i, id := range ids {
		sb := store.Sandbox{ID: id, Owner: "keyadmin", State: states[id], TemplateRef: "tiny:latest", TemplateDigest: "sha256:00",
			VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", CreatedAt: time.Unix(int64(1000+i), 0)}
		op := store.Operation{ID: fmt.Sprintf("op%d", i), Kind: apiv1.OpCreate, TargetID: id, Owner: "keyadmin", Status: apiv1.OpSucceeded}
		if err := st.InsertSandbox(context.Background(), sb, op); err != nil {
			t.Fatal(err)
		}
	}
	return &Service{role: localRole{}, st: st, ctx: t.Context(), log: slog.New(slog.DiscardHandler), live: map[string]*live{}}
}

// fakeGuests answers measures as a VM's agent would, per sandbox ID: a
// result, an error, or no answer until the call's context ends.
type fakeGuests struct {
	answer map[string]agentproto.StatsResult
	fail   map[string]error
	hang   map[string]bool
	delay  time.Duration

	mu       sync.Mutex
	asked    []string
	inFlight int
	most     int // the most calls in flight at once
}

func (g *fakeGuests) measure(ctx context.Context, id string) (agentproto.StatsResult, error) {
	g.mu.Lock()
	g.asked = append(g.asked, id)
	g.inFlight++
	g.most = max(g.most, g.inFlight)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	if g.hang[id] {
		<-ctx.Done()
		return agentproto.StatsResult{}, fmt.Errorf("measure sandbox %s: %w", id, ctx.Err())
	}
	time.Sleep(g.delay)
	if err := g.fail[id]; err != nil {
		return agentproto.StatsResult{}, err
	}
	return g.answer[id], nil
}

func (g *fakeGuests) askedFor() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := append([]string(nil), g.asked...)
	sort.Strings(out)
	return out
}

// scrape gathers the collector's series (testenv.Gather).
func scrape(t *testing.T, c *SandboxCollector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	return testenv.Gather(t, reg)
}

func perSandbox(series map[string]float64) []string {
	var out []string
	for k := range series {
		if strings.HasPrefix(k, "airlock_sandbox_") && !strings.HasPrefix(k, "airlock_sandbox_metrics_") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func TestSandboxCollector(t *testing.T) {
	stats := func(n int64) agentproto.StatsResult {
		return agentproto.StatsResult{CPUUsedPct: float64(n), CPUCount: 1, MemUsedBytes: n << 20, MemTotalBytes: 256 << 20,
			DiskUsedBytes: n << 30, DiskTotalBytes: 2 << 30}
	}
	running := map[string]string{"sbxa": apiv1.StateRunning, "sbxb": apiv1.StateRunning, "sbxc": apiv1.StatePaused}

	t.Run("each running sandbox", func(t *testing.T) {
		g := &fakeGuests{answer: map[string]agentproto.StatsResult{"sbxa": stats(7), "sbxb": stats(9)}}
		c := NewSandboxCollector(storeService(t, running), SandboxCollectorConfig{Limit: 2})
		c.measure = g.measure
		got := scrape(t, c)
		want := map[string]float64{
			`airlock_sandbox_cpu_used_pct{sandbox=sbxa,template=tiny:latest}`:     7,
			`airlock_sandbox_mem_used_bytes{sandbox=sbxa,template=tiny:latest}`:   7 << 20,
			`airlock_sandbox_mem_total_bytes{sandbox=sbxa,template=tiny:latest}`:  256 << 20,
			`airlock_sandbox_disk_used_bytes{sandbox=sbxa,template=tiny:latest}`:  7 << 30,
			`airlock_sandbox_disk_total_bytes{sandbox=sbxa,template=tiny:latest}`: 2 << 30,
			`airlock_sandbox_cpu_used_pct{sandbox=sbxb,template=tiny:latest}`:     9,
			`airlock_sandbox_metrics_limit{}`:                                     2,
			`airlock_sandbox_metrics_suppressed{reason=disabled}`:                 0,
			`airlock_sandbox_metrics_suppressed{reason=over_limit}`:               0,
			`airlock_sandbox_metrics_skipped_total{reason=timeout}`:               0,
			`airlock_sandbox_metrics_skipped_total{reason=error}`:                 0,
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
			}
		}
		if n := len(perSandbox(got)); n != 10 {
			t.Errorf("%d per-sandbox series, want 5 for each of 2 running sandboxes: %q", n, perSandbox(got))
		}
		if asked := g.askedFor(); strings.Join(asked, " ") != "sbxa sbxb" {
			t.Errorf("measured %q, want only the running sandboxes", asked)
		}
	})

	t.Run("over the limit", func(t *testing.T) {
		g := &fakeGuests{answer: map[string]agentproto.StatsResult{"sbxa": stats(7), "sbxb": stats(9)}}
		c := NewSandboxCollector(storeService(t, running), SandboxCollectorConfig{Limit: 1})
		c.measure = g.measure
		got := scrape(t, c)
		if ps := perSandbox(got); len(ps) != 0 {
			t.Errorf("per-sandbox series with 2 running over a limit of 1: %q", ps)
		}
		if got[`airlock_sandbox_metrics_suppressed{reason=over_limit}`] != 1 || got[`airlock_sandbox_metrics_suppressed{reason=disabled}`] != 0 {
			t.Errorf("suppressed gauges: %v", got)
		}
		if asked := g.askedFor(); len(asked) != 0 {
			t.Errorf("measured %q over the limit", asked)
		}
	})

	t.Run("disabled", func(t *testing.T) {
		g := &fakeGuests{}
		c := NewSandboxCollector(storeService(t, running), SandboxCollectorConfig{Limit: 0})
		c.measure = g.measure
		got := scrape(t, c)
		if ps := perSandbox(got); len(ps) != 0 || len(g.askedFor()) != 0 {
			t.Errorf("limit 0 wrote %q and measured %q", ps, g.askedFor())
		}
		if got[`airlock_sandbox_metrics_suppressed{reason=disabled}`] != 1 || got[`airlock_sandbox_metrics_suppressed{reason=over_limit}`] != 0 ||
			got[`airlock_sandbox_metrics_limit{}`] != 0 {
			t.Errorf("gauges with limit 0: %v", got)
		}
	})

	t.Run("slow, stopped and failing sandboxes", func(t *testing.T) {
		states := map[string]string{"sbxa": apiv1.StateRunning, "sbxb": apiv1.StateRunning, "sbxc": apiv1.StateRunning, "sbxd": apiv1.StateRunning}
		g := &fakeGuests{answer: map[string]agentproto.StatsResult{"sbxa": stats(1)}, hang: map[string]bool{"sbxb": true},
			fail: map[string]error{
				"sbxc": fmt.Errorf("sandbox sbxc is paused, not running: %w", errdefs.ErrConflict),
				"sbxd": errors.New("measure the guest: the agent answered garbage"),
			}}
		c := NewSandboxCollector(storeService(t, states), SandboxCollectorConfig{Limit: 10, Budget: 300 * time.Millisecond})
		c.measure = g.measure
		start := time.Now()
		got := scrape(t, c)
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("a scrape with a sandbox that never answers took %v, over its 300 ms budget", took)
		}
		if ps := perSandbox(got); len(ps) != 5 || !strings.Contains(ps[0], "sandbox=sbxa") {
			t.Errorf("series %q, want sbxa's only", ps)
		}
		if got[`airlock_sandbox_metrics_skipped_total{reason=timeout}`] != 1 || got[`airlock_sandbox_metrics_skipped_total{reason=error}`] != 1 {
			t.Errorf("skipped: %v, want one timeout (sbxb) and one error (sbxd); sbxc stopped running and is not counted", got)
		}
		// The counters add up over scrapes.
		got = scrape(t, c)
		if got[`airlock_sandbox_metrics_skipped_total{reason=timeout}`] != 2 {
			t.Errorf("timeouts after two scrapes: %v", got[`airlock_sandbox_metrics_skipped_total{reason=timeout}`])
		}
	})

	t.Run("measured a few at a time", func(t *testing.T) {
		states := map[string]string{}
		answers := map[string]agentproto.StatsResult{}
		for i := range 8 {
			id := fmt.Sprintf("sbx%c", 'a'+i)
			states[id], answers[id] = apiv1.StateRunning, stats(int64(i))
		}
		g := &fakeGuests{answer: answers, delay: 50 * time.Millisecond}
		c := NewSandboxCollector(storeService(t, states), SandboxCollectorConfig{Limit: 8, Parallel: 3})
		c.measure = g.measure
		got := scrape(t, c)
		if n := len(perSandbox(got)); n != 40 {
			t.Errorf("%d per-sandbox series, want 5 for each of 8", n)
		}
		if g.most > 3 || g.most < 2 {
			t.Errorf("%d measures ran at once, want at most 3 (and more than 1)", g.most)
		}
	})

	t.Run("through GuestStats", func(t *testing.T) {
		// The real measure path: rows that say running but have no VM on
		// this server are conflicts, left out and not counted.
		c := NewSandboxCollector(storeService(t, running), SandboxCollectorConfig{Limit: 5})
		got := scrape(t, c)
		if ps := perSandbox(got); len(ps) != 0 {
			t.Errorf("series of sandboxes without a VM: %q", ps)
		}
		if got[`airlock_sandbox_metrics_skipped_total{reason=error}`] != 0 || got[`airlock_sandbox_metrics_skipped_total{reason=timeout}`] != 0 {
			t.Errorf("skipped counted for sandboxes that are not running here: %v", got)
		}
	})
}

// TestLookedAfter: the sandboxes the usage history samples are those this
// server looks after, running or suspended, until they are deleted.
func TestLookedAfter(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a, b := f.create(t, apiv1.CreateSandbox{}), f.create(t, apiv1.CreateSandbox{})
	f.wait(t, a.Operation.ID)
	f.wait(t, b.Operation.ID)
	want := map[string]bool{a.Sandbox.ID: true, b.Sandbox.ID: true}
	if got := f.s.LookedAfter(); !maps.Equal(got, want) {
		t.Fatalf("LookedAfter = %v, want both running %v", got, want)
	}
	so, err := f.s.Suspend(ctx, f.admin, b.Sandbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, so.Operation.ID)
	if got := f.s.LookedAfter(); !maps.Equal(got, map[string]bool{a.Sandbox.ID: true, b.Sandbox.ID: false}) {
		t.Fatalf("LookedAfter = %v, want %s suspended (false)", got, b.Sandbox.ID)
	}
	del, err := f.s.DeleteSandbox(ctx, f.admin, a.Sandbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	f.wait(t, del.Operation.ID)
	if got := f.s.LookedAfter(); !maps.Equal(got, map[string]bool{b.Sandbox.ID: false}) {
		t.Fatalf("LookedAfter = %v, want only the suspended %s", got, b.Sandbox.ID)
	}
}
