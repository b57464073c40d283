package gateway

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	public := netip.MustParseAddrPort("203.0.113.10:7000")
	n := newTestNet(t, policy.Policy{Allow: []string{public.String(), "ok.test"}}, netOptions{
		redirect: map[netip.AddrPort]string{public: echoServer(t)},
		config:   func(c *Config) { c.Metrics = m },
	})
	n.dns.set("ok.test", "203.0.113.5")
	n.resolveA("ok.test")
	n.query("udp", "evil.test", dns.TypeA)
	if _, err := n.dial("10.1.1.1:80"); !isRefused(err) {
		t.Fatalf("dial 10.1.1.1:80: %v", err)
	}
	c, err := n.dial(public.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, "12345"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	n.waitEvent(t, func(e Event) bool { return e.Verdict == "allow" && e.Proto == "tcp" && e.Phase == "end" })

	want := map[string]float64{
		`airlock_egress_flows_total{verdict=allow}`: 1,
		`airlock_egress_flows_total{verdict=deny}`:  1,
		`airlock_egress_bytes_total{direction=out}`: 5,
		`airlock_egress_bytes_total{direction=in}`:  5,
		`airlock_dns_queries_total{verdict=allow}`:  1,
		`airlock_dns_queries_total{verdict=deny}`:   1,
	}
	got := testenv.Gather(t, reg)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	var nilMetrics *Metrics // counts nothing, without panicking
	nilMetrics.flow("allow")
	nilMetrics.carried(1, 1)
	nilMetrics.query("deny")
}
