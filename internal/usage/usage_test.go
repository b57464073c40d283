package usage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// fakeSource is a server's sandboxes by hand: each listed sandbox with
// whether it runs, and what measuring one answers.
type fakeSource struct {
	mu       sync.Mutex
	listed   map[string]bool
	fail     map[string]error
	measured []string
	cpu      float64
}

func (f *fakeSource) Sandboxes() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for id, running := range f.listed {
		out[id] = running
	}
	return out
}

func (f *fakeSource) Measure(_ context.Context, id string) (Sample, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.measured = append(f.measured, id)
	if err := f.fail[id]; err != nil {
		return Sample{}, err
	}
	f.cpu++
	return Sample{CPUCount: 2, CPUUsedPct: f.cpu, MemUsed: 1 << 20, MemTotal: 1 << 30}, nil
}

func (f *fakeSource) set(id string, running bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listed[id] = running
}

func (f *fakeSource) drop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.listed, id)
}

// clock is a hand-moved clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time       { return c.t }
func (c *clock) step(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                { return &clock{t: time.Unix(1_700_000_000, 0)} }

func newHistory(t *testing.T, src Source, c *clock, per, total int) *History {
	t.Helper()
	h, err := New(Config{Source: src, PerSandbox: per, Total: total, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func times(s []Sample) []int64 {
	out := make([]int64, len(s))
	for i, x := range s {
		out[i] = x.Time.Unix()
	}
	return out
}

// TestWindow: a window keeps the samples stamped from start to end, both
// included, at second precision; a zero side is open.
func TestWindow(t *testing.T) {
	c := newClock()
	h := newHistory(t, &fakeSource{}, c, 100, 1000)
	t0 := c.t.Unix()
	for range 5 {
		h.Add("sbx1", Sample{})
		c.step(5 * time.Second)
	}
	h.Add("sbx2", Sample{Time: time.Unix(t0, 999_000_000)})
	for _, tt := range []struct {
		name       string
		id         string
		start, end time.Time
		want       []int64
	}{
		{"open", "sbx1", time.Time{}, time.Time{}, []int64{t0, t0 + 5, t0 + 10, t0 + 15, t0 + 20}},
		{"from start", "sbx1", time.Unix(t0+10, 0), time.Time{}, []int64{t0 + 10, t0 + 15, t0 + 20}},
		{"to end", "sbx1", time.Time{}, time.Unix(t0+5, 0), []int64{t0, t0 + 5}},
		{"both sides included", "sbx1", time.Unix(t0+5, 0), time.Unix(t0+15, 0), []int64{t0 + 5, t0 + 10, t0 + 15}},
		{"between samples", "sbx1", time.Unix(t0+6, 0), time.Unix(t0+9, 0), []int64{}},
		{"in the past", "sbx1", time.Unix(t0-100, 0), time.Unix(t0-1, 0), []int64{}},
		{"in the future", "sbx1", time.Unix(t0+21, 0), time.Time{}, []int64{}},
		{"second precision", "sbx2", time.Unix(t0, 0), time.Unix(t0, 0), []int64{t0}},
		{"unknown sandbox", "sbx3", time.Time{}, time.Time{}, []int64{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := times(h.Window(tt.id, tt.start, tt.end))
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Window = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPerSandboxBound: a sandbox keeps its newest PerSandbox samples.
func TestPerSandboxBound(t *testing.T) {
	c := newClock()
	h := newHistory(t, &fakeSource{}, c, 3, 1000)
	t0 := c.t.Unix()
	for range 7 {
		h.Add("sbx1", Sample{})
		c.step(time.Second)
	}
	if got, want := fmt.Sprint(times(h.Window("sbx1", time.Time{}, time.Time{}))), fmt.Sprint([]int64{t0 + 4, t0 + 5, t0 + 6}); got != want {
		t.Fatalf("samples kept %s, want the newest three %s", got, want)
	}
	if h.total != 3 {
		t.Fatalf("total %d, want 3", h.total)
	}
}

// TestTotalBound: past Total samples in all, the longest ring gives up
// its oldest, so a new sandbox still gets samples and the count stays
// bounded.
func TestTotalBound(t *testing.T) {
	c := newClock()
	h := newHistory(t, &fakeSource{}, c, 100, 10)
	t0 := c.t.Unix()
	for range 8 {
		h.Add("old", Sample{})
		c.step(time.Second)
	}
	for range 5 {
		h.Add("new", Sample{})
		c.step(time.Second)
	}
	if h.total != 10 {
		t.Fatalf("total %d, want the bound 10", h.total)
	}
	old, young := h.Window("old", time.Time{}, time.Time{}), h.Window("new", time.Time{}, time.Time{})
	if len(old) != 5 || len(young) != 5 {
		t.Fatalf("old keeps %d, new %d; want 5 and 5 (the longest gives up its oldest)", len(old), len(young))
	}
	if old[0].Time.Unix() != t0+3 || old[4].Time.Unix() != t0+7 {
		t.Fatalf("old keeps %v, want its newest five", times(old))
	}
	if young[0].Time.Unix() != t0+8 {
		t.Fatalf("new keeps %v, want its newest five", times(young))
	}
	// Rings that shrank and wrap still read oldest first as they grow back.
	for range 3 {
		h.Add("old", Sample{})
		c.step(time.Second)
	}
	got := times(h.Window("old", time.Time{}, time.Time{}))
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("old reads %v: not oldest first", got)
		}
	}
	if h.total != 10 {
		t.Fatalf("total %d, want the bound 10", h.total)
	}
}

// TestRounds: a round measures the running sandboxes, keeps a suspended
// one's samples without adding to them, and drops the ring of a sandbox
// no longer listed (deleted); failures of a measure add nothing.
func TestRounds(t *testing.T) {
	c := newClock()
	src := &fakeSource{listed: map[string]bool{"run": true, "sleep": true, "gone": true, "bad": true, "stopped": true},
		fail: map[string]error{
			"bad":     errors.New("agent fell over"),
			"stopped": fmt.Errorf("sandbox stopped is suspended, not running: %w", errdefs.ErrConflict),
		}}
	h := newHistory(t, src, c, 100, 1000)
	ctx := context.Background()
	h.sampleAll(ctx)
	c.step(5 * time.Second)
	src.set("sleep", false)
	src.drop("gone")
	h.sampleAll(ctx)
	for _, tt := range []struct {
		id   string
		want int
	}{{"run", 2}, {"sleep", 1}, {"gone", 0}, {"bad", 0}, {"stopped", 0}} {
		if got := len(h.Window(tt.id, time.Time{}, time.Time{})); got != tt.want {
			t.Errorf("%s has %d samples, want %d", tt.id, got, tt.want)
		}
	}
	if _, ok := h.rings["gone"]; ok {
		t.Errorf("the ring of a sandbox no longer listed is kept")
	}
	if h.total != 3 {
		t.Errorf("total %d, want 3", h.total)
	}
	s := h.Window("run", time.Time{}, time.Time{})
	if s[0].Time.Unix() != c.t.Unix()-5 || s[1].Time.Unix() != c.t.Unix() || s[0].CPUCount != 2 {
		t.Errorf("samples %+v: want stamped by the clock, with the measure", s)
	}
}

// TestRun: Run samples at once and on every tick, and returns when its
// context ends.
func TestRun(t *testing.T) {
	src := &fakeSource{listed: map[string]bool{"sbx1": true}}
	h, err := New(Config{Source: src, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(h.Window("sbx1", time.Time{}, time.Time{})) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("Run took no three samples in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestConfigRefusals(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
	}{
		{"no source", Config{}},
		{"negative interval", Config{Source: &fakeSource{}, Interval: -time.Second}},
		{"negative bound", Config{Source: &fakeSource{}, Total: -1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}
