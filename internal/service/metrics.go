package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// Metrics are the service's Prometheus metrics. A nil *Metrics counts
// nothing, so tests may leave it out.
type Metrics struct {
	sandboxes  *prometheus.GaugeVec
	ops        *prometheus.CounterVec
	opSeconds  *prometheus.HistogramVec
	opsPending *prometheus.GaugeVec
	bytes      prometheus.Counter
}

// NewMetrics registers the service's metrics with reg. The command
// sessions' are sessions.NewMetrics'.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sandboxes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "airlock_sandboxes", Help: "Sandboxes by state.",
		}, []string{"state"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_operations_total", Help: "Finished lifecycle operations by kind and result.",
		}, []string{"kind", "result"}),
		opSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_operation_duration_seconds", Help: "How long lifecycle operations took, by kind and result.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120},
		}, []string{"kind", "result"}),
		opsPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "airlock_operations_in_flight", Help: "Lifecycle operations not finished yet, by kind.",
		}, []string{"kind"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_streamed_bytes_total", Help: "Bytes of command output and file content streamed.",
		}),
	}
	reg.MustRegister(m.sandboxes, m.ops, m.opSeconds, m.opsPending, m.bytes)
	for _, st := range apiv1.States {
		m.sandboxes.WithLabelValues(st)
	}
	return m
}

func (m *Metrics) setStates(counts map[string]int) {
	if m == nil {
		return
	}
	for _, st := range apiv1.States {
		m.sandboxes.WithLabelValues(st).Set(float64(counts[st]))
	}
}

func (m *Metrics) opStarted(kind string) {
	if m != nil {
		m.opsPending.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) opFinished(kind, result string, took time.Duration) {
	if m == nil {
		return
	}
	m.opsPending.WithLabelValues(kind).Dec()
	m.ops.WithLabelValues(kind, result).Inc()
	m.opSeconds.WithLabelValues(kind, result).Observe(took.Seconds())
}

// streamed counts n bytes of command output or file content streamed.
func (m *Metrics) streamed(n int) {
	if m != nil && n > 0 {
		m.bytes.Add(float64(n))
	}
}

// GuestStats measures a running sandbox now, from inside its guest: CPU
// use over agentproto.StatsWindow, memory and its root filesystem.
func (s *Service) GuestStats(ctx context.Context, p Principal, id string) (agentproto.StatsResult, error) {
	lv, _, err := s.runningSandbox(ctx, p, id)
	if err != nil {
		return agentproto.StatsResult{}, err
	}
	box, _, err := lv.vm()
	if err != nil {
		return agentproto.StatsResult{}, err
	}
	agent := box.Agent()
	if agent == nil {
		return agentproto.StatsResult{}, fmt.Errorf("sandbox %s has no agent session: retry shortly: %w", id, errdefs.ErrUnavailable)
	}
	st, err := agent.Stats(ctx)
	if err != nil {
		return agentproto.StatsResult{}, fmt.Errorf("measure sandbox %s: %w", id, err)
	}
	return st, nil
}

// LookedAfter lists the sandboxes this server looks after (with a VM, or
// suspended), each with whether its VM runs now: what the E2B metrics'
// history (package usage) samples, and forgets once a sandbox is gone.
func (s *Service) LookedAfter() map[string]bool {
	s.mu.Lock()
	lives := make([]*live, 0, len(s.live))
	for _, lv := range s.live {
		lives = append(lives, lv)
	}
	s.mu.Unlock()
	out := make(map[string]bool, len(lives))
	for _, lv := range lives {
		out[lv.id] = lv.hasVM()
	}
	return out
}

// SandboxMetrics is GuestStats as the API shows it.
// The host side of the metrics comes from the sandbox's cgroup: the CPU
// its QEMU used between two readings at least vmmWindow apart (taken
// around the guest's measurement), as a percentage of one host CPU, and
// the memory charged to it at the second.
func (s *Service) SandboxMetrics(ctx context.Context, p Principal, id string) (apiv1.SandboxMetrics, error) {
	var box VM
	// Without a VM the host side is left out (vmmErr); GuestStats
	// below answers the error of a sandbox that is not running.
	if lv, _, err := s.runningSandbox(ctx, p, id); err == nil {
		box, _, _ = lv.vm()
	}
	var before cgroup.Stats
	var vmmErr error = errdefs.ErrNotFound
	start := time.Now()
	if box != nil {
		before, vmmErr = box.VMMStats()
	}
	st, err := s.GuestStats(ctx, p, id)
	if err != nil {
		return apiv1.SandboxMetrics{}, err
	}
	m := apiv1.SandboxMetrics{
		CPUUsedPct: math.Round(st.CPUUsedPct*10) / 10, CPUCount: st.CPUCount,
		MemUsedMiB: st.MemUsedBytes >> 20, MemTotalMiB: st.MemTotalBytes >> 20, MemCacheMiB: st.MemCacheBytes >> 20,
		DiskUsedMiB: st.DiskUsedBytes >> 20, DiskTotalMiB: st.DiskTotalBytes >> 20,
	}
	if vmmErr == nil {
		select {
		case <-time.After(vmmWindow - time.Since(start)):
		case <-ctx.Done():
			return apiv1.SandboxMetrics{}, ctx.Err()
		}
		if after, err := box.VMMStats(); err == nil && after.CPUUsageNS >= before.CPUUsageNS {
			pct := float64(after.CPUUsageNS-before.CPUUsageNS) / float64(time.Since(start).Nanoseconds()) * 100
			m.VMMCPUPct = math.Round(pct*10) / 10
			m.VMMMemMiB = int64(after.MemoryBytes >> 20)
		}
	}
	m.Time = s.now()
	return m, nil
}

// vmmStats reads the cgroup of sandbox id's VMM, if this server runs its
// VM and it has one.
func (s *Service) vmmStats(id string) (cgroup.Stats, bool) {
	s.mu.Lock()
	lv := s.live[id]
	s.mu.Unlock()
	if lv == nil {
		return cgroup.Stats{}, false
	}
	box, _, err := lv.vm()
	if err != nil {
		return cgroup.Stats{}, false
	}
	st, err := box.VMMStats()
	return st, err == nil
}

// vmmWindow is the least time between the two readings of a sandbox's
// cgroup that its CPU use is measured over.
const vmmWindow = 200 * time.Millisecond

// SandboxCollectorConfig configures the per-sandbox series on /metrics.
type SandboxCollectorConfig struct {
	// Limit is the most running sandboxes that get series of their own:
	// with more running, none do (each sandbox is a label value, and
	// Prometheus keeps every series it ever saw), and
	// airlock_sandbox_metrics_suppressed{reason="over_limit"} is 1.
	// 0 writes no per-sandbox series at all.
	Limit int
	// Budget bounds the measuring of one scrape, all sandboxes together;
	// a sandbox not measured by then is left out and counted in
	// airlock_sandbox_metrics_skipped_total{reason="timeout"}.
	// Default 2 s.
	Budget time.Duration
	// Parallel is how many sandboxes are measured at once. Default 4.
	Parallel int
}

// SandboxCollector writes gauges of what each running sandbox uses,
// labelled by sandbox ID and template, measured when /metrics is scraped
// the way GET /v1/sandboxes/{id}/metrics measures (Service.GuestStats).
type SandboxCollector struct {
	s   *Service
	cfg SandboxCollectorConfig
	// measure is s.GuestStats as the admin; tests put a fake VM here.
	measure func(ctx context.Context, id string) (agentproto.StatsResult, error)

	cpu, memUsed, memTotal, diskUsed, diskTotal *prometheus.Desc
	vmmCPU, vmmMem                              *prometheus.Desc
	limit, suppressed                           *prometheus.Desc
	skipped                                     *prometheus.CounterVec
}

// Reasons why per-sandbox series are left out, the values of
// airlock_sandbox_metrics_suppressed's label.
const (
	suppressedDisabled  = "disabled"
	suppressedOverLimit = "over_limit"
)

// Reasons why one running sandbox is left out of a scrape.
const (
	skippedTimeout = "timeout"
	skippedError   = "error"
)

// NewSandboxCollector returns the collector of s's per-sandbox series;
// register it with the registry /metrics serves.
func NewSandboxCollector(s *Service, cfg SandboxCollectorConfig) *SandboxCollector {
	if cfg.Budget <= 0 {
		cfg.Budget = 2 * time.Second
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	labels := []string{"sandbox", "template"}
	c := &SandboxCollector{
		s: s, cfg: cfg,
		cpu: prometheus.NewDesc("airlock_sandbox_cpu_used_pct",
			"Busy share of the sandbox's vCPUs, 0 to 100, measured in its guest over 200 ms at scrape time.", labels, nil),
		memUsed: prometheus.NewDesc("airlock_sandbox_mem_used_bytes",
			"Guest memory in use (total less available), measured in the guest at scrape time.", labels, nil),
		memTotal: prometheus.NewDesc("airlock_sandbox_mem_total_bytes",
			"Guest memory the sandbox's kernel sees.", labels, nil),
		diskUsed: prometheus.NewDesc("airlock_sandbox_disk_used_bytes",
			"Bytes used on the sandbox's root filesystem, measured in the guest at scrape time.", labels, nil),
		diskTotal: prometheus.NewDesc("airlock_sandbox_disk_total_bytes",
			"Size of the sandbox's root filesystem.", labels, nil),
		vmmCPU: prometheus.NewDesc("airlock_sandbox_vmm_cpu_seconds_total",
			"CPU time the sandbox's VMM (its QEMU) has used on the host, from its cgroup (absent with the jail off).", labels, nil),
		vmmMem: prometheus.NewDesc("airlock_sandbox_vmm_memory_bytes",
			"Host memory charged to the sandbox's VMM's cgroup (absent with the jail off).", labels, nil),
		limit: prometheus.NewDesc("airlock_sandbox_metrics_limit",
			"Most running sandboxes that get per-sandbox series (airlock serve --metrics-per-sandbox); 0: none.", nil, nil),
		suppressed: prometheus.NewDesc("airlock_sandbox_metrics_suppressed",
			"1 when no per-sandbox series are written, by reason: disabled (limit 0) or over_limit (more sandboxes run than the limit).",
			[]string{"reason"}, nil),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_sandbox_metrics_skipped_total",
			Help: "Running sandboxes left out of a scrape: not measured within its time bound (timeout), or their measure failed (error).",
		}, []string{"reason"}),
	}
	admin := Principal{Role: apiv1.RoleAdmin}
	c.measure = func(ctx context.Context, id string) (agentproto.StatsResult, error) {
		return s.GuestStats(ctx, admin, id)
	}
	c.skipped.WithLabelValues(skippedTimeout)
	c.skipped.WithLabelValues(skippedError)
	return c
}

// Describe sends the descriptors of every series the collector writes.
func (c *SandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.memUsed, c.memTotal, c.diskUsed, c.diskTotal, c.vmmCPU, c.vmmMem, c.limit, c.suppressed} {
		ch <- d
	}
	c.skipped.Describe(ch)
}

// Collect measures the running sandboxes, at most Parallel at once and
// within Budget in all, and writes their series. A sandbox that stops
// running between the list and its measure is left out without a count.
func (c *SandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(c.s.ctx, c.cfg.Budget)
	defer cancel()
	disabled, over := c.cfg.Limit <= 0, false
	var rows []store.Sandbox
	if !disabled {
		// One past the limit is enough to tell that there are too many.
		var err error
		rows, err = c.s.st.ListSandboxes(ctx, store.SandboxFilter{States: []string{apiv1.StateRunning}, Limit: c.cfg.Limit + 1})
		if err != nil && ctx.Err() == nil {
			c.s.log.Warn("per-sandbox metrics: list running sandboxes", "err", err)
		}
		if len(rows) > c.cfg.Limit {
			over, rows = true, nil
		}
	}
	for _, r := range c.measureAll(ctx, rows) {
		labels := []string{r.sb.ID, r.sb.TemplateRef}
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.GaugeValue, r.st.CPUUsedPct, labels...)
		ch <- prometheus.MustNewConstMetric(c.memUsed, prometheus.GaugeValue, float64(r.st.MemUsedBytes), labels...)
		ch <- prometheus.MustNewConstMetric(c.memTotal, prometheus.GaugeValue, float64(r.st.MemTotalBytes), labels...)
		ch <- prometheus.MustNewConstMetric(c.diskUsed, prometheus.GaugeValue, float64(r.st.DiskUsedBytes), labels...)
		ch <- prometheus.MustNewConstMetric(c.diskTotal, prometheus.GaugeValue, float64(r.st.DiskTotalBytes), labels...)
		if vmm, ok := c.s.vmmStats(r.sb.ID); ok {
			ch <- prometheus.MustNewConstMetric(c.vmmCPU, prometheus.CounterValue, float64(vmm.CPUUsageNS)/1e9, labels...)
			ch <- prometheus.MustNewConstMetric(c.vmmMem, prometheus.GaugeValue, float64(vmm.MemoryBytes), labels...)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(max(c.cfg.Limit, 0)))
	ch <- prometheus.MustNewConstMetric(c.suppressed, prometheus.GaugeValue, gaugeBool(disabled), suppressedDisabled)
	ch <- prometheus.MustNewConstMetric(c.suppressed, prometheus.GaugeValue, gaugeBool(over), suppressedOverLimit)
	c.skipped.Collect(ch)
}

func gaugeBool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// measured is one sandbox's measure.
type measured struct {
	sb store.Sandbox
	st agentproto.StatsResult
}

// measureAll measures rows until ctx ends and returns those measured, in
// the order of rows. Each measuring goroutine ends when its call returns,
// which ctx bounds; those that answer after ctx ended are counted as
// timeouts and their answers dropped.
func (c *SandboxCollector) measureAll(ctx context.Context, rows []store.Sandbox) []measured {
	type answer struct {
		i   int
		st  agentproto.StatsResult
		err error
	}
	answers := make(chan answer, len(rows)) // never blocks a sender
	slots := make(chan struct{}, c.cfg.Parallel)
	for i, sb := range rows {
		go func() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				answers <- answer{i: i, err: ctx.Err()}
				return
			}
			defer func() { <-slots }()
			st, err := c.measure(ctx, sb.ID)
			answers <- answer{i: i, st: st, err: err}
		}()
	}

	got := make([]*agentproto.StatsResult, len(rows))
	pending := len(rows)
	for pending > 0 {
		select {
		case a := <-answers:
			pending--
			switch {
			case a.err == nil:
				got[a.i] = &a.st
			case ctx.Err() != nil || errors.Is(a.err, context.DeadlineExceeded):
				c.skipped.WithLabelValues(skippedTimeout).Inc()
			case errors.Is(a.err, errdefs.ErrConflict), errors.Is(a.err, errdefs.ErrNotFound):
				// No longer running: nothing was skipped.
			default:
				c.skipped.WithLabelValues(skippedError).Inc()
				c.s.log.Debug("per-sandbox metrics: measure", "sandbox", rows[a.i].ID, "err", a.err)
			}
		case <-ctx.Done():
			c.skipped.WithLabelValues(skippedTimeout).Add(float64(pending))
			pending = 0
		}
	}
	var out []measured
	for i, st := range got {
		if st != nil {
			out = append(out, measured{sb: rows[i], st: *st})
		}
	}
	return out
}

// PoolCollector writes the warm pools' gauges (airlock serve --warm).
type PoolCollector struct {
	s                    *Service
	ready, size, waiting *prometheus.Desc
}

// NewPoolCollector returns the collector of s's warm pools.
func NewPoolCollector(s *Service) *PoolCollector {
	labels := []string{"template"}
	return &PoolCollector{s: s,
		ready: prometheus.NewDesc("airlock_warm_pool_ready", "Clones the template's warm pool holds ready for a create.", labels, nil),
		size:  prometheus.NewDesc("airlock_warm_pool_size", "Clones the template's warm pool keeps (airlock serve --warm).", labels, nil),
		waiting: prometheus.NewDesc("airlock_warm_pool_waiting_for_room",
			"1 while the template's warm pool is short and its last fill found the host at its cap on sandboxes, else 0.", labels, nil),
	}
}

// Describe sends the pools' descriptors.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ready
	ch <- c.size
	ch <- c.waiting
}

// Collect writes each pool's size, members ready and whether it waits
// for room.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.s.rt.Pools() {
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, float64(p.Ready), p.Template)
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(p.Size), p.Template)
		waiting := 0.0
		if p.WaitingForRoom {
			waiting = 1
		}
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, waiting, p.Template)
	}
}
