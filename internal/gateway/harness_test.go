package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// testNet is a gateway under test. A unix socket in the test's directory
// plays QEMU's netdev: the gateway connects to it, and behind it a second
// gVisor stack plays the guest, speaking QEMU's framing (a 4-byte
// big-endian length, then an Ethernet frame).
type testNet struct {
	t      *testing.T
	gw     *Gateway
	guest  *stack.Stack
	link   net.Conn // QEMU's end of the link
	events *Log
	dns    *testDNS
	dir    string
}

// netOptions adjust a testNet before its gateway starts.
type netOptions struct {
	limits    Limits
	redirect  map[netip.AddrPort]string  // host dials to these addresses go to local listeners instead
	hostAddrs func() ([]net.Addr, error) // the host's interface addresses, read every 10 ms
	config    func(*Config)
}

func newTestNet(t *testing.T, p policy.Policy, o netOptions) *testNet {
	t.Helper()
	dir := t.TempDir()
	n := &testNet{t: t, dns: newTestDNS(t), dir: dir}
	sock := filepath.Join(dir, "net.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // one connection, as QEMU's netdev serves it
	n.events, err = OpenLog(filepath.Join(dir, "egress.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.events.Close() })

	var gwp atomic.Pointer[Gateway]
	dialHost := func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
		if to, ok := o.redirect[ap]; ok {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to)
		}
		return gwp.Load().dialTCP(ctx, ap)
	}
	cfg := Config{
		Socket:      sock,
		Policy:      p,
		DNSUpstream: n.dns.addr,
		Log:         testLogger(t),
		Events:      n.events,
		Limits:      o.limits,
	}
	if o.config != nil {
		o.config(&cfg)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seams := hostSeams{dial: dialHost}
	if o.hostAddrs != nil {
		seams.interfaceAddrs, seams.addrsTTL = o.hostAddrs, 10*time.Millisecond
	}
	gw, err := start(ctx, cfg, seams)
	if err != nil {
		t.Fatal(err)
	}
	gwp.Store(gw)
	n.gw = gw
	t.Cleanup(func() { gw.Close() })
	n.link = <-accepted
	if n.link == nil {
		t.Fatal("the gateway did not connect")
	}
	n.guest = newGuestStack(t, n.link)
	return n
}

// newGuestStack runs a stack with the guest's address and MAC on conn.
func newGuestStack(t *testing.T, conn net.Conn) *stack.Stack {
	t.Helper()
	mac, _ := net.ParseMAC(GuestMAC)
	ch := channel.New(256, MTU+header.EthernetMinimumSize, tcpip.LinkAddress(mac))
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	if err := s.CreateNIC(1, ethernet.New(ch)); err != nil {
		t.Fatal(err)
	}
	guest := tcpip.AddressWithPrefix{Address: stackAddr(GuestIP), PrefixLen: PrefixLen}
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: guest}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: guest.Subnet(), NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: stackAddr(GatewayIP), NIC: 1},
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // guest -> gateway
		defer wg.Done()
		for {
			pkt := ch.ReadContext(ctx)
			if pkt == nil {
				return
			}
			v := pkt.ToView()
			frame := make([]byte, 4+v.Size())
			binary.BigEndian.PutUint32(frame, uint32(v.Size()))
			copy(frame[4:], v.AsSlice())
			v.Release()
			pkt.DecRef()
			if _, err := conn.Write(frame); err != nil {
				return
			}
		}
	}()
	go func() { // gateway -> guest
		defer wg.Done()
		r := bufio.NewReader(conn)
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			frame := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(r, frame); err != nil {
				return
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
			ch.InjectInbound(header.IPv4ProtocolNumber, pkt)
			pkt.DecRef()
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		cancel()
		wg.Wait()
		s.Destroy()
		ch.Close()
	})
	return s
}

func stackAddr(s string) tcpip.Address {
	return tcpip.AddrFrom4(netip.MustParseAddr(s).As4())
}

// dial connects from the guest to addr ("IP:port").
func (n *testNet) dial(addr string) (*gonet.TCPConn, error) {
	ap := netip.MustParseAddrPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return gonet.DialContextTCP(ctx, n.guest, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}, ipv4.ProtocolNumber)
}

// query asks the gateway's DNS from the guest, over UDP or TCP.
func (n *testNet) query(network, name string, qtype uint16) (*dns.Msg, error) {
	gw := &tcpip.FullAddress{NIC: 1, Addr: stackAddr(GatewayIP), Port: 53}
	var c net.Conn
	var err error
	if network == "tcp" {
		c, err = n.dial(GatewayIP + ":53")
	} else {
		c, err = gonet.DialUDP(n.guest, nil, gw, ipv4.ProtocolNumber)
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	co := &dns.Conn{Conn: c}
	m := new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

// resolveA resolves name through the gateway and fails the test unless it
// gives an address.
func (n *testNet) resolveA(name string) netip.Addr {
	n.t.Helper()
	m, err := n.query("udp", name, dns.TypeA)
	if err != nil {
		n.t.Fatalf("resolve %s: %v", name, err)
	}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			return netip.MustParseAddr(a.A.String())
		}
	}
	n.t.Fatalf("resolve %s: no address in %v", name, m)
	return netip.Addr{}
}

// waitEvent waits until the egress log holds an event that match accepts.
func (n *testNet) waitEvent(t *testing.T, match func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		evs, err := n.events.List(0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no such event in the egress log: %+v", evs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testDNS is the gateway's upstream resolver in tests: it answers the names
// it was given and counts every query it gets.
type testDNS struct {
	addr string

	mu      sync.Mutex // guards everything below
	a       map[string][]string
	cname   map[string]string
	queries map[string]int // "name type" -> count
}

func newTestDNS(t *testing.T) *testDNS {
	t.Helper()
	d := &testDNS{a: map[string][]string{}, cname: map[string]string{}, queries: map[string]int{}}
	// UDP and TCP on one port; the TCP port may be taken: try another.
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ln == nil; try++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		d.addr = pc.LocalAddr().String()
		if ln, err = net.Listen("tcp", d.addr); err != nil {
			pc.Close()
			if try == 10 {
				t.Fatal(err)
			}
		}
	}
	udpSrv := &dns.Server{PacketConn: pc, Handler: d}
	tcpSrv := &dns.Server{Listener: ln, Handler: d}
	started := make(chan struct{}, 2)
	udpSrv.NotifyStartedFunc = func() { started <- struct{}{} }
	tcpSrv.NotifyStartedFunc = func() { started <- struct{}{} }
	go udpSrv.ActivateAndServe()
	go tcpSrv.ActivateAndServe()
	<-started
	<-started
	t.Cleanup(func() {
		udpSrv.Shutdown()
		tcpSrv.Shutdown()
	})
	return d
}

// set makes name answer A queries with addrs.
func (d *testDNS) set(name string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name] = addrs
}

func (d *testDNS) setCNAME(name, target string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cname[name] = target
}

// count returns how many queries of qtype for name the server got.
func (d *testDNS) count(name string, qtype uint16) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queries[name+" "+dns.TypeToString[qtype]]
}

func (d *testDNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	d.mu.Lock()
	d.queries[name+" "+dns.TypeToString[q.Qtype]]++
	m := new(dns.Msg).SetReply(req)
	cur := name
	if target, ok := d.cname[cur]; ok {
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: dns.Fqdn(cur), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 30}, Target: dns.Fqdn(target)})
		cur = target
	}
	addrs, known := d.a[cur]
	d.mu.Unlock()
	switch {
	case !known:
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA:
		for _, a := range addrs {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: dns.Fqdn(cur), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(a)})
		}
	case q.Qtype == dns.TypeAAAA:
		m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: dns.Fqdn(cur), Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 60}, AAAA: net.ParseIP("2001:db8::1")})
	case q.Qtype == dns.TypeMX:
		m.Answer = append(m.Answer, &dns.MX{Hdr: dns.RR_Header{Name: dns.Fqdn(cur), Rrtype: dns.TypeMX, Class: dns.ClassINET, Ttl: 60}, Preference: 10, Mx: dns.Fqdn("mail." + cur)})
		for _, a := range addrs {
			m.Extra = append(m.Extra, &dns.A{Hdr: dns.RR_Header{Name: dns.Fqdn("mail." + cur), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(a)})
		}
	}
	w.WriteMsg(m)
}

// testLogger logs to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
