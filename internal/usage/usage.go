// Package usage keeps what each sandbox a server runs has used lately:
// its CPU, memory and disk, sampled every few seconds (5 s by default,
// E2B's interval), so that E2B's getMetrics can answer a window of the
// past rather than one measure of now (docs/e2b.md, "Metrics").
//
// A History holds one ring of samples per sandbox, PerSandbox long (an
// hour at the default interval), and at most Total samples in all: when
// a new sample would pass Total, the longest ring gives up its oldest, so
// that many sandboxes cannot grow the server's memory without limit and
// a young sandbox still gets its history. A sandbox's ring goes when the
// sandbox stops being this server's (deleted, or released by a node in a
// cluster): each round of sampling drops the rings of the sandboxes its
// Source no longer lists. A sandbox that is listed but not running
// (suspended) keeps its ring and gets no new samples.
//
// Run samples until its context ends; it is the History's one goroutine.
// Samples live in memory only: a restart of the server starts every ring
// empty.
package usage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Sample is one measure of a sandbox, in E2B's units: bytes, and a CPU
// share in percent of its vCPUs.
type Sample struct {
	Time       time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// Source is what a History samples: the service, in a server.
type Source interface {
	// Sandboxes lists the sandboxes this server looks after, each with
	// whether it runs now (only those are measured).
	Sandboxes() map[string]bool
	// Measure measures a running sandbox now. An error classed
	// errdefs.ErrConflict or ErrNotFound (it stopped running meanwhile)
	// is no failure.
	Measure(ctx context.Context, id string) (Sample, error)
}

// Config configures a History.
type Config struct {
	// Source lists and measures the sandboxes. Required.
	Source Source
	// Interval is the time between two rounds of sampling. Default 5 s.
	Interval time.Duration
	// PerSandbox is the most samples kept of one sandbox, the newest.
	// Default 720 (an hour at 5 s).
	PerSandbox int
	// Total is the most samples kept of all sandboxes together. Default
	// 100 000 (about 8 MB).
	Total int
	// Parallel is how many sandboxes are measured at once. Default 4.
	Parallel int
	// Log receives the failures of measures.
	Log *slog.Logger
	// Now is the clock samples are stamped with. Default time.Now.
	Now func() time.Time
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Source == nil {
		return errors.New("a usage history needs a source of sandboxes")
	}
	if c.Interval < 0 || c.PerSandbox < 0 || c.Total < 0 || c.Parallel < 0 {
		return fmt.Errorf("usage history: interval %v, per sandbox %d, total %d, parallel %d: none may be negative: %w",
			c.Interval, c.PerSandbox, c.Total, c.Parallel, errdefs.ErrInvalid)
	}
	if c.Interval == 0 {
		c.Interval = 5 * time.Second
	}
	if c.PerSandbox == 0 {
		c.PerSandbox = 720
	}
	if c.Total == 0 {
		c.Total = 100_000
	}
	if c.Parallel == 0 {
		c.Parallel = 4
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// History is the recent usage of the sandboxes of one server.
type History struct {
	cfg Config

	mu    sync.Mutex       // guards rings and total
	rings map[string]*ring // by sandbox ID
	total int              // samples in all rings
}

// New returns an empty History; Run fills it.
func New(cfg Config) (*History, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &History{cfg: cfg, rings: map[string]*ring{}}, nil
}

// Run samples every Interval until ctx ends, then returns.
func (h *History) Run(ctx context.Context) {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		h.sampleAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleAll is one round: it drops the rings of sandboxes no longer
// listed and measures the running ones, at most Parallel at once, each
// within Interval.
func (h *History) sampleAll(ctx context.Context) {
	listed := h.cfg.Source.Sandboxes()
	h.mu.Lock()
	for id, r := range h.rings {
		if _, ok := listed[id]; !ok {
			h.total -= r.n
			delete(h.rings, id)
		}
	}
	h.mu.Unlock()

	slots := make(chan struct{}, h.cfg.Parallel)
	var wg sync.WaitGroup
	for id, running := range listed {
		if !running {
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			mctx, cancel := context.WithTimeout(ctx, h.cfg.Interval)
			defer cancel()
			s, err := h.cfg.Source.Measure(mctx, id)
			switch {
			case err == nil:
				h.Add(id, s)
			case errors.Is(err, errdefs.ErrConflict), errors.Is(err, errdefs.ErrNotFound), ctx.Err() != nil:
				// Stopped meanwhile, or the server is stopping.
			default:
				h.cfg.Log.Debug("sample sandbox usage", "sandbox", id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// Add records a sample of sandbox id, stamped now if it has no time, as
// Run does with each measure. (A sandbox that goes while it is measured
// gets its ring back until the next round drops it.)
func (h *History) Add(id string, s Sample) {
	if s.Time.IsZero() {
		s.Time = h.cfg.Now()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil {
		r = &ring{buf: make([]Sample, 0, min(h.cfg.PerSandbox, 16))}
		h.rings[id] = r
	}
	if r.n == h.cfg.PerSandbox {
		r.dropOldest()
		h.total--
	}
	for h.total >= h.cfg.Total {
		h.longest().dropOldest()
		h.total--
	}
	r.push(s, h.cfg.PerSandbox)
	h.total++
}

// longest is the ring with the most samples (of those with the same
// length, the one whose oldest sample is oldest). h.mu is held, and some
// ring has a sample.
func (h *History) longest() *ring {
	var best *ring
	for _, r := range h.rings {
		if r.n == 0 {
			continue
		}
		if best == nil || r.n > best.n || (r.n == best.n && r.at(0).Time.Before(best.at(0).Time)) {
			best = r
		}
	}
	return best
}

// Window returns sandbox id's samples stamped from start to end, both
// included and at second precision (E2B's start and end are unix
// seconds), oldest first; a zero start or end leaves that side open.
func (h *History) Window(id string, start, end time.Time) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil {
		return nil
	}
	var out []Sample
	for i := range r.n {
		s := r.at(i)
		sec := s.Time.Unix()
		if (!start.IsZero() && sec < start.Unix()) || (!end.IsZero() && sec > end.Unix()) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// ring is one sandbox's samples, oldest first: buf grows up to the cap
// it is pushed with, then wraps.
type ring struct {
	buf   []Sample
	start int // index in buf of the oldest sample
	n     int // samples held
}

func (r *ring) at(i int) Sample { return r.buf[(r.start+i)%len(r.buf)] }

// push adds s as the newest; the ring holds fewer than limit samples.
func (r *ring) push(s Sample, limit int) {
	if len(r.buf) < limit && r.start == 0 && r.n == len(r.buf) {
		r.buf = append(r.buf, s)
		r.n++
		return
	}
	if r.n == len(r.buf) {
		// Full at less than limit after drops: unwrap, then grow.
		r.buf = append(r.linear(), s)
		r.start, r.n = 0, len(r.buf)
		return
	}
	r.buf[(r.start+r.n)%len(r.buf)] = s
	r.n++
}

// linear is the samples, oldest first, in a new slice.
func (r *ring) linear() []Sample {
	out := make([]Sample, 0, r.n+1)
	for i := range r.n {
		out = append(out, r.at(i))
	}
	return out
}

func (r *ring) dropOldest() {
	r.buf[r.start] = Sample{}
	r.start = (r.start + 1) % len(r.buf)
	r.n--
}
