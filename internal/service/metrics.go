package service

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Metrics are the service's Prometheus metrics. A nil *Metrics counts
// nothing, so tests may leave it out.
type Metrics struct {
	sandboxes  *prometheus.GaugeVec
	ops        *prometheus.CounterVec
	opSeconds  *prometheus.HistogramVec
	opsPending *prometheus.GaugeVec
	commands   *prometheus.CounterVec
	running    prometheus.Gauge
	attaches   prometheus.Counter
	bytes      prometheus.Counter
}

// NewMetrics registers the service's metrics with reg.
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
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_commands_total", Help: "Commands that ended, by how: exited (with a status) or lost.",
		}, []string{"result"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "airlock_commands_running", Help: "Command processes this server follows now.",
		}),
		attaches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_command_attaches_total", Help: "Attachments to command streams.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_streamed_bytes_total", Help: "Bytes of command output and file content streamed.",
		}),
	}
	reg.MustRegister(m.sandboxes, m.ops, m.opSeconds, m.opsPending, m.commands, m.running, m.attaches, m.bytes)
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

// following counts a command process this server now follows (started
// or re-attached); unfollowing when it stops following it, for whatever
// reason (exit, suspend, shutdown).
func (m *Metrics) following(delta int) {
	if m != nil {
		m.running.Add(float64(delta))
	}
}

// commandEnded counts a command that ended: "exited" with a status, or
// "lost" when its process could no longer be followed.
func (m *Metrics) commandEnded(result string) {
	if m != nil {
		m.commands.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) attached() {
	if m != nil {
		m.attaches.Inc()
	}
}

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

// SandboxMetrics is GuestStats as the API shows it.
func (s *Service) SandboxMetrics(ctx context.Context, p Principal, id string) (apiv1.SandboxMetrics, error) {
	st, err := s.GuestStats(ctx, p, id)
	if err != nil {
		return apiv1.SandboxMetrics{}, err
	}
	return apiv1.SandboxMetrics{
		CPUUsedPct: math.Round(st.CPUUsedPct*10) / 10, CPUCount: st.CPUCount,
		MemUsedMiB: st.MemUsedBytes >> 20, MemTotalMiB: st.MemTotalBytes >> 20, MemCacheMiB: st.MemCacheBytes >> 20,
		DiskUsedMiB: st.DiskUsedBytes >> 20, DiskTotalMiB: st.DiskTotalBytes >> 20,
		Time: s.now(),
	}, nil
}
