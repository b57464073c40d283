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

// reserved is the fixed part of the always-denied set. The private ranges
// are denied unless the operator opens them (Bounds.Private); the others
// are denied whatever anyone says.
var reserved = []struct {
	prefix  netip.Prefix
	label   string
	private bool
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network", false},
	{netip.MustParsePrefix("10.0.0.0/8"), "private", true},
	{netip.MustParsePrefix("100.64.0.0/10"), "cgnat", true},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback", false},
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud-service", false},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local", false},
	{netip.MustParsePrefix("172.16.0.0/12"), "private", true},
	{netip.MustParsePrefix("192.168.0.0/16"), "private", true},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast", false},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved", false},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast", false},
}

// Bounds is what judges addresses beside a policy: the gateway's own
// address, the host's, and the private ranges the operator opened. No
// policy reaches past them.
type Bounds struct {
	// Gateway is the gateway's own IPv4 address: denied on every port
	// (DNS is served before the policy is asked).
	Gateway netip.Addr
	// Host are the host's own interface addresses: always denied. IPv6
	// ones are ignored: the guest has no IPv6.
	Host []netip.Addr
	// Private are the parts of the private and CGNAT ranges the operator
	// opened (airlock serve --egress-private). Inside them an allow entry
	// that names an address or CIDR literally admits it; a name rule never
	// does. The rest of those ranges is denied like loopback.
	Private []netip.Prefix
}

// Rules is a policy compiled to judge flows. It is immutable and safe for
// concurrent use.
type Rules struct {
	policy      Policy         // normalized; handed out only as copies
	egressAllow bool           // what no rule names is allowed
	gateway     netip.Addr     // IPv4
	host        []netip.Addr   // the host's own IPv4 addresses
	private     []netip.Prefix // opened private ranges, IPv4

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

// Compile validates p and compiles it against b. Entries that name what
// b keeps closed compile and open nothing (Bounds.Check refuses them in new
// policies). Errors wrap errdefs.ErrInvalid.
func Compile(p Policy, b Bounds) (*Rules, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	gw := b.Gateway.Unmap()
	if !gw.Is4() {
		return nil, fmt.Errorf("gateway address %v: not IPv4: %w", b.Gateway, errdefs.ErrInvalid)
	}
	n := p.Normalized()
	r := &Rules{
		policy:        n,
		egressAllow:   n.Egress == egressAllow,
		gateway:       gw,
		host:          b.host(),
		private:       b.private(),
		denyNamePorts: make(map[uint16]bool),
		creds:         make(map[string][]Credential),
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
	// HostRequired marks a flow on a port where a connection must name its
	// host (80 and 443): without a Name, DstNames can still deny it but no
	// longer admit it, so it passes only by an address rule or egress.
	HostRequired bool
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
//     Of the always-denied addresses only those in a private range the
//     operator opened can be opened, by an entry that lies within the
//     private range: 10.0.0.0/8 opens 10.1.2.3 but 0.0.0.0/0 does not.
//  5. Dst is always denied (see AlwaysDenied): deny.
//  6. With a Name, an allow name entry matching Name at Port: allow if Dst
//     is among NameAddrs, else deny ("not-resolved"). DstNames are not
//     consulted: an SNI no rule names, sent to an allowed name's address, is
//     judged by egress (domain fronting).
//  7. Without a Name, an allow name entry matching one of DstNames at Port:
//     allow; not for a flow with HostRequired.
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
	if _, _, denied := r.deniedRange(dst); denied {
		return deny(reasonAlwaysDenied, "")
	}
	if name != "" {
		if nr := r.matchAllowName(name, f.Port); nr != nil {
			if resolved {
				return allow(reasonAllowRule, nr.text)
			}
			return deny(reasonNotResolved, nr.text)
		}
	} else if !f.HostRequired {
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
	if _, _, denied := r.deniedRange(dst); denied {
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
	if _, _, denied := r.deniedRange(dst); denied {
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

// AlwaysDenied reports whether a is in the always-denied set, whatever
// the rules, and names the range: "gateway A/32", "host A/32", or a label
// and CIDR such as "link-local 169.254.0.0/16"; "ipv6" for any address that
// is not IPv4. The set is 0.0.0.0/8, 127.0.0.0/8 loopback, 169.254.0.0/16
// link-local (cloud metadata), 168.63.129.16 (a cloud's service address),
// 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16, 100.64.0.0/10 CGNAT,
// 224.0.0.0/4 multicast, 240.0.0.0/4 with the 255.255.255.255 broadcast,
// the host's own addresses and the gateway's. An address in a private
// range the operator opened is in the set too: only an allow entry that
// names it literally admits it (see Rules.OpenedLiterally). IPv4-mapped
// IPv6 addresses are judged as the IPv4 address they map.
func AlwaysDenied(a netip.Addr, b Bounds) (bool, string) {
	a = a.Unmap()
	if !a.Is4() {
		return true, reasonIPv6
	}
	if a == b.Gateway.Unmap() {
		return true, "gateway " + netip.PrefixFrom(a, 32).String()
	}
	label, _, _, denied := deniedRange(a, b.host())
	return denied, label
}

// Check refuses, with errdefs.ErrPermission, a policy whose allow entries
// name an address b keeps closed to every policy: one that lies wholly in
// an always-denied range or is the gateway's or the host's own, or one in
// a private range the operator has not opened. The error names the entry
// as field[i] "text". An entry wider than such a range (0.0.0.0/0) is
// accepted: it opens none of it. Deny entries are never refused: they can
// only close more.
func (b Bounds) Check(p Policy, field string) error {
	host, private := b.host(), b.private()
	for i, s := range p.Allow {
		e, err := parseEntry(s)
		if err != nil || e.kind != kindPrefix {
			continue // Validate reports malformed entries
		}
		a, bits := e.prefix.Addr(), e.prefix.Bits()
		label, rangeBits, priv, denied := deniedRange(a, nil)
		inRange := denied && bits >= rangeBits
		closed := ""
		switch {
		case inRange && !priv:
			closed = label
		case bits == 32 && a == b.Gateway.Unmap():
			closed = "the gateway's own address"
		case bits == 32 && slices.Contains(host, a):
			closed = "an address of the host's"
		}
		if closed != "" {
			return fmt.Errorf("%s.allow[%d] %q: %s is always denied: no policy can open it: %w", field, i, s, closed, errdefs.ErrPermission)
		}
		if !inRange {
			continue
		}
		if !slices.ContainsFunc(private, func(o netip.Prefix) bool { return o.Bits() <= bits && o.Contains(a) }) {
			return fmt.Errorf("%s.allow[%d] %q: %s is closed on this server: the operator opens private ranges with airlock serve --egress-private CIDR: %w", field, i, s, label, errdefs.ErrPermission)
		}
	}
	return nil
}

// host returns b's host addresses that are IPv4, unmapped, without repeats.
func (b Bounds) host() []netip.Addr {
	var out []netip.Addr
	for _, a := range b.Host {
		if a = a.Unmap(); a.Is4() && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// private returns b's opened private ranges that are IPv4, masked.
func (b Bounds) private() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range b.Private {
		if p.Addr().Is4() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// deniedRange reports whether the IPv4 address a is always denied (the
// gateway aside), the label of the narrowest range holding it, that
// range's prefix length, and whether the range is a private one an
// operator may open.
func deniedRange(a netip.Addr, host []netip.Addr) (label string, bits int, private, denied bool) {
	if slices.Contains(host, a) {
		return "host " + netip.PrefixFrom(a, 32).String(), 32, false, true
	}
	for _, r := range reserved {
		if r.prefix.Contains(a) && (!denied || r.prefix.Bits() > bits) {
			label, bits, private, denied = r.label+" "+r.prefix.String(), r.prefix.Bits(), r.private, true
		}
	}
	return label, bits, private, denied
}

// deniedRange is the package's deniedRange with r's host addresses.
func (r *Rules) deniedRange(a netip.Addr) (label string, bits int, denied bool) {
	label, bits, _, denied = deniedRange(a, r.host)
	return label, bits, denied
}

// OpenedLiterally reports whether an allow IP or CIDR entry opens a, which
// is what lets the gateway keep an always-denied address in a DNS answer or
// dial it. port 0 asks about any port; another port asks about entries
// without a port or with that one. Only an address in a private range the
// operator opened can be opened, by an entry that lies within the private
// range (see Decide); the gateway's and the host's addresses and the other
// always-denied ranges never are.
func (r *Rules) OpenedLiterally(a netip.Addr, port uint16) bool {
	a = a.Unmap()
	if !a.Is4() || a == r.gateway {
		return false
	}
	return r.opening(a, func(e *entry) bool { return port == 0 || portMatches(e.port, port) }) != nil
}

// Credentials returns the credential rules for exactly host, in policy
// order; nil when there are none.
func (r *Rules) Credentials(host string) []Credential {
	return slices.Clone(r.creds[lookupName(host)])
}

// openingIP returns the first allow IP entry that matches the IPv4 address
// a at port and opens it, or nil.
func (r *Rules) openingIP(a netip.Addr, port uint16) *entry {
	return r.opening(a, func(e *entry) bool { return portMatches(e.port, port) })
}

// opening returns the first allow IP entry that covers the IPv4 address a,
// passes ok, and opens a: any entry for an address outside the
// always-denied set; for one in a private range the operator opened, an
// entry that lies within the private range, so that 10.0.0.0/8 opens
// 10.1.2.3 but 0.0.0.0/0 does not; for any other always-denied address,
// none.
func (r *Rules) opening(a netip.Addr, ok func(*entry) bool) *entry {
	_, bits, private, denied := deniedRange(a, r.host)
	if denied && (!private || !slices.ContainsFunc(r.private, func(o netip.Prefix) bool { return o.Contains(a) })) {
		return nil
	}
	for i := range r.allowIPs {
		if e := &r.allowIPs[i]; ok(e) && e.prefix.Contains(a) && (!denied || e.prefix.Bits() >= bits) {
			return e
		}
	}
	return nil
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

// ParsePrivate reads the operator's list of private ranges to open,
// CIDR[,CIDR…] (an address alone is a /32). Each must lie within one of the
// private ranges (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16) or CGNAT
// (100.64.0.0/10): nothing else can be opened. Errors wrap
// errdefs.ErrInvalid.
func ParsePrivate(list string) ([]netip.Prefix, error) {
	prefixes, err := ParsePrefixes(list)
	if err != nil {
		return nil, err
	}
	for _, p := range prefixes {
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("%q is not IPv4: sandboxes have IPv4 only: %w", p, errdefs.ErrInvalid)
		}
		if _, bits, private, denied := deniedRange(p.Addr(), nil); !private || !denied || p.Bits() < bits {
			return nil, fmt.Errorf("%q is not within a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10): only those can be opened: %w", p, errdefs.ErrInvalid)
		}
	}
	return prefixes, nil
}

// ParsePrefixes reads an operator's list CIDR[,CIDR…], IPv4 or IPv6, an
// address alone standing for itself (/32, /128), each masked; blanks
// around the commas are ignored. Errors wrap errdefs.ErrInvalid.
func ParsePrefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not a CIDR or an address: %w", s, errdefs.ErrInvalid)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
