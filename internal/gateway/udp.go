package gateway

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// handleUDP drops a guest datagram that no endpoint of the gateway's took.
// UDP carries only DNS to the gateway (and DHCP), both served by bound
// endpoints before this handler is asked; everything else goes nowhere:
// other resolvers, QUIC, tunnels. The egress log gets a sample only
// (udpNotice), so that a flood does not wash out its history.
func (g *Gateway) handleUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	g.cfg.Metrics.flow("deny")
	g.sampled(g.udpNotice, Event{Time: time.Now(), Proto: "udp", IP: addrOf(id.LocalAddress).String(), Port: id.LocalPort,
		Verdict: "deny", Reason: "udp"})
}
