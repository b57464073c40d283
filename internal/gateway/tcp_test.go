package gateway

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// echoServer listens on 127.0.0.1 and echoes what it reads on every
// connection until the client half-closes; it returns its address.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes msg on c and reads as much back.
func roundTrip(c net.Conn, msg string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func isRefused(err error) bool { return err != nil && strings.Contains(err.Error(), "refused") }

// The guest cannot dial the host's loopback (neither its stack nor the
// gateway's routes 127/8 over a NIC), so upstream servers listen on
// 127.0.0.1 and the tests redirect the host-side dial of a public test
// address to them.

func TestTCPAllowedByLiteralIP(t *testing.T) {
	public := netip.MustParseAddrPort("203.0.113.10:7000")
	n := newTestNet(t, policy.Policy{Allow: []string{public.String()}}, netOptions{
		redirect: map[netip.AddrPort]string{public: echoServer(t)},
	})
	c, err := n.dial(public.String())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, "hello through the gateway"); err != nil || got != "hello through the gateway" {
		t.Fatalf("echo %q, %v", got, err)
	}
	// A half-close reaches the upstream, whose echo loop then ends and
	// closes: the guest reads EOF.
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
		t.Fatalf("after half-close: %q, %v", rest, err)
	}
	c.Close()
	e := n.waitEvent(t, func(e Event) bool { return e.Proto == "tcp" && e.Verdict == "allow" && e.Phase == "end" })
	if e.IP != public.Addr().String() || e.Port != public.Port() || e.Reason != "allow-rule" || e.BytesOut != 25 || e.BytesIn != 25 {
		t.Errorf("event %+v", e)
	}
}

func TestTCPRefusedAtSYN(t *testing.T) {
	n := newTestNet(t, policy.Policy{Allow: []string{"10.9.9.9:22", "ok.test:443"}}, netOptions{})
	tests := []struct {
		name, addr, reason string
	}{
		{"default deny", "203.0.113.1:80", "default-deny"},
		{"gateway port 22", GatewayIP + ":22", "gateway"},
		{"gateway port 80", GatewayIP + ":80", "gateway"},
		{"private address on a port not opened", "10.9.9.9:23", "always-denied"},
		{"private address under a name rule", "10.1.2.3:443", "always-denied"},
		{"cloud metadata", "169.254.169.254:80", "always-denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := n.dial(tt.addr)
			if !isRefused(err) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("dial %s: %v, want connection refused", tt.addr, err)
			}
			dst := netip.MustParseAddrPort(tt.addr)
			n.waitEvent(t, func(e Event) bool {
				return e.Proto == "tcp" && e.IP == dst.Addr().String() && e.Port == dst.Port() && e.Verdict == "deny" && e.Reason == tt.reason
			})
		})
	}
}

// The host-side dial checks the address again just before connect: no
// policy opens loopback, not even one that names the address literally
// (as a policy stored before such entries were refused may).
func TestDialTCPRechecks(t *testing.T) {
	echo := echoServer(t)
	ap := netip.MustParseAddrPort(echo)
	n := newTestNet(t, policy.Policy{Allow: []string{"203.0.113.1"}}, netOptions{})
	ctx := t.Context()
	for _, p := range []policy.Policy{{Allow: []string{"203.0.113.1"}}, {Egress: "allow", Allow: []string{echo, "127.0.0.0/8"}}} {
		if err := n.gw.SetPolicy(p); err != nil {
			t.Fatal(err)
		}
		c, err := n.gw.dialTCP(ctx, ap)
		if err == nil {
			c.Close()
			t.Fatalf("dialed %s, which is always denied, under %+v", echo, p)
		}
		if !errors.Is(err, errdefs.ErrPermission) {
			t.Fatalf("dial %s: %v, want ErrPermission", echo, err)
		}
	}
}

// tlsServer serves HTTPS on 127.0.0.1 with a certificate for name from a
// CA of its own, and returns its address and a pool trusting that CA.
func tlsServer(t *testing.T, name string, h http.Handler) (string, *x509.CertPool) {
	t.Helper()
	ca, err := mitm.NewCA("upstream test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	return srv.Listener.Addr().String(), pool
}

func hostHandler(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "host=%s auth=%s", r.Host, r.Header.Get("Authorization"))
}

// httpsGet runs one GET over TLS with SNI name on c.
func httpsGet(c net.Conn, name string, roots *x509.CertPool) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: roots})
	defer tc.Close()
	return httpGet(tc, name)
}

// httpGet runs one GET with Host name on c and returns the body.
func httpGet(c net.Conn, name string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req, _ := http.NewRequest("GET", "http://"+name+"/", nil)
	req.Close = true
	if err := req.Write(c); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(body), fmt.Errorf("status %s", resp.Status)
	}
	return string(body), err
}

// isReset reports whether err is what the guest sees when the gateway
// aborts a flow it had accepted.
func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "aborted") || errors.Is(err, io.EOF))
}

func TestSNI(t *testing.T) {
	upstream, roots := tlsServer(t, "sni.test", http.HandlerFunc(hostHandler))
	public := netip.MustParseAddrPort("203.0.113.7:443")
	n := newTestNet(t, policy.Policy{Allow: []string{"sni.test"}}, netOptions{
		redirect: map[netip.AddrPort]string{public: upstream},
	})
	n.dns.set("sni.test", public.Addr().String())
	n.dns.set("other.test", "203.0.113.99")

	t.Run("allowed name to the address the gateway resolved", func(t *testing.T) {
		if got := n.resolveA("sni.test"); got != public.Addr() {
			t.Fatalf("resolved %v", got)
		}
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		body, err := httpsGet(c, "sni.test", roots)
		if err != nil || body != "host=sni.test auth=" {
			t.Fatalf("GET: %q, %v", body, err)
		}
		n.waitEvent(t, func(e Event) bool {
			return e.Proto == "tcp" && e.Host == "sni.test" && e.Verdict == "allow" && e.BytesIn > 0
		})
	})
	t.Run("other name to the same address", func(t *testing.T) {
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err) // accepted: the name decides
		}
		defer c.Close()
		if _, err := httpsGet(c, "other.test", nil); !isReset(err) {
			t.Fatalf("GET: %v, want reset", err)
		}
		n.waitEvent(t, func(e Event) bool {
			return e.Host == "other.test" && e.Verdict == "deny" && e.Reason == "default-deny"
		})
	})
	t.Run("allowed name to an address not resolved for it", func(t *testing.T) {
		c, err := n.dial("203.0.113.99:443")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := httpsGet(c, "sni.test", nil); !isReset(err) {
			t.Fatalf("GET: %v, want reset", err)
		}
		n.waitEvent(t, func(e Event) bool {
			return e.Host == "sni.test" && e.IP == "203.0.113.99" && e.Verdict == "deny" && e.Reason == "not-resolved"
		})
	})
	t.Run("no SNI to the address of an allowed name", func(t *testing.T) {
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// On 443 a connection must name its host: the names the gateway
		// resolved to the address (sni.test, allowed) do not admit one
		// that names none, whatever Host it sends inside.
		c.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		_, err = httpGet(tc, "sni.test")
		tc.Close()
		if !isReset(err) {
			t.Fatalf("GET: %v, want reset", err)
		}
		n.waitEvent(t, func(e Event) bool {
			return e.Host == "" && e.IP == public.Addr().String() && e.Verdict == "deny" && e.Reason == "default-deny"
		})
	})
	t.Run("no SNI to another address", func(t *testing.T) {
		c, err := n.dial("203.0.113.98:443")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); !isReset(err) {
			t.Fatalf("handshake: %v, want reset", err)
		}
		n.waitEvent(t, func(e Event) bool { return e.IP == "203.0.113.98" && e.Verdict == "deny" && e.Reason == "default-deny" })
	})
}

func TestHTTPHost(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(hostHandler))
	t.Cleanup(srv.Close)
	public := netip.MustParseAddrPort("203.0.113.8:80")
	n := newTestNet(t, policy.Policy{Allow: []string{"web.test"}}, netOptions{
		redirect: map[netip.AddrPort]string{public: srv.Listener.Addr().String()},
	})
	n.dns.set("web.test", public.Addr().String())

	tests := []struct {
		name, host, reason string
		allow              bool
	}{
		// No DNS query first: the gateway resolves the Host itself.
		{"allowed host", "web.test", "allow-rule", true},
		{"allowed host with a port", "web.test:80", "allow-rule", true},
		{"other host", "evil.test", "default-deny", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := n.dial(public.String())
			if err != nil {
				t.Fatal(err)
			}
			body, err := httpGet(c, tt.host)
			c.Close()
			if tt.allow && (err != nil || body != "host="+tt.host+" auth=") {
				t.Fatalf("GET: %q, %v", body, err)
			}
			if !tt.allow && !isReset(err) {
				t.Fatalf("GET: %q, %v, want reset", body, err)
			}
			name := strings.TrimSuffix(tt.host, ":80")
			n.waitEvent(t, func(e Event) bool {
				return e.Host == name && e.Reason == tt.reason && (e.Verdict == "allow") == tt.allow
			})
		})
	}
	if got := n.dns.count("evil.test", 1); got != 0 {
		t.Errorf("the gateway resolved a name the policy denies %d times", got)
	}
}

// A flow whose first bytes carry no name is judged without one once the
// sniff gives up.
func TestSniffTimeout(t *testing.T) {
	n := newTestNet(t, policy.Policy{Allow: []string{"web.test"}}, netOptions{})
	c, err := n.dial("203.0.113.8:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1)) // a server-first protocol: the guest waits
	if !isReset(err) {
		t.Fatalf("read: %v, want reset", err)
	}
	if d := time.Since(start); d < sniffTimeout/2 || d > 3*sniffTimeout {
		t.Errorf("reset after %v, want about %v", d, sniffTimeout)
	}
}

func TestSetPolicyClosesForbiddenFlows(t *testing.T) {
	kept := netip.MustParseAddrPort("203.0.113.11:7000")
	revoked := netip.MustParseAddrPort("203.0.113.12:7000")
	echo := echoServer(t)
	n := newTestNet(t, policy.Policy{Allow: []string{kept.String(), revoked.String()}}, netOptions{
		redirect: map[netip.AddrPort]string{kept: echo, revoked: echo},
	})
	ck, err := n.dial(kept.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cr, err := n.dial(revoked.String())
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Close()
	for _, c := range []net.Conn{ck, cr} {
		if _, err := roundTrip(c, "before"); err != nil {
			t.Fatal(err)
		}
	}

	next := policy.Policy{Allow: []string{kept.String()}, Deny: []string{"evil.test"}}
	if err := n.gw.SetPolicy(next); err != nil {
		t.Fatal(err)
	}
	if got := n.gw.Policy(); len(got.Allow) != 1 || got.Allow[0] != kept.String() || got.Egress != "deny" {
		t.Errorf("Policy() = %+v", got)
	}
	start := time.Now()
	cr.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := cr.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("revoked flow: read %v, want reset", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("revoked flow closed after %v", d)
	}
	if _, err := roundTrip(ck, "after"); err != nil {
		t.Fatalf("kept flow: %v", err)
	}
	n.waitEvent(t, func(e Event) bool {
		return e.IP == revoked.Addr().String() && e.Verdict == "deny" && e.Reason == "revoked:default-deny" && e.BytesOut == 6
	})
	if _, err := n.dial(revoked.String()); !isRefused(err) {
		t.Errorf("new flow after the change: %v, want refused", err)
	}

	bad := policy.Policy{Allow: []string{"10.0.0.0/33"}}
	if err := n.gw.SetPolicy(bad); err == nil {
		t.Error("SetPolicy took an invalid policy")
	}
	if err := n.gw.SetPolicy(policy.Policy{Credentials: []policy.Credential{{Host: "api.test", Header: "Authorization", Secret: "s"}}}); err == nil {
		t.Error("SetPolicy took credentials without a CA")
	}
	if got := n.gw.Policy(); len(got.Allow) != 1 {
		t.Errorf("a refused policy changed the policy in force: %+v", got)
	}
}

func TestMaxFlows(t *testing.T) {
	public := netip.MustParseAddrPort("203.0.113.13:7000")
	n := newTestNet(t, policy.Policy{Allow: []string{public.String()}}, netOptions{
		limits:   Limits{MaxFlows: 2},
		redirect: map[netip.AddrPort]string{public: echoServer(t)},
	})
	var open []net.Conn
	for range 2 {
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := roundTrip(c, "x"); err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	if c, err := n.dial(public.String()); !isRefused(err) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("third flow: %v, want refused", err)
	}
	n.waitEvent(t, func(e Event) bool { return e.Verdict == "deny" && e.Reason == "limit" })
	open[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := n.dial(public.String())
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no flow after one closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	open[1].Close()
}

func TestUDPDropped(t *testing.T) {
	n := newTestNet(t, policy.Policy{Egress: "allow"}, netOptions{})
	c, err := gonet.DialUDP(n.guest, nil, &tcpip.FullAddress{NIC: 1, Addr: stackAddr("8.8.8.8"), Port: 53}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	co := &dns.Conn{Conn: c}
	if err := co.WriteMsg(new(dns.Msg).SetQuestion("example.com.", dns.TypeA)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if m, err := co.ReadMsg(); err == nil {
		t.Fatalf("UDP to 8.8.8.8 was answered: %v", m)
	}
	n.waitEvent(t, func(e Event) bool {
		return e.Proto == "udp" && e.IP == "8.8.8.8" && e.Port == 53 && e.Verdict == "deny" && e.Reason == "udp"
	})
}

// The host's own addresses are always denied, even under egress allow and
// a CIDR that covers them.
func TestHostAddressDenied(t *testing.T) {
	var host netip.Addr
	ifAddrs, _ := net.InterfaceAddrs()
	for _, a := range ifAddrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok && !ip.IsLoopback() && !netip.MustParsePrefix("10.0.2.0/24").Contains(ip) {
				host = ip
				break
			}
		}
	}
	if !host.IsValid() {
		t.Skip("the host has no IPv4 address besides loopback")
	}
	n := newTestNet(t, policy.Policy{Egress: "allow", Allow: []string{netip.PrefixFrom(host, 8).Masked().String()}}, netOptions{})
	addr := netip.AddrPortFrom(host, 22).String()
	if c, err := n.dial(addr); !isRefused(err) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial the host's %s: %v, want refused", addr, err)
	}
	n.waitEvent(t, func(e Event) bool { return e.IP == host.String() && e.Reason == "always-denied" })
}

// An address the host gains after the gateway started is denied from then
// on, and open flows to it are closed.
func TestHostAddressAdded(t *testing.T) {
	public := netip.MustParseAddrPort("203.0.113.40:7000")
	var mu sync.Mutex // guards hostIPs
	var hostIPs []net.Addr
	n := newTestNet(t, policy.Policy{Egress: "allow"}, netOptions{
		redirect: map[netip.AddrPort]string{public: echoServer(t)},
		hostAddrs: func() ([]net.Addr, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(hostIPs), nil
		},
	})
	c, err := n.dial(public.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := roundTrip(c, "x"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	hostIPs = append(hostIPs, &net.IPNet{IP: net.IP(public.Addr().AsSlice()), Mask: net.CIDRMask(24, 32)})
	mu.Unlock()
	time.Sleep(20 * time.Millisecond) // past the addresses' TTL
	if c2, err := n.dial(public.String()); !isRefused(err) {
		if c2 != nil {
			c2.Close()
		}
		t.Fatalf("dial the host's new address: %v, want refused", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("open flow to the host's new address: %v, want reset", err)
	}
}

// A bulk transfer through a spliced flow arrives whole, both ways.
func TestTCPBulk(t *testing.T) {
	public := netip.MustParseAddrPort("203.0.113.10:7000")
	n := newTestNet(t, policy.Policy{Allow: []string{public.String()}}, netOptions{
		redirect: map[netip.AddrPort]string{public: echoServer(t)},
	})
	c, err := n.dial(public.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 4 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		c.CloseWrite()
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d of %d bytes, %v", len(got), size, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	c.Close()
	n.waitEvent(t, func(e Event) bool { return e.Verdict == "allow" && e.BytesOut == size && e.BytesIn == size })
}

// A request that names its host twice gets no benefit of the names the
// gateway knows for the address it dialed, and a deny entry for one of
// them still applies.
func TestOpaqueNames(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(hostHandler))
	t.Cleanup(srv.Close)
	public := netip.MustParseAddrPort("203.0.113.50:80")
	n := newTestNet(t, policy.Policy{Allow: []string{"*.cdn.test"}}, netOptions{
		redirect: map[netip.AddrPort]string{public: srv.Listener.Addr().String()},
	})
	n.dns.set("a.cdn.test", public.Addr().String())
	n.resolveA("a.cdn.test")
	for _, req := range []string{
		"GET / HTTP/1.1\r\nHost: a.cdn.test\r\nHost: evil.test\r\n\r\n",
		"GET http://a.cdn.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	} {
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, req)
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if !isReset(err) {
			t.Fatalf("%q: read %v, want reset", req, err)
		}
	}
	n.waitEvent(t, func(e Event) bool { return e.Verdict == "deny" && e.Reason == "default-deny" && e.Host == "" })

	// Without a name at all, on port 80: the address's names do not
	// admit it.
	c, err := n.dial(public.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Fatalf("HTTP/1.0 without a Host: read %v, want reset", err)
	}
}
