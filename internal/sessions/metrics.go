package sessions

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the command sessions' Prometheus metrics. A nil *Metrics
// counts nothing, so tests may leave it out.
type Metrics struct {
	commands *prometheus.CounterVec
	running  prometheus.Gauge
	attaches prometheus.Counter
}

// NewMetrics registers the command sessions' metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_commands_total", Help: "Commands that ended, by how: exited (with a status), lost, or rolled_back with their sandbox.",
		}, []string{"result"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "airlock_commands_running", Help: "Command processes this server follows now.",
		}),
		attaches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_command_attaches_total", Help: "Attachments to command streams.",
		}),
	}
	reg.MustRegister(m.commands, m.running, m.attaches)
	return m
}

// following counts a command process this server now follows (started
// or re-attached) with 1, and with -1 when it stops following it, for
// whatever reason (exit, suspend, shutdown).
func (m *Metrics) following(delta int) {
	if m != nil {
		m.running.Add(float64(delta))
	}
}

// commandEnded counts a command that ended: "exited" with a status,
// "lost" when its process could no longer be followed, or "rolled_back"
// with its sandbox.
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
