package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

const (
	upstreamTimeout = 3 * time.Second
	upstreamUDPSize = 1232 // the EDNS buffer size asked of upstreams (DNS flag day 2020)
	dnsTCPConns     = 16   // guest DNS connections served at once; more wait in the backlog
)

// dnsUpstreams returns the resolvers to ask: upstream, or the nameservers
// of the host's /etc/resolv.conf.
func dnsUpstreams(upstream string) ([]string, error) {
	if upstream != "" {
		if _, _, err := net.SplitHostPort(upstream); err != nil {
			return nil, fmt.Errorf("DNS upstream %q: want HOST:PORT: %w", upstream, errdefs.ErrInvalid)
		}
		return []string{upstream}, nil
	}
	conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return nil, fmt.Errorf("read the host's resolvers: %w", err)
	}
	var out []string
	for _, s := range conf.Servers {
		out = append(out, net.JoinHostPort(s, conf.Port))
	}
	if len(out) == 0 {
		return nil, errors.New("the host's /etc/resolv.conf names no nameserver")
	}
	return out, nil
}

// serveDNS serves the guest's DNS on the gateway's address, over UDP (pc)
// or TCP (ln), until the connection is closed. It returns once every query
// it took has been answered.
func (g *Gateway) serveDNS(pc net.PacketConn, ln net.Listener) {
	srv := &dns.Server{PacketConn: pc, Listener: ln, Handler: dns.HandlerFunc(g.answer)}
	if err := srv.ActivateAndServe(); err != nil && g.ctx.Err() == nil {
		g.log.Warn("gateway: DNS server stopped", "err", err)
	}
}

// answer answers one DNS query of the guest. A name the policy does not
// allow gets NXDOMAIN and is never sent upstream; IPv6 and ECH records are
// never given; addresses in the always-denied set that the policy does not
// open are dropped from answers. Every query is logged.
func (g *Gateway) answer(w dns.ResponseWriter, req *dns.Msg) {
	ev := Event{Time: time.Now(), Proto: "dns", Port: 53}
	if !g.dnsLimit.Allow() {
		writeRcode(w, req, dns.RcodeRefused)
		g.cfg.Metrics.query("deny")
		ev.Verdict, ev.Reason = "deny", "rate-limit"
		if g.dnsNotice.Allow() {
			g.log.Warn("gateway: guest DNS queries over the rate limit are refused", "per_second", g.cfg.Limits.DNSPerSecond)
			g.event(ev)
		} else if g.cfg.Events != nil {
			g.cfg.Events.Suppressed(ev)
		}
		return
	}
	switch {
	case req.Response || req.Opcode != dns.OpcodeQuery:
		writeRcode(w, req, dns.RcodeNotImplemented)
		return
	case len(req.Question) != 1:
		writeRcode(w, req, dns.RcodeFormatError)
		return
	}
	q := req.Question[0]
	ev.Host = dnsName(q.Name)
	deny := func(rcode int, reason string) {
		writeRcode(w, req, rcode)
		g.cfg.Metrics.query("deny")
		ev.Verdict, ev.Reason = "deny", reason
		g.sampled(g.denyNotice, ev)
	}
	if q.Qclass != dns.ClassINET {
		deny(dns.RcodeRefused, "class")
		return
	}
	r := g.currentRules()
	v := r.AllowName(ev.Host)
	if !v.Allow {
		deny(dns.RcodeNameError, v.Reason)
		return
	}
	g.cfg.Metrics.query("allow")
	ev.Verdict, ev.Reason = "allow", v.Reason
	defer func() { g.event(ev) }()

	switch q.Qtype {
	case dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeANY:
		// No IPv6, and no HTTPS records: they carry ECH configurations.
		m := new(dns.Msg).SetReply(req)
		m.RecursionAvailable = true
		w.WriteMsg(m)
		return
	}
	resp, addrs, err := g.resolve(g.ctx, r, ev.Host, q.Qtype)
	if err != nil {
		g.log.Debug("gateway: DNS upstream", "name", ev.Host, "err", err)
		writeRcode(w, req, dns.RcodeServerFailure)
		ev.Reason = "upstream-error"
		return
	}
	if len(addrs) > 0 {
		ev.IP = addrs[0].String()
	}
	resp.Id = req.Id
	resp.Question = req.Question // the guest's spelling: some resolvers check its case
	resp.Extra = dropOPT(resp.Extra)
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
		resp.SetEdns0(uint16(min(size, dns.DefaultMsgSize)), false)
	}
	if _, overTCP := w.LocalAddr().(*net.TCPAddr); overTCP {
		size = dns.MaxMsgSize
	}
	resp.Truncate(size)
	w.WriteMsg(resp)
}

func writeRcode(w dns.ResponseWriter, req *dns.Msg, rcode int) {
	m := new(dns.Msg).SetRcode(req, rcode)
	m.RecursionAvailable = true
	w.WriteMsg(m)
}

// dnsName is a query name as the policy and the cache know it: lower case,
// no trailing dot.
func dnsName(s string) string { return strings.TrimRight(strings.ToLower(s), ".") }

func dropOPT(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if _, ok := rr.(*dns.OPT); !ok {
			out = append(out, rr)
		}
	}
	return out
}

// resolve asks the upstreams for name's records of qtype and filters the
// answer (see filterAnswer). For an A query the addresses the name ends at
// (through its CNAMEs) are cached and returned.
func (g *Gateway) resolve(ctx context.Context, r *policy.Rules, name string, qtype uint16) (*dns.Msg, []netip.Addr, error) {
	resp, err := g.exchange(ctx, name, qtype)
	if err != nil {
		return nil, nil, err
	}
	g.filterAnswer(r, resp)
	if qtype != dns.TypeA || resp.Rcode != dns.RcodeSuccess {
		return resp, nil, nil
	}
	addrs, ttl := chainAddrs(resp, name)
	g.cache.add(name, addrs, ttl)
	return resp, addrs, nil
}

// lookupA resolves name's IPv4 addresses through the upstreams, as the
// guest's A query would.
func (g *Gateway) lookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	resp, addrs, err := g.resolve(ctx, g.rules.Load(), name, dns.TypeA)
	if err != nil {
		return nil, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("resolve %s: %s: %w", name, dns.RcodeToString[resp.Rcode], errdefs.ErrNotFound)
	}
	return addrs, nil
}

// resolveForFlow resolves the name a TCP flow carries, for Flow.NameAddrs.
// The name comes from the guest, so it is sent upstream only if a DNS query
// for it would be: the SNI is no way around the DNS policy.
func (g *Gateway) resolveForFlow(ctx context.Context, name string) []netip.Addr {
	if !g.currentRules().AllowName(name).Allow || !g.dnsLimit.Allow() {
		return nil
	}
	addrs, err := g.lookupA(ctx, name)
	if err != nil {
		g.log.Debug("gateway: resolve flow name", "name", name, "err", err)
	}
	return addrs
}

// exchange sends one query to the upstreams in turn, over UDP and again
// over TCP when the answer is truncated, and returns the first answer.
func (g *Gateway) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	if len(g.upstreams) == 0 {
		return nil, fmt.Errorf("no DNS upstream: %w", errdefs.ErrUnavailable)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(upstreamUDPSize, false)
	var errs []error
	for _, up := range g.upstreams {
		resp, err := exchangeOne(ctx, m, up)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("ask upstream for %s: %w", name, errors.Join(errs...))
}

func exchangeOne(ctx context.Context, m *dns.Msg, upstream string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, upstreamTimeout)
	defer cancel()
	c := &dns.Client{Net: "udp", Timeout: upstreamTimeout, UDPSize: upstreamUDPSize}
	resp, _, err := c.ExchangeContext(ctx, m, upstream)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, m, upstream)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", upstream, err)
	}
	return resp, nil
}

// filterAnswer drops from every section of m the records the guest must
// not get: AAAA (the guest has no IPv6), HTTPS and SVCB (ECH
// configurations), and A records in the always-denied set that r does not
// open literally.
func (g *Gateway) filterAnswer(r *policy.Rules, m *dns.Msg) {
	keep := func(rrs []dns.RR) []dns.RR {
		out := rrs[:0]
		for _, rr := range rrs {
			switch rr := rr.(type) {
			case *dns.AAAA, *dns.HTTPS, *dns.SVCB:
				continue
			case *dns.A:
				a, ok := netip.AddrFromSlice(rr.A.To4())
				if !ok || g.alwaysDenied(r, a, 0) {
					continue
				}
			}
			out = append(out, rr)
		}
		return out
	}
	m.Answer = keep(m.Answer)
	m.Ns = keep(m.Ns)
	m.Extra = keep(m.Extra)
}

// chainAddrs follows name's CNAMEs in the answer of m and returns the A
// addresses it ends at and the lowest TTL along the way.
func chainAddrs(m *dns.Msg, name string) ([]netip.Addr, time.Duration) {
	var addrs []netip.Addr
	ttl := uint32(math.MaxUint32)
	cur := name
	for range resolveChains + 1 {
		next := ""
		for _, rr := range m.Answer {
			h := rr.Header()
			if dnsName(h.Name) != cur {
				continue
			}
			switch rr := rr.(type) {
			case *dns.A:
				if a, ok := netip.AddrFromSlice(rr.A.To4()); ok {
					addrs = append(addrs, a)
					ttl = min(ttl, h.Ttl)
				}
			case *dns.CNAME:
				next = dnsName(rr.Target)
				ttl = min(ttl, h.Ttl)
			}
		}
		if len(addrs) > 0 || next == "" {
			break
		}
		cur = next
	}
	return addrs, time.Duration(ttl) * time.Second
}

// limitListener serves at most n connections at once: Accept waits for one
// to close, and meanwhile new connections wait in the stack's backlog (and
// past it, their SYNs are dropped), so a guest cannot make the gateway hold
// an unbounded number of DNS connections.
type limitListener struct {
	net.Listener
	slots  chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its slot back when it is closed, once.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
