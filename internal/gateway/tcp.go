package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// flow is one open TCP connection of the guest.
type flow struct {
	id     uint64             // key in Gateway.flows
	ep     tcpip.Endpoint     // the guest's side; Abort sends the guest a RST
	cancel context.CancelFunc // ends the flow's context: its dial out, its proxy

	// Under Gateway.mu:
	judged  bool        // allowed; f is what it was judged on, for SetPolicy to judge again
	f       policy.Flow //
	revoked string      // the reason a later policy gave for closing it; "" if none
}

// abort resets the guest's side and ends the flow's context, so that every
// goroutine serving the flow returns.
func (f *flow) abort() {
	f.ep.Abort()
	f.cancel()
}

// opaqueName is the Flow.Name of a flow whose name cannot be trusted
// (sniffed.opaque). No rule can match it, so such a flow is judged by the
// rules for its address and by egress, not by the names known for its
// address: a deny name entry for one of them still applies.
const opaqueName = "?"

// handleTCP judges a guest's TCP connection request. It runs in a goroutine
// of the forwarder's, which counts it as in flight until Complete.
func (g *Gateway) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	src, dst, port := addrOf(id.RemoteAddress), addrOf(id.LocalAddress), id.LocalPort
	ev := Event{Time: time.Now(), Proto: "tcp", IP: dst.String(), Port: port}
	switch {
	case src != guestAddr: // not the guest's own address: spoofed
		r.Complete(true)
		return
	case dst == gatewayAddr: // the gateway serves DNS only; no other port may reach the host
		r.Complete(true)
		g.refuse(ev, "gateway")
		return
	}
	rules := g.currentRules()
	if deny, v := rules.Precheck(dst, port, g.cache.namesFor(dst)); deny {
		r.Complete(true)
		g.refuse(ev, v.Reason)
		return
	}
	if ok, full := g.reserve(); !ok {
		r.Complete(true)
		if full {
			g.refuse(ev, "limit")
		}
		return
	}
	defer g.release()

	var wq waiter.Queue
	ep, tcpErr := r.CreateEndpoint(&wq)
	if tcpErr != nil { // the handshake failed: the guest gave up
		r.Complete(true)
		return
	}
	r.Complete(false)
	conn := gonet.NewTCPConn(&wq, ep)
	defer conn.Close()
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	fl := &flow{ep: ep, cancel: cancel}
	if !g.register(fl) {
		fl.abort()
		return
	}
	defer g.unregister(fl)

	// The name is needed when the policy may judge by it, and always on
	// the web ports, where a connection must name its host: a TLS
	// ClientHello or an HTTP request head within sniffTimeout, or it is
	// refused.
	var s sniffed
	web, needsName := webPort(port), rules.NeedsName(dst, port)
	if web || needsName {
		s = sniff(conn, sniffLimit, sniffTimeout)
	}
	if web && !s.tls && !s.http {
		fl.ep.Abort()
		ev.Host = s.name
		g.refuse(ev, reasonNoHost)
		return
	}
	pf := policy.Flow{Proto: "tcp", Dst: dst, Port: port, Name: s.name, HostRequired: web}
	switch {
	case s.opaque:
		pf.Name = opaqueName
	case s.name != "" && needsName: // else the address decides, whatever the name resolves to
		pf.NameAddrs = g.cache.lookup(s.name)
		if !slices.Contains(pf.NameAddrs, dst) {
			pf.NameAddrs = g.resolveForFlow(ctx, s.name)
		}
	}
	pf.DstNames = g.cache.namesFor(dst)
	ev.Host = s.name
	v, rules := g.judge(fl, pf)
	if !v.Allow {
		fl.ep.Abort()
		g.refuse(ev, v.Reason)
		return
	}
	g.cfg.Metrics.flow("allow")
	open := ev
	open.Verdict, open.Reason, open.Phase = "allow", v.Reason, "open"
	g.event(open)

	guest := replay(conn, s.peeked)
	var err error
	switch creds := rules.Credentials(s.name); {
	case s.tls && port == 443 && len(creds) > 0, s.http && port == 80 && anyPlainHTTP(creds):
		ev.BytesOut, ev.BytesIn, err = g.intercept(ctx, pf, guest, s.tls)
	case s.http:
		ev.BytesOut, ev.BytesIn, err = g.serveHTTP(ctx, pf, guest, ev)
	default:
		ev.BytesOut, ev.BytesIn, err = g.splice(ctx, fl, guest, netip.AddrPortFrom(dst, port))
	}
	g.cfg.Metrics.carried(ev.BytesOut, ev.BytesIn)
	ev.Time, ev.Phase = time.Now(), "end"
	ev.Verdict, ev.Reason = "allow", v.Reason
	if errors.Is(err, errDial) {
		ev.Reason = "dial-error"
	}
	g.mu.Lock()
	if fl.revoked != "" {
		ev.Verdict, ev.Reason = "deny", "revoked:"+fl.revoked
	}
	g.mu.Unlock()
	g.event(ev)
}

// refuse counts and logs a flow the gateway refused. Under a flood the
// egress log gets a sample only (denyNotice), so that it keeps its history,
// and a count of the rest.
func (g *Gateway) refuse(ev Event, reason string) {
	g.cfg.Metrics.flow("deny")
	ev.Verdict, ev.Reason = "deny", reason
	g.sampled(g.denyNotice, ev)
}

// sampled writes ev to the egress log if limit allows one more now, and
// otherwise has the log count it among those it did not write.
func (g *Gateway) sampled(limit *rate.Limiter, ev Event) {
	if limit.Allow() {
		g.event(ev)
	} else if g.cfg.Events != nil {
		g.cfg.Events.Suppressed(ev)
	}
}

// reserve counts a new flow against Limits.MaxFlows and into wg. ok is
// false when the limit is reached (full) or the gateway is closing.
func (g *Gateway) reserve() (ok, full bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.closed:
		return false, false
	case g.open >= g.cfg.Limits.MaxFlows:
		return false, true
	}
	g.open++
	g.wg.Add(1)
	return true, false
}

func (g *Gateway) release() {
	g.mu.Lock()
	g.open--
	g.mu.Unlock()
	g.wg.Done()
}

// register makes fl one of the open flows, which Close and SetPolicy end;
// false if the gateway is closing.
func (g *Gateway) register(fl *flow) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.nextFlow++
	g.flows[g.nextFlow] = fl
	fl.id = g.nextFlow
	return true
}

func (g *Gateway) unregister(fl *flow) {
	g.mu.Lock()
	delete(g.flows, fl.id)
	g.mu.Unlock()
}

// judge decides pf with the rules in force and, if allowed, records it on
// fl for SetPolicy. The record is made under mu with the same rules still
// in force, so that a policy swapped in meanwhile either judges fl again
// (rejudge) or is the one that decides here.
func (g *Gateway) judge(fl *flow, pf policy.Flow) (policy.Verdict, *policy.Rules) {
	for {
		r := g.currentRules()
		v := r.Decide(pf)
		g.mu.Lock()
		if g.rules.Load() == r {
			if v.Allow {
				fl.judged, fl.f = true, pf
			}
			g.mu.Unlock()
			return v, r
		}
		g.mu.Unlock()
	}
}

// rejudge judges every open flow again with the rules in force and closes
// (RST) those they deny.
func (g *Gateway) rejudge() {
	g.mu.Lock()
	r := g.rules.Load()
	var doomed []*flow
	for _, fl := range g.flows {
		if !fl.judged || fl.revoked != "" {
			continue
		}
		if v := r.Decide(fl.f); !v.Allow {
			fl.revoked = v.Reason
			doomed = append(doomed, fl)
		}
	}
	g.mu.Unlock()
	for _, fl := range doomed {
		fl.abort()
	}
}

// errDial marks a flow whose connection out could not be made.
var errDial = errors.New("dial out")

// splice connects the guest's flow to addr from the host and copies both
// ways until both have ended, or either fails; it returns the bytes the
// guest sent and received. A half-close on one side is passed on to the
// other.
func (g *Gateway) splice(ctx context.Context, fl *flow, guest net.Conn, addr netip.AddrPort) (out, in int64, err error) {
	up, err := g.dialHost(ctx, addr)
	if err != nil {
		fl.ep.Abort()
		return 0, 0, fmt.Errorf("%w: %w", errDial, err)
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()

	// Either direction failing ends both: the upstream closed, the guest
	// reset.
	fail := func() {
		up.Close()
		fl.ep.Abort()
	}
	outc := make(chan int64, 1)
	go func() {
		n, err := io.Copy(up, guest)
		if err != nil {
			fail()
		} else {
			closeWrite(up)
		}
		outc <- n
	}()
	in, err = io.Copy(guest, up)
	if err != nil {
		fail()
	} else {
		closeWrite(guest)
	}
	return <-outc, in, nil
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// dialTCP connects from the host to addr. The address is checked again
// just before connect: the gateway never opens a connection into the
// always-denied set that the policy does not open literally.
func (g *Gateway) dialTCP(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{
		Timeout: dialTimeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if g.alwaysDenied(g.rules.Load(), ap.Addr().Unmap(), ap.Port()) {
				return fmt.Errorf("%s is always denied: %w", address, errdefs.ErrPermission)
			}
			return nil
		},
	}
	return d.DialContext(ctx, "tcp4", addr.String())
}

// intercept serves an allowed flow to a host with credential rules through
// the credential-injecting proxy. pf is what the flow was judged on; every
// request is judged on it again, with the rules then in force.
func (g *Gateway) intercept(ctx context.Context, pf policy.Flow, guest net.Conn, isTLS bool) (out, in int64, err error) {
	p, err := mitm.New(mitm.Config{
		CA:      g.cfg.CA,
		RootCAs: g.cfg.RootCAs,
		Dial:    g.dialName,
		Judge: func(host string) mitm.Verdict {
			inj, ok := g.injections(ctx, pf, host, isTLS)
			return mitm.Verdict{Allowed: ok, Inject: inj, Credentialed: true}
		},
		Log: g.log,
	})
	if err != nil {
		guest.Close()
		return 0, 0, err
	}
	out, in, err = p.Serve(ctx, mitm.Conn{Guest: guest, Host: pf.Name, Port: pf.Port, TLS: isTLS})
	if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrPermission) {
		g.log.Debug("gateway: credential proxy", "host", pf.Name, "err", err)
	}
	return out, in, err
}

// reasonNoHost is the egress log's reason for a connection to a web port
// that named no host in its first bytes in time.
const reasonNoHost = "no-host"

// webPort reports whether port is one where a connection must name its
// host in its first bytes: 80 and 443.
func webPort(port uint16) bool { return port == 80 || port == 443 }

// serveHTTP serves an allowed plain HTTP flow request by request, to the
// address the guest dialed: each request must pass the policy by its own
// Host (a pipelined or kept-alive one too), or the gateway answers it 403
// and closes the connection. pf is what the flow was judged on; ev is its
// log entry, for the requests refused.
func (g *Gateway) serveHTTP(ctx context.Context, pf policy.Flow, guest net.Conn, ev Event) (out, in int64, err error) {
	dst := netip.AddrPortFrom(pf.Dst, pf.Port)
	p, err := mitm.New(mitm.Config{
		Dial: func(ctx context.Context, _ string, _ uint16) (net.Conn, error) {
			return g.dialHost(ctx, dst)
		},
		Judge: func(host string) mitm.Verdict {
			return g.judgeRequest(ctx, pf, host, ev)
		},
		Log: g.log,
	})
	if err != nil {
		guest.Close()
		return 0, 0, err
	}
	out, in, err = p.Serve(ctx, mitm.Conn{Guest: guest, Host: pf.Name, Port: pf.Port, PerRequest: true})
	if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrPermission) {
		g.log.Debug("gateway: http", "host", pf.Name, "err", err)
	}
	return out, in, err
}

// judgeRequest judges one request on the plain HTTP flow pf by its own
// host, with the rules in force: the flow with the request's host as its
// name. A host with plain-HTTP credentials is refused on a connection
// opened for another host: its requests get their secrets only on a
// connection of their own, dialed by its name.
func (g *Gateway) judgeRequest(ctx context.Context, pf policy.Flow, host string, ev Event) mitm.Verdict {
	f := pf
	f.Name, f.NameAddrs = normalizeName(host), nil
	r := g.currentRules()
	if f.Name != "" && r.NeedsName(f.Dst, f.Port) { // else the address decides, whatever the name resolves to
		f.NameAddrs = g.cache.lookup(f.Name)
		if !slices.Contains(f.NameAddrs, f.Dst) {
			f.NameAddrs = g.resolveForFlow(ctx, f.Name)
		}
	}
	creds := r.Credentials(f.Name)
	v := r.Decide(f)
	if v.Allow && f.Name != pf.Name && anyPlainHTTP(creds) {
		v = policy.Verdict{Reason: "credential-host"}
	}
	if !v.Allow {
		ev.Host = f.Name
		g.refuse(ev, v.Reason)
	}
	return mitm.Verdict{Allowed: v.Allow, Credentialed: len(creds) > 0}
}

// anyPlainHTTP reports whether a credential rule of creds is for plain
// HTTP too: only then is a plain HTTP flow to their host intercepted.
func anyPlainHTTP(creds []policy.Credential) bool {
	return slices.ContainsFunc(creds, func(c policy.Credential) bool { return c.PlainHTTP })
}

// injections says what the proxy sets on a request to host on the flow pf:
// the credential headers of the rules in force, with their secrets' values;
// on plain HTTP (isTLS false) only those of rules with PlainHTTP. It fails
// closed: a flow the rules now deny, a host other than the one judged, or a
// secret that cannot be read refuses the request.
func (g *Gateway) injections(ctx context.Context, pf policy.Flow, host string, isTLS bool) ([]mitm.Injection, bool) {
	if normalizeName(host) != pf.Name {
		return nil, false
	}
	r := g.currentRules()
	if v := r.Decide(pf); !v.Allow {
		return nil, false
	}
	creds := r.Credentials(pf.Name)
	if !isTLS {
		creds = slices.DeleteFunc(creds, func(c policy.Credential) bool { return !c.PlainHTTP })
	}
	if len(creds) > 0 && g.cfg.Secret == nil {
		g.log.Warn("gateway: no secret store; request with credentials refused", "host", pf.Name)
		return nil, false
	}
	inj := make([]mitm.Injection, 0, len(creds))
	for _, c := range creds {
		val, err := g.cfg.Secret(ctx, c.Secret)
		if err != nil {
			g.log.Warn("gateway: secret unavailable; request refused", "host", pf.Name, "secret", c.Secret, "err", err)
			return nil, false
		}
		inj = append(inj, mitm.Injection{Header: c.Header, Value: strings.ReplaceAll(c.Format, "{}", val)})
	}
	return inj, true
}

// dialName connects from the host to name:port for the proxy, by the
// addresses the gateway resolved for name, trying only those the rules in
// force allow for the name.
func (g *Gateway) dialName(ctx context.Context, name string, port uint16) (net.Conn, error) {
	name = normalizeName(name)
	addrs := g.cache.lookup(name)
	if len(addrs) == 0 {
		var err error
		if addrs, err = g.lookupA(ctx, name); err != nil {
			return nil, err
		}
	}
	r := g.rules.Load()
	var errs []error
	for _, a := range addrs {
		f := policy.Flow{Proto: "tcp", Dst: a, Port: port, Name: name, NameAddrs: addrs}
		if v := r.Decide(f); !v.Allow {
			errs = append(errs, fmt.Errorf("%s: %s: %w", a, v.Reason, errdefs.ErrPermission))
			continue
		}
		c, err := g.dialHost(ctx, netip.AddrPortFrom(a, port))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("dial %s: no address: %w", name, errdefs.ErrNotFound)
	}
	return nil, fmt.Errorf("dial %s:%d: %w", name, port, errors.Join(errs...))
}

// addrOf converts a stack address to a netip.Addr (IPv4 as such).
func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}
