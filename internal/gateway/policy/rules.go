package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Verdict reasons, as Verdict.Reason reports them.
const (
	reasonAllowRule    = "allow-rule"    // an allow entry matched
	reasonDenyRule     = "deny-rule"     // a deny entry matched
	reasonAlwaysDenied = "always-denied" // the address is in the always-denied set
	reasonDefaultAllow = "default-allow" // no rule matched; egress is allow
	reasonDefaultDeny  = "default-deny"  // no rule matched; egress is deny
	reasonNotResolved  = "not-resolved"  // the name is allowed, the address is not one the gateway resolved for it
	reasonGateway      = "gateway"       // the gateway's own address
	reasonUDP          = "udp"           // not TCP
	reasonIPv6         = "ipv6"          // not an IPv4 address
)

// reserved is the fixed part of the always-denied set.
var reserved = []struct {
	prefix netip.Prefix
	label  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "cgnat"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
}

// Rules is a policy compiled to judge flows. It is immutable and safe for
// concurrent use.
type Rules struct {
	policy      Policy       // normalized; handed out only as copies
	egressAllow bool         // what no rule names is allowed
	gateway     netip.Addr   // IPv4
	host        []netip.Addr // the host's own IPv4 addresses

	allowIPs   []entry // kindPrefix, policy order
	denyIPs    []entry
	allowNames []nameRule // kindName and kindWildcard, policy order
	denyNames  []entry

	denyNameAnyPort bool            // a deny name entry has no port
	denyNamePorts   map[uint16]bool // the ports deny name entries name

	creds map[string][]Credential // by host
}

// nameRule is an allow name entry and where deny name entries shadow it
// whole, so that no name it matches can be allowed.
type nameRule struct {
	entry
	deadAnyPort bool            // shadowed on every port
	deadPorts   map[uint16]bool // shadowed on these ports
}

// live reports whether some name r matches could be allowed at port.
func (r nameRule) live(port uint16) bool {
	return portMatches(r.port, port) && !r.deadAnyPort && !r.deadPorts[port]
}

// Compile validates p and compiles it. gateway is the gateway's own IPv4
// address; hostAddrs are the host's own interface addresses, denied unless
// an allow entry names them literally (IPv6 ones are ignored: the guest has
// no IPv6). Errors wrap errdefs.ErrInvalid.
func Compile(p Policy, gateway netip.Addr, hostAddrs []netip.Addr) (*Rules, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	gw := gateway.Unmap()
	if !gw.Is4() {
		return nil, fmt.Errorf("gateway address %v: not IPv4: %w", gateway, errdefs.ErrInvalid)
	}
	n := p.Normalized()
	r := &Rules{
		policy:        n,
		egressAllow:   n.Egress == egressAllow,
		gateway:       gw,
		denyNamePorts: make(map[uint16]bool),
		creds:         make(map[string][]Credential),
	}
	for _, a := range hostAddrs {
		if a = a.Unmap(); a.Is4() && !slices.Contains(r.host, a) {
			r.host = append(r.host, a)
		}
	}
	for _, s := range n.Deny {
		e, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("compile deny entry %q: %w: %w", s, err, errdefs.ErrInvalid)
		}
		if e.kind == kindPrefix {
			r.denyIPs = append(r.denyIPs, e)
			continue
		}
		r.denyNames = append(r.denyNames, e)
		if e.port == 0 {
			r.denyNameAnyPort = true
		} else {
			r.denyNamePorts[e.port] = true
		}
	}
	for _, s := range n.Allow {
		e, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("compile allow entry %q: %w: %w", s, err, errdefs.ErrInvalid)
		}
		if e.kind == kindPrefix {
			r.allowIPs = append(r.allowIPs, e)
			continue
		}
		nr := nameRule{entry: e, deadPorts: make(map[uint16]bool)}
		for _, d := range r.denyNames {
			if !covers(d, e) {
				continue
			}
			if d.port == 0 {
				nr.deadAnyPort = true
			} else {
				nr.deadPorts[d.port] = true
			}
		}
		r.allowNames = append(r.allowNames, nr)
	}
	for _, c := range n.Credentials {
		r.creds[c.Host] = append(r.creds[c.Host], c)
	}
	return r, nil
}

// covers reports whether every name the name entry a matches, deny entry d
// matches too (ports aside).
func covers(d, a entry) bool {
	if d.kind == kindName {
		return a.kind == kindName && a.name == d.name
	}
	// *.d covers x strictly below d, and *.x for x equal to or below d.
	return a.name == d.name && a.kind == kindWildcard || below(a.name, d.name)
}

// Policy returns the normalized policy r was compiled from.
func (r *Rules) Policy() Policy {
	p := r.policy
	p.Allow = slices.Clone(p.Allow)
	p.Deny = slices.Clone(p.Deny)
	p.Credentials = slices.Clone(p.Credentials)
	return p
}

// Flow is one guest connection as the gateway sees it.
type Flow struct {
	Proto string     // "tcp" or "udp"
	Dst   netip.Addr // the address the guest dialed
	Port  uint16     // the port the guest dialed
	// Name is the TLS SNI or HTTP Host the guest sent (lower case, no port,
	// no trailing dot; Decide normalizes it again), "" if none was seen. An
	// IP address here, bare or in brackets, counts as no name.
	Name string
	// NameAddrs are the addresses the gateway itself resolved for Name (may
	// be empty).
	NameAddrs []netip.Addr
	// DstNames are the names whose gateway-resolved addresses include Dst.
	DstNames []string
}

// Verdict is the decision on a flow or a DNS query.
type Verdict struct {
	Allow bool
	// Reason is short and machine-friendly: "allow-rule", "deny-rule",
	// "always-denied", "default-allow", "default-deny", "not-resolved" (the
	// name is allowed but the guest dialed an address the gateway did not
	// resolve for it), "gateway", "udp" (anything not TCP) or "ipv6".
	Reason string
	// Rule is the entry that decided, as the normalized policy writes it;
	// for "not-resolved" the allow entry that named the name. "" when no
	// entry decided.
	Rule string
}

func allow(reason, rule string) Verdict { return Verdict{Allow: true, Reason: reason, Rule: rule} }
func deny(reason, rule string) Verdict  { return Verdict{Reason: reason, Rule: rule} }

// Decide judges a flow. Anything not TCP is denied ("udp": UDP carries only
// DNS to the gateway, which is served before the policy is asked), and so is
// any address that is not IPv4 ("ipv6"). A TCP flow is judged by the first
// of these that applies:
//
//  1. Dst is the gateway's own address: deny ("gateway").
//  2. A deny IP or CIDR entry matches Dst and Port: deny.
//  3. A deny name entry matches Name at Port, or one of DstNames when Name
//     is "" or Dst is not among NameAddrs (so a made-up SNI does not unlock
//     an address the gateway knows as a denied name's): deny.
//  4. An allow IP or CIDR entry matches Dst and Port and opens it: allow.
//     An entry opens an always-denied address only when it lies within the
//     always-denied range, so 10.0.0.0/8 opens 10.1.2.3 but 0.0.0.0/0 does
//     not, and only the host's address itself opens the host's address.
//  5. Dst is always denied (see AlwaysDenied): deny.
//  6. With a Name, an allow name entry matching Name at Port: allow if Dst
//     is among NameAddrs, else deny ("not-resolved"). DstNames are not
//     consulted: an SNI no rule names, sent to an allowed name's address, is
//     judged by egress (domain fronting).
//  7. Without a Name, an allow name entry matching one of DstNames at Port:
//     allow.
//  8. Egress: allow ("default-allow") or deny ("default-deny").
func (r *Rules) Decide(f Flow) Verdict {
	if f.Proto != "tcp" {
		return deny(reasonUDP, "")
	}
	dst := f.Dst.Unmap()
	switch {
	case !dst.Is4():
		return deny(reasonIPv6, "")
	case dst == r.gateway:
		return deny(reasonGateway, "")
	}
	if e := matchIP(r.denyIPs, dst, f.Port); e != nil {
		return deny(reasonDenyRule, e.text)
	}
	name := flowName(f.Name)
	resolved := containsAddr(f.NameAddrs, dst)
	if name != "" {
		if e := matchName(r.denyNames, name, f.Port); e != nil {
			return deny(reasonDenyRule, e.text)
		}
	}
	if name == "" || !resolved {
		for _, n := range f.DstNames {
			if e := matchName(r.denyNames, lookupName(n), f.Port); e != nil {
				return deny(reasonDenyRule, e.text)
			}
		}
	}
	if e := r.openingIP(dst, f.Port); e != nil {
		return allow(reasonAllowRule, e.text)
	}
	if _, _, denied := deniedRange(dst, r.host); denied {
		return deny(reasonAlwaysDenied, "")
	}
	if name != "" {
		if nr := r.matchAllowName(name, f.Port); nr != nil {
			if resolved {
				return allow(reasonAllowRule, nr.text)
			}
			return deny(reasonNotResolved, nr.text)
		}
	} else {
		for _, n := range f.DstNames {
			if nr := r.matchAllowName(lookupName(n), f.Port); nr != nil {
				return allow(reasonAllowRule, nr.text)
			}
		}
	}
	return r.byEgress()
}

func (r *Rules) byEgress() Verdict {
	if r.egressAllow {
		return allow(reasonDefaultAllow, "")
	}
	return deny(reasonDefaultDeny, "")
}

// NeedsName reports whether the verdict on a TCP flow to dst:port could turn
// on the SNI or Host, so that the gateway must read the guest's first bytes
// before deciding. It is false when the address alone decides: an IPv6
// address, the gateway's, a deny IP entry, an allow IP entry with no deny
// name entry for the port, the always-denied set, or egress with no name
// entry for the port. When it is false, Decide with Name "" gives the
// verdict any name would.
func (r *Rules) NeedsName(dst netip.Addr, port uint16) bool {
	dst = dst.Unmap()
	if !dst.Is4() || dst == r.gateway || matchIP(r.denyIPs, dst, port) != nil {
		return false
	}
	if r.openingIP(dst, port) != nil {
		return r.denyNameAt(port)
	}
	if _, _, denied := deniedRange(dst, r.host); denied {
		return false
	}
	return r.liveAllowNameAt(port) || r.egressAllow && r.denyNameAt(port)
}

// Precheck is Decide without a name, for the SYN; dstNames are the flow's
// DstNames. v is the verdict on the flow if no name is ever seen. deny is
// true when no name could make the flow allowed, whatever the gateway
// resolves for it, so that the gateway can refuse the connection at once.
func (r *Rules) Precheck(dst netip.Addr, port uint16, dstNames []string) (deny bool, v Verdict) {
	v = r.Decide(Flow{Proto: "tcp", Dst: dst, Port: port, DstNames: dstNames})
	if v.Allow {
		return false, v
	}
	return !r.couldAllow(dst.Unmap(), port), v
}

// couldAllow reports whether some Name and NameAddrs make a TCP flow to
// dst:port allowed, whatever its DstNames. A deny name entry can always be
// escaped by another name, and DstNames by a Name the gateway resolved to
// dst, so only what the address decides and the allow name entries matter.
func (r *Rules) couldAllow(dst netip.Addr, port uint16) bool {
	if !dst.Is4() || dst == r.gateway || matchIP(r.denyIPs, dst, port) != nil {
		return false
	}
	if r.openingIP(dst, port) != nil {
		return true
	}
	if _, _, denied := deniedRange(dst, r.host); denied {
		return false
	}
	return r.egressAllow || r.liveAllowNameAt(port)
}

// AllowName decides a DNS query for name, on no particular port. A deny name
// entry without a port refuses it; otherwise an allow name entry (with or
// without a port) or egress allow lets it through. A query refused is
// answered NXDOMAIN and never sent upstream.
func (r *Rules) AllowName(name string) Verdict {
	name = lookupName(name)
	for i := range r.denyNames {
		if e := &r.denyNames[i]; e.port == 0 && nameMatches(e, name) {
			return deny(reasonDenyRule, e.text)
		}
	}
	for i := range r.allowNames {
		if e := &r.allowNames[i].entry; nameMatches(e, name) {
			return allow(reasonAllowRule, e.text)
		}
	}
	return r.byEgress()
}

// AlwaysDenied reports whether a is in the always-denied set, whatever the
// rules, and names the range: "gateway A/32", "host A/32", or a label and
// CIDR such as "link-local 169.254.0.0/16"; "ipv6" for any address that is
// not IPv4. The set is 0.0.0.0/8, 127.0.0.0/8 loopback, 169.254.0.0/16
// link-local (cloud metadata), 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16,
// 100.64.0.0/10 CGNAT, 224.0.0.0/4 multicast, 240.0.0.0/4 with the
// 255.255.255.255 broadcast, the host's own addresses and the gateway's.
// IPv4-mapped IPv6 addresses are judged as the IPv4 address they map.
func AlwaysDenied(a netip.Addr, gateway netip.Addr, hostAddrs []netip.Addr) (bool, string) {
	a = a.Unmap()
	if !a.Is4() {
		return true, reasonIPv6
	}
	if a == gateway.Unmap() {
		return true, "gateway " + netip.PrefixFrom(a, 32).String()
	}
	label, _, denied := deniedRange(a, hostAddrs)
	return denied, label
}

// deniedRange reports whether the IPv4 address a is always denied (the
// gateway aside), the label of the narrowest range holding it and that
// range's prefix length.
func deniedRange(a netip.Addr, host []netip.Addr) (label string, bits int, denied bool) {
	for _, h := range host {
		if h.Unmap() == a {
			return "host " + netip.PrefixFrom(a, 32).String(), 32, true
		}
	}
	for _, r := range reserved {
		if r.prefix.Contains(a) && (!denied || r.prefix.Bits() > bits) {
			label, bits, denied = r.label+" "+r.prefix.String(), r.prefix.Bits(), true
		}
	}
	return label, bits, denied
}

// OpenedLiterally reports whether an allow IP or CIDR entry opens a, which
// is what lets the gateway keep an always-denied address in a DNS answer or
// dial it. port 0 asks about any port; another port asks about entries
// without a port or with that one. For an always-denied address the entry
// must lie within its range (see Decide); the gateway's address is never
// opened.
func (r *Rules) OpenedLiterally(a netip.Addr, port uint16) bool {
	a = a.Unmap()
	if !a.Is4() || a == r.gateway {
		return false
	}
	if port != 0 {
		return r.openingIP(a, port) != nil
	}
	_, bits, denied := deniedRange(a, r.host)
	for i := range r.allowIPs {
		if opens(&r.allowIPs[i], a, bits, denied) {
			return true
		}
	}
	return false
}

// Credentials returns the credential rules for exactly host, in policy
// order; nil when there are none.
func (r *Rules) Credentials(host string) []Credential {
	return slices.Clone(r.creds[lookupName(host)])
}

// openingIP returns the first allow IP entry that matches the IPv4 address
// a at port and opens it, or nil.
func (r *Rules) openingIP(a netip.Addr, port uint16) *entry {
	_, bits, denied := deniedRange(a, r.host)
	for i := range r.allowIPs {
		if e := &r.allowIPs[i]; portMatches(e.port, port) && opens(e, a, bits, denied) {
			return e
		}
	}
	return nil
}

// opens reports whether the IP entry e covers a, and when a is always denied
// in a range of prefix length bits, lies within that range.
func opens(e *entry, a netip.Addr, bits int, denied bool) bool {
	return e.prefix.Contains(a) && (!denied || e.prefix.Bits() >= bits)
}

func (r *Rules) matchAllowName(name string, port uint16) *nameRule {
	for i := range r.allowNames {
		if nr := &r.allowNames[i]; portMatches(nr.port, port) && nameMatches(&nr.entry, name) {
			return nr
		}
	}
	return nil
}

// denyNameAt reports whether a deny name entry applies at port.
func (r *Rules) denyNameAt(port uint16) bool {
	return r.denyNameAnyPort || r.denyNamePorts[port]
}

// liveAllowNameAt reports whether an allow name entry could allow some name
// at port.
func (r *Rules) liveAllowNameAt(port uint16) bool {
	for _, nr := range r.allowNames {
		if nr.live(port) {
			return true
		}
	}
	return false
}

// matchIP returns the first IP entry in list that matches a at port, or nil.
func matchIP(list []entry, a netip.Addr, port uint16) *entry {
	for i := range list {
		if e := &list[i]; portMatches(e.port, port) && e.prefix.Contains(a) {
			return e
		}
	}
	return nil
}

// matchName returns the first name entry in list that matches name at port,
// or nil.
func matchName(list []entry, name string, port uint16) *entry {
	for i := range list {
		if e := &list[i]; portMatches(e.port, port) && nameMatches(e, name) {
			return e
		}
	}
	return nil
}

// portMatches reports whether an entry's port (0 for any) matches port.
func portMatches(entryPort, port uint16) bool {
	return entryPort == 0 || entryPort == port
}

// nameMatches reports whether the name entry e matches name, which is
// lower case without a trailing dot.
func nameMatches(e *entry, name string) bool {
	if e.kind == kindWildcard {
		return below(name, e.name)
	}
	return name == e.name
}

// below reports whether name lies strictly below parent, at any depth.
func below(name, parent string) bool {
	return len(name) > len(parent)+1 && strings.HasSuffix(name, parent) &&
		name[len(name)-len(parent)-1] == '.'
}

// flowName normalizes the SNI or Host of a flow as lookupName does, and
// also drops a ":port"; an IP address, bare or in brackets, names nothing
// and gives "".
func flowName(s string) string {
	if i := strings.LastIndexByte(s, ':'); i >= 0 && strings.Trim(s[i+1:], "0123456789") == "" &&
		(strings.Count(s, ":") == 1 || strings.HasPrefix(s, "[") && strings.HasSuffix(s[:i], "]")) {
		s = s[:i]
	}
	if inner, ok := strings.CutPrefix(s, "["); ok && strings.HasSuffix(inner, "]") {
		s = inner[:len(inner)-1]
	}
	s = lookupName(s)
	if _, err := netip.ParseAddr(s); err == nil {
		return ""
	}
	return s
}

// lookupName normalizes a name the guest or the gateway supplied: ASCII
// lower case, trailing dots removed.
func lookupName(s string) string {
	return strings.TrimRight(asciiLower(s), ".")
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, b := range list {
		if b.Unmap() == a {
			return true
		}
	}
	return false
}
