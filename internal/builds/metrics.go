package builds

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the Prometheus metrics of builds and of Reclaim. A nil
// *Metrics counts nothing, so tests may leave it out.
type Metrics struct {
	reclaims prometheus.Counter
}

// NewMetrics registers the metrics of builds with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reclaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_template_reclaims_total", Help: "Passes of the reclaim of template storage nothing refers to, done.",
		}),
	}
	reg.MustRegister(m.reclaims)
	return m
}

// reclaimed counts a pass of Reclaim done.
func (m *Metrics) reclaimed() {
	if m != nil {
		m.reclaims.Inc()
	}
}
