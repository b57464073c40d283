package oci

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/net/publicsuffix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// A pull is asked for by a tenant, runs on the host, and talks to a
// registry the tenant may control. Every request it makes goes through
// registryGuard, which holds it to these rules:
//
//   - A request the pull makes of itself (the registry's API, its token
//     realm) goes only to the registry's own host, another host of the
//     same site (auth.docker.io for registry-1.docker.io), or a registry
//     the operator trusts. A realm elsewhere would receive the
//     credentials.
//   - A redirect may go to any host, as registries send layers from a
//     CDN; the HTTP client sends no credentials across hosts, and a
//     layer is checked against its digest.
//   - No connection goes to a loopback, private, link-local or other
//     special-purpose address, whatever name led there (the address is
//     checked as it is dialled, after resolution), unless the operator
//     named that host in the trusted registries: a registry on the
//     host's loopback or on the operator's network is one the operator
//     chose.
//   - Plain HTTP goes only to loopback, unless PullOptions.Insecure.
type registryGuard struct {
	next     http.RoundTripper
	registry string // the reference's registry, host[:port], lowercase
	trusted  []trustedHost
	insecure bool
}

// trustedHost is an operator-trusted registry: a host, and a port if the
// entry named one.
type trustedHost struct{ host, port string }

// newRegistryGuard returns the guarded transport for a pull from reg.
func newRegistryGuard(reg name.Registry, trusted []string, insecure bool) *registryGuard {
	g := &registryGuard{registry: strings.ToLower(reg.RegistryStr()), insecure: insecure}
	for _, t := range trusted {
		if tr, err := name.NewRegistry(t); err == nil {
			g.trusted = append(g.trusted, splitTrusted(tr.RegistryStr()))
		}
	}
	// A proxy from the environment is the operator's: connections to it
	// are let through.
	for _, v := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"} {
		if u, err := url.Parse(os.Getenv(v)); err == nil && u.Host != "" {
			port := u.Port()
			if port == "" {
				port = map[string]string{"https": "443"}[u.Scheme]
				if port == "" {
					port = "80"
				}
			}
			g.trusted = append(g.trusted, trustedHost{strings.ToLower(u.Hostname()), port})
		}
	}
	base := remote.DefaultTransport.(*http.Transport).Clone()
	base.DialContext = g.dial
	g.next = base
	return g
}

func splitTrusted(hostport string) trustedHost {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return trustedHost{strings.ToLower(strings.Trim(h, "[]")), p}
	}
	return trustedHost{strings.ToLower(strings.Trim(hostport, "[]")), ""}
}

// isTrusted reports whether the operator trusts host (a hostname or
// address, no brackets) on port.
func (g *registryGuard) isTrusted(host, port string) bool {
	host = strings.ToLower(host)
	for _, t := range g.trusted {
		if t.host == host && (t.port == "" || t.port == port) {
			return true
		}
	}
	return false
}

func (g *registryGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := g.check(req); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return g.next.RoundTrip(req)
}

// check applies the rules on the request's URL; the dialler applies the
// rule on addresses.
func (g *registryGuard) check(req *http.Request) error {
	u := req.URL
	if u.Scheme == "http" && !g.insecure && !isLoopback(u.Host) {
		return fmt.Errorf("plain HTTP to %s is refused; allow insecure registries to use it: %w", u.Host, errdefs.ErrPermission)
	}
	if req.Response != nil {
		return nil // a redirect: any host, judged by its address
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"http": "80"}[u.Scheme]
		if port == "" {
			port = "443"
		}
	}
	if g.ownHost(u.Host) || g.isTrusted(host, port) {
		return nil
	}
	return fmt.Errorf("registry %s sent the pull to %s, which is neither its own host nor a trusted registry "+
		"(a token realm must be on the registry's site): %w", g.registry, u.Host, errdefs.ErrPermission)
}

// ownHost reports whether hostport is the registry's own: the same
// host[:port], or for a registry named by a DNS name, a host of the same
// site (the same registrable domain, by the public suffix list).
func (g *registryGuard) ownHost(hostport string) bool {
	hostport = strings.ToLower(hostport)
	if hostport == g.registry || g.registry == name.DefaultRegistry && hostport == "registry-1.docker.io" {
		return true
	}
	regHost, host := hostOnly(g.registry), hostOnly(hostport)
	if net.ParseIP(regHost) != nil || net.ParseIP(host) != nil {
		return false
	}
	a, errA := publicsuffix.EffectiveTLDPlusOne(regHost)
	b, errB := publicsuffix.EffectiveTLDPlusOne(host)
	return errA == nil && errB == nil && a == b
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return strings.Trim(h, "[]")
	}
	return strings.Trim(hostport, "[]")
}

// dial connects to addr unless it resolves to a special-purpose address
// the operator did not name in the trusted registries.
func (g *registryGuard) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !g.isTrusted(host, port) {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("registry address %q: %w", address, errdefs.ErrPermission)
			}
			if label := specialRange(ap.Addr()); label != "" {
				return fmt.Errorf("%s is at %s, a %s address: a pull reaches such an address only for a registry "+
					"the operator names in --trusted-registries: %w", host, ap.Addr().Unmap(), label, errdefs.ErrPermission)
			}
			return nil
		}
	}
	return d.DialContext(ctx, network, addr)
}

// special lists the address ranges a pull never reaches unless the
// operator trusts the host: IANA's special-purpose ranges that are not
// global, and a cloud's service address.
var special = []struct {
	prefix netip.Prefix
	label  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGNAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud service"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "protocol-assignment"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local NAT64"},
	{netip.MustParsePrefix("fc00::/7"), "unique-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// specialRange returns the label of the special-purpose range holding a,
// "" for a global address. An IPv4-mapped address, and one NAT64 or 6to4
// embeds, is judged as the IPv4 address it carries.
func specialRange(a netip.Addr) string {
	a = a.Unmap()
	if a.Is6() {
		b := a.As16()
		switch {
		case netip.MustParsePrefix("64:ff9b::/96").Contains(a):
			a = netip.AddrFrom4([4]byte(b[12:16]))
		case netip.MustParsePrefix("2002::/16").Contains(a):
			a = netip.AddrFrom4([4]byte(b[2:6]))
		}
	}
	for _, s := range special {
		if s.prefix.Contains(a) {
			return s.label
		}
	}
	return ""
}

// registryMessage is what a registry's error may say in ours: the
// method, URL without its query, status and error codes, and the first
// line of the registry's own message, cut to 160 characters, with
// anything that looks like a credential it may have echoed taken out.
// secrets are the credentials this pull sent, redacted wherever they
// appear.
func registryMessage(te *transport.Error, secrets ...string) string {
	var b strings.Builder
	if te.Request != nil && te.Request.URL != nil {
		u := *te.Request.URL
		u.RawQuery, u.Fragment, u.User = "", "", nil
		fmt.Fprintf(&b, "%s %s: ", te.Request.Method, u.String())
	}
	fmt.Fprintf(&b, "status %d %s", te.StatusCode, http.StatusText(te.StatusCode))
	msg := ""
	for _, d := range te.Errors {
		if code := string(d.Code); validCode.MatchString(code) {
			fmt.Fprintf(&b, " %s", code)
		}
		if msg == "" {
			msg = d.Message
		}
	}
	if msg = cleanLine(msg, secrets...); msg != "" {
		fmt.Fprintf(&b, ": %s", msg)
	}
	return b.String()
}

var (
	validCode = regexp.MustCompile(`^[A-Z][A-Z_]{0,39}$`)
	// authValue is an Authorization value echoed back.
	authValue = regexp.MustCompile(`(?i)\b(bearer|basic)\s+\S+`)
	// tokenish is a run long enough to be a token; a run of hex digits
	// (a digest) is kept.
	tokenish = regexp.MustCompile(`[A-Za-z0-9+/_.=-]{32,}`)
	hexRun   = regexp.MustCompile(`^[0-9a-f]+$`)
)

// cleanLine returns the first line of s, printable characters only, with
// Authorization values, token-like runs and secrets replaced by
// "[redacted]", cut to 160 characters.
func cleanLine(s string, secrets ...string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, s)
	for _, sec := range secrets {
		if len(sec) >= 4 {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	s = authValue.ReplaceAllString(s, "$1 [redacted]")
	s = tokenish.ReplaceAllStringFunc(s, func(run string) string {
		if hexRun.MatchString(strings.TrimPrefix(run, "sha256:")) {
			return run
		}
		return "[redacted]"
	})
	if r := []rune(s); len(r) > 160 {
		s = string(r[:160]) + "…"
	}
	return strings.TrimSpace(s)
}
