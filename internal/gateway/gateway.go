// Package gateway is a sandbox's only network: the other end of the VM's
// virtio-net device, a userspace TCP/IP stack (gVisor's netstack, composed
// with gvisor-tap-vsock's link, switch and DHCP server) that runs in the
// airlock server and terminates every guest flow.
//
// The gateway serves the guest DHCP and DNS itself; it judges each DNS
// query and each TCP connection by the sandbox's network policy (package
// policy), reading the TLS SNI or HTTP Host first where the policy needs
// the name, and dials allowed connections out from the host. Connections to
// hosts with credential rules go through the credential-injecting proxy
// (package mitm). UDP other than DNS, ICMP beyond the gateway and IPv6 go
// nowhere. Every flow and query is written to the egress log (Log) with its
// verdict; a policy change closes the open connections it forbids. The
// server reaches guest ports through the same stack (DialGuest).
package gateway

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containers/gvisor-tap-vsock/pkg/services/dhcp"
	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// Addresses of every sandbox's own isolated network. Each sandbox has its
// own stack, so all share them.
const (
	GatewayIP  = "10.0.2.2" // the guest's router and DNS resolver
	GuestIP    = "10.0.2.15"
	PrefixLen  = 24
	MTU        = 1500
	GatewayMAC = "5a:94:ef:e4:0c:dd"
	GuestMAC   = "5a:94:ef:e4:0c:ee" // the VM's NIC is started with this MAC
)

const (
	nicID          = 1
	hostAddrsTTL   = 5 * time.Second // how long the host's interface addresses are trusted
	dialTimeout    = 10 * time.Second
	maxFrameBytes  = 1 << 17   // larger than any frame QEMU's net layer passes (NET_BUFSIZE)
	tcpBufferBytes = 256 << 10 // TCP send and receive buffer of each guest flow
)

var (
	gatewayAddr = netip.MustParseAddr(GatewayIP)
	guestAddr   = netip.MustParseAddr(GuestIP)
)

// Limits bound what one guest can make its gateway do. Zero fields take the
// defaults.
type Limits struct {
	// MaxFlows is how many TCP flows may be open at once (default 512);
	// past it new connections are refused with RST.
	MaxFlows int
	// MaxHandshakes is how many TCP handshakes may be in flight (default
	// 64); past it new SYNs are ignored, and the guest retries them.
	MaxHandshakes int
	// DNSPerSecond is how many DNS queries per second are answered (default
	// 50, bursts of twice that); past it queries are REFUSED.
	DNSPerSecond float64
}

func (l Limits) withDefaults() Limits {
	if l.MaxFlows <= 0 {
		l.MaxFlows = 512
	}
	if l.MaxHandshakes <= 0 {
		l.MaxHandshakes = 64
	}
	if l.DNSPerSecond <= 0 {
		l.DNSPerSecond = 50
	}
	return l
}

// Config configures one sandbox's gateway.
type Config struct {
	// Socket is the unix socket QEMU's netdev serves (-netdev
	// stream,server=on). Start connects to it, retrying until its context
	// ends, since QEMU may still be creating it. Required.
	Socket string
	// Policy is the sandbox's network policy; SetPolicy replaces it.
	Policy policy.Policy
	// CA is the sandbox's certificate authority, for TLS to hosts with
	// credential rules. Required when the policy has any, or may get any.
	CA *mitm.CA
	// Secret returns the value of the stored secret name. nil: credentials
	// fail closed (their requests are refused).
	Secret func(ctx context.Context, name string) (string, error)
	// DNSUpstream is the resolver the gateway asks, HOST:PORT; "" means the
	// nameservers of the host's /etc/resolv.conf.
	DNSUpstream string
	// RootCAs verifies upstream servers of hosts with credential rules; nil
	// means the host's system roots (SSL_CERT_FILE is honoured).
	RootCAs *x509.CertPool
	// Log receives the gateway's own messages; nil discards them.
	Log *slog.Logger
	// Events is the egress log; nil keeps none.
	Events *Log
	// Metrics counts flows, bytes and queries; nil counts nothing.
	Metrics *Metrics
	// Limits bound the guest; zero fields take their defaults.
	Limits Limits
	// Private are the parts of the private ranges (RFC 1918, CGNAT) the
	// operator opened: an allow entry naming an address in them literally
	// admits it. The rest of those ranges is always denied.
	Private []netip.Prefix
}

// Gateway is one sandbox's running network. It lives from Start until Close
// or until the link to QEMU ends (QEMU exited).
type Gateway struct {
	cfg       Config // Limits filled in
	log       *slog.Logger
	stack     *stack.Stack
	link      net.Conn                                                         // to QEMU, framed as types.QemuProtocol
	sw        *tap.Switch                                                      // relays frames between link and the stack
	upstreams []string                                                         // DNS servers, HOST:PORT; empty when none could be found
	dialHost  func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) // dialTCP but in tests

	dnsUDP *gonet.UDPConn
	dnsTCP net.Listener // at most dnsTCPConns connections at once
	dhcp   *dhcp.Server

	policyMu sync.Mutex // serializes compiling and swapping rules and rulesGen
	rules    atomic.Pointer[policy.Rules]
	rulesGen atomic.Uint64 // the generation of the host's addresses rules were compiled with

	hosts hostAddrs
	cache *resolveCache

	dnsLimit   *rate.Limiter // queries answered
	dnsNotice  *rate.Limiter // egress log entries for refused queries
	udpNotice  *rate.Limiter // egress log entries for dropped UDP
	denyNotice *rate.Limiter // egress log entries for refused TCP

	mu       sync.Mutex // guards flows, nextFlow, open and closed
	flows    map[uint64]*flow
	nextFlow uint64
	open     int  // flows counted against Limits.MaxFlows
	closed   bool // no new goroutine, flow or connection may start

	// wg counts the goroutines the gateway runs (the link's aside); Close
	// waits for them.
	wg sync.WaitGroup

	ctx     context.Context // ends with the gateway: dials, DNS, proxies
	cancel  context.CancelFunc
	closing sync.Once
	done    chan struct{} // closed when everything has ended
}

// Start connects to QEMU's socket and runs the gateway. ctx bounds the
// connecting only; the gateway lives until Close or until the link ends.
func Start(ctx context.Context, cfg Config) (*Gateway, error) {
	quietLinkLogs()
	return start(ctx, cfg, hostSeams{})
}

// quietLinkLogs turns off the logging of gvisor-tap-vsock's switch, which
// goes to logrus's global logger and says "cannot receive packets" as an
// error each time a link ends: the way every gateway ends. A program that
// pointed logrus elsewhere itself (airlock's main, at debug level) keeps
// its choice.
var quietLinkLogs = sync.OnceFunc(func() {
	if logrus.StandardLogger().Out == os.Stderr {
		logrus.SetOutput(io.Discard)
	}
})

// hostSeams replace, in tests, what the gateway asks of the host: the dial
// out (test upstreams cannot have public addresses) and the interface
// addresses (which a test cannot change). Zero fields keep the real ones.
type hostSeams struct {
	dial           func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	interfaceAddrs func() ([]net.Addr, error)
	addrsTTL       time.Duration
}

// start is Start with the host's side replaceable.
func start(ctx context.Context, cfg Config, seams hostSeams) (*Gateway, error) {
	if cfg.Socket == "" {
		return nil, fmt.Errorf("gateway config: Socket is required: %w", errdefs.ErrInvalid)
	}
	cfg.Limits = cfg.Limits.withDefaults()
	g := &Gateway{
		cfg:        cfg,
		log:        cfg.Log,
		cache:      newResolveCache(time.Now),
		flows:      make(map[uint64]*flow),
		dnsLimit:   rate.NewLimiter(rate.Limit(cfg.Limits.DNSPerSecond), max(1, int(2*cfg.Limits.DNSPerSecond))),
		dnsNotice:  rate.NewLimiter(1, 1),
		udpNotice:  rate.NewLimiter(10, 10),
		denyNotice: rate.NewLimiter(100, 200),
		done:       make(chan struct{}),
		dialHost:   seams.dial,
		hosts:      hostAddrs{list: seams.interfaceAddrs, ttl: seams.addrsTTL},
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.dialHost == nil {
		g.dialHost = g.dialTCP
	}
	if err := g.swapRules(cfg.Policy); err != nil {
		return nil, err
	}
	var err error
	if g.upstreams, err = dnsUpstreams(cfg.DNSUpstream); err != nil {
		if cfg.DNSUpstream != "" {
			return nil, err
		}
		g.log.Warn("gateway: no DNS upstream; allowed queries will fail", "err", err)
	}

	link, err := dialLink(ctx, cfg.Socket)
	if err != nil {
		return nil, err
	}
	g.link = &qemuLink{Conn: link}
	if err := g.build(); err != nil {
		link.Close()
		if g.stack != nil {
			g.stack.Destroy()
		}
		return nil, err
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.serve()
	return g, nil
}

// build makes the stack and binds the gateway's own services: DHCP and DNS.
func (g *Gateway) build() error {
	ep, err := tap.NewLinkEndpoint(false, MTU, GatewayMAC, GatewayIP, nil)
	if err != nil {
		return fmt.Errorf("gateway link: %w", err)
	}
	sw := tap.NewSwitch(false)
	ep.Connect(sw)
	sw.Connect(ep)
	g.sw = sw

	// No IPv6 protocol: the stack drops IPv6 frames unread.
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	g.stack = s
	gw := tcpip.AddrFrom4(gatewayAddr.As4())
	prefix := tcpip.AddressWithPrefix{Address: gw, PrefixLen: PrefixLen}
	if err := s.CreateNIC(nicID, ep); err != nil {
		return fmt.Errorf("gateway NIC: %s", err)
	}
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: prefix}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("gateway address: %s", err)
	}
	// Promiscuous and spoofing: the stack takes packets for any address, so
	// that every guest flow reaches the forwarders below.
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("gateway NIC spoofing: %s", err)
	}
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("gateway NIC promiscuous mode: %s", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: prefix.Subnet(), NIC: nicID}})
	// Buffers bound the memory a guest can pin per flow by not reading (or
	// by outrunning the upstream): gVisor's defaults are 1 MiB each way,
	// growing to 4 MiB. Between the guest and the gateway the round trip is
	// short, so small windows cost no throughput.
	sendBuf := tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: tcpBufferBytes, Max: tcpBufferBytes}
	recvBuf := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: tcpBufferBytes, Max: tcpBufferBytes}
	if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, &sendBuf); err != nil {
		return fmt.Errorf("gateway TCP send buffer: %s", err)
	}
	if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, &recvBuf); err != nil {
		return fmt.Errorf("gateway TCP receive buffer: %s", err)
	}

	// Bound endpoints take precedence over the forwarders, so DNS and DHCP
	// are served before the policy handlers see anything.
	tf := tcp.NewForwarder(s, tcpBufferBytes, g.cfg.Limits.MaxHandshakes, g.handleTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tf.HandlePacket)
	uf := udp.NewForwarder(s, g.handleUDP)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, uf.HandlePacket)

	dnsAddr := tcpip.FullAddress{NIC: nicID, Addr: gw, Port: 53}
	if g.dnsUDP, err = gonet.DialUDP(s, &dnsAddr, nil, ipv4.ProtocolNumber); err != nil {
		return fmt.Errorf("gateway DNS over UDP: %w", err)
	}
	dnsTCP, err := gonet.ListenTCP(s, dnsAddr, ipv4.ProtocolNumber)
	if err != nil {
		g.dnsUDP.Close()
		return fmt.Errorf("gateway DNS over TCP: %w", err)
	}
	g.dnsTCP = newLimitListener(dnsTCP, dnsTCPConns)

	_, subnet, _ := net.ParseCIDR(fmt.Sprintf("%s/%d", GatewayIP, PrefixLen))
	pool := tap.NewIPPool(subnet)
	pool.Reserve(net.ParseIP(GatewayIP), GatewayMAC)
	pool.Reserve(net.ParseIP(GuestIP), GuestMAC) // the guest's static lease
	g.dhcp, err = dhcp.New(&types.Configuration{Subnet: subnet.String(), GatewayIP: GatewayIP, MTU: MTU}, s, pool)
	if err != nil {
		g.dnsUDP.Close()
		g.dnsTCP.Close()
		return fmt.Errorf("gateway DHCP: %w", err)
	}
	return nil
}

// serve starts the gateway's goroutines. The link's goroutine owns the
// teardown: when the link ends, for whatever reason, it closes everything
// and then Done.
func (g *Gateway) serve() {
	g.goTracked(func() { g.serveDNS(g.dnsUDP, nil) })
	g.goTracked(func() { g.serveDNS(nil, g.dnsTCP) })
	g.goTracked(func() { g.dhcp.Serve() })
	go func() {
		err := g.sw.Accept(g.ctx, g.link, types.QemuProtocol)
		if g.ctx.Err() == nil {
			g.log.Info("gateway: link to the VM ended", "err", err)
		}
		g.teardown()
		close(g.done)
	}()
}

// goTracked runs f in a goroutine that teardown waits for. It is called
// only before the gateway can be closing.
func (g *Gateway) goTracked(f func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

// teardown ends everything but the link's goroutine, which runs it.
func (g *Gateway) teardown() {
	g.cancel()
	g.mu.Lock()
	g.closed = true
	flows := make([]*flow, 0, len(g.flows))
	for _, f := range g.flows {
		flows = append(flows, f)
	}
	g.mu.Unlock()
	g.link.Close()
	g.dnsUDP.Close()
	g.dnsTCP.Close()
	g.dhcp.Underlying.Close()
	for _, f := range flows {
		f.abort()
	}
	g.stack.Close() // aborts every endpoint: handshakes, flows, inbound connections
	g.wg.Wait()
	g.stack.Wait()
}

// Done is closed when the gateway has ended: the link to QEMU ended (QEMU
// exited) or Close was called.
func (g *Gateway) Done() <-chan struct{} { return g.done }

// Close ends the link, every flow and every goroutine of the gateway, and
// returns when they have ended. It is idempotent.
func (g *Gateway) Close() error {
	g.closing.Do(func() {
		g.cancel()
		g.link.Close()
	})
	<-g.done
	return nil
}

// Policy returns the policy in force, normalized.
func (g *Gateway) Policy() policy.Policy { return g.rules.Load().Policy() }

// SetPolicy validates and compiles p, puts it in force, and closes (RST)
// every open connection it forbids. Errors wrap errdefs.ErrInvalid; the
// policy in force is then unchanged.
func (g *Gateway) SetPolicy(p policy.Policy) error {
	if err := g.swapRules(p); err != nil {
		return err
	}
	g.rejudge()
	return nil
}

// swapRules compiles p with the host's current addresses and puts it in
// force. A policy with credential rules needs a CA.
func (g *Gateway) swapRules(p policy.Policy) error {
	if len(p.Credentials) > 0 && g.cfg.CA == nil {
		return fmt.Errorf("network policy: credentials need the sandbox's CA, which the gateway was not given: %w", errdefs.ErrInvalid)
	}
	g.policyMu.Lock()
	defer g.policyMu.Unlock()
	return g.compileLocked(p)
}

func (g *Gateway) compileLocked(p policy.Policy) error {
	addrs, gen := g.hosts.get()
	r, err := policy.Compile(p, policy.Bounds{Gateway: gatewayAddr, Host: addrs, Private: g.cfg.Private})
	if err != nil {
		return err
	}
	g.rules.Store(r)
	g.rulesGen.Store(gen)
	return nil
}

// currentRules returns the rules in force, first compiling them again if
// the host's addresses changed since (they are read at most every
// hostAddrsTTL), so that an address the host gained is denied too; the
// open flows are then judged again.
func (g *Gateway) currentRules() *policy.Rules {
	if _, gen := g.hosts.get(); gen == g.rulesGen.Load() {
		return g.rules.Load()
	}
	g.policyMu.Lock()
	if _, gen := g.hosts.get(); gen != g.rulesGen.Load() {
		if err := g.compileLocked(g.rules.Load().Policy()); err != nil { // cannot happen: it compiled before
			g.log.Error("gateway: recompile the policy for new host addresses", "err", err)
		}
	}
	g.policyMu.Unlock()
	g.rejudge()
	return g.rules.Load()
}

// DialGuest connects to port of the guest through the stack, for inbound
// traffic such as the API's port proxy.
func (g *Gateway) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	if g.ctx.Err() != nil {
		return nil, fmt.Errorf("dial guest port %d: %w", port, net.ErrClosed)
	}
	addr := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(guestAddr.As4()), Port: port}
	c, err := gonet.DialContextTCP(ctx, g.stack, addr, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("dial guest port %d: %w", port, err)
	}
	return c, nil
}

// alwaysDenied reports whether the gateway must not dial a at port on the
// guest's behalf: a is in the always-denied set and r opens it for no such
// port (port 0: for no port).
func (g *Gateway) alwaysDenied(r *policy.Rules, a netip.Addr, port uint16) bool {
	addrs, _ := g.hosts.get()
	denied, _ := policy.AlwaysDenied(a, policy.Bounds{Gateway: gatewayAddr, Host: addrs})
	return denied && !r.OpenedLiterally(a, port)
}

// event writes e to the egress log, if there is one.
func (g *Gateway) event(e Event) {
	if g.cfg.Events != nil {
		g.cfg.Events.Add(e)
	}
}

// hostAddrs is the host's own IPv4 interface addresses, read again when
// asked for after ttl (default hostAddrsTTL).
type hostAddrs struct {
	list func() ([]net.Addr, error) // default net.InterfaceAddrs
	ttl  time.Duration

	mu    sync.Mutex // guards addrs, gen and read
	addrs []netip.Addr
	gen   uint64 // counts the changes of addrs
	read  time.Time
}

// get returns the host's addresses and their generation, which changes
// when they do. On an error reading them the last ones are kept.
func (h *hostAddrs) get() (addrs []netip.Addr, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.list == nil {
		h.list = net.InterfaceAddrs
	}
	if h.ttl == 0 {
		h.ttl = hostAddrsTTL
	}
	if !h.read.IsZero() && time.Since(h.read) < h.ttl {
		return h.addrs, h.gen
	}
	h.read = time.Now()
	ifAddrs, err := h.list()
	if err != nil {
		return h.addrs, h.gen
	}
	if now := ipv4Of(ifAddrs); !slices.Equal(now, h.addrs) {
		h.addrs = now
		h.gen++
	}
	return h.addrs, h.gen
}

// HostAddrs returns the host's own IPv4 interface addresses, sorted: what
// the gateway denies as the host's (see policy.Bounds).
func HostAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("read the host's addresses: %w", err)
	}
	return ipv4Of(ifAddrs), nil
}

// ipv4Of returns the IPv4 addresses of interface addresses, sorted and
// without repeats.
func ipv4Of(ifAddrs []net.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range ifAddrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
