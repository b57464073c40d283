package gateway

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts what every sandbox's gateway lets through and refuses. One
// Metrics serves all gateways of a server; a nil *Metrics counts nothing.
type Metrics struct {
	flows *prometheus.CounterVec // by verdict: TCP and UDP flows
	bytes *prometheus.CounterVec // by direction: out (from guests) and in
	dns   *prometheus.CounterVec // by verdict
}

// NewMetrics makes the gateway's metrics and registers them with reg (when
// reg is not nil): airlock_egress_flows_total{verdict},
// airlock_egress_bytes_total{direction="out|in"} and
// airlock_dns_queries_total{verdict}. It panics if they are registered
// already, as prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		flows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_egress_flows_total",
			Help: "Guest TCP and UDP flows by the gateway's verdict (allow or deny).",
		}, []string{"verdict"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_egress_bytes_total",
			Help: "Bytes carried by allowed guest flows: out from the guest, in to it.",
		}, []string{"direction"}),
		dns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_dns_queries_total",
			Help: "DNS queries guests sent to their gateway, by verdict (allow or deny).",
		}, []string{"verdict"}),
	}
	if reg != nil {
		reg.MustRegister(m.flows, m.bytes, m.dns)
	}
	return m
}

func (m *Metrics) flow(verdict string) {
	if m != nil {
		m.flows.WithLabelValues(verdict).Inc()
	}
}

func (m *Metrics) carried(out, in int64) {
	if m != nil {
		m.bytes.WithLabelValues("out").Add(float64(out))
		m.bytes.WithLabelValues("in").Add(float64(in))
	}
}

func (m *Metrics) query(verdict string) {
	if m != nil {
		m.dns.WithLabelValues(verdict).Inc()
	}
}
