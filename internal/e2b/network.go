package e2b

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// E2B's egress rules and airlock's differ in who wins: in E2B an allowOut
// entry wins over a denyOut entry, and what neither names is allowed; in
// airlock a deny entry wins over an allow entry, and what neither names
// follows "egress". egressPolicy expresses E2B's rules in airlock's terms:
//
//   - denyOut holding 0.0.0.0/0 (or allow_internet_access: false) means
//     everything is denied but what allowOut names: egress "deny", allow =
//     allowOut. Other denyOut entries add nothing then (what they name is
//     denied already, or allowed by an allowOut entry, which wins).
//   - otherwise what is not denied is allowed: egress "allow", deny =
//     denyOut with every allowOut block cut out of it (so that no deny entry
//     overlaps an allow entry and "deny wins" never decides), allow =
//     allowOut. A domain in allowOut is refused here, as E2B refuses it:
//     E2B wants 0.0.0.0/0 in denyOut before a domain rule means anything.
//
// airlock's always-denied ranges (loopback, link-local, private networks,
// the host's own addresses) stay denied unless an allowOut entry names
// them literally, as in airlock's native policy.

// allTraffic is E2B's name for every IPv4 address in denyOut.
const allTraffic = "0.0.0.0/0"

// maxPolicyEntries is what one airlock policy list holds.
const maxPolicyEntries = 256

// egressPolicy turns E2B's egress settings into an airlock policy. at is
// where the lists are in the request ("network" in a create), for the
// errors, which wrap errdefs.ErrInvalid.
func egressPolicy(at string, allowInternet *bool, allowOut, denyOut []string) (policy.Policy, error) {
	type allowEntry struct {
		text   string
		prefix netip.Prefix // valid for an address or CIDR
	}
	var allows []allowEntry
	for i, e := range allowOut {
		p, isIP, err := parseIPEntry(e)
		if err != nil {
			return policy.Policy{}, fmt.Errorf("%s.allowOut[%d] %q: %v: %w", at, i, e, err, errdefs.ErrInvalid)
		}
		if isIP {
			allows = append(allows, allowEntry{text: prefixText(p), prefix: p})
			continue
		}
		name := strings.ToLower(strings.TrimSuffix(e, "."))
		if err := checkName(name); err != nil {
			return policy.Policy{}, fmt.Errorf("%s.allowOut[%d] %q: %v: %w", at, i, e, err, errdefs.ErrInvalid)
		}
		allows = append(allows, allowEntry{text: name})
	}
	all := allowInternet != nil && !*allowInternet
	var denies []netip.Prefix
	for i, e := range denyOut {
		p, isIP, err := parseIPEntry(e)
		if err == nil && !isIP {
			err = fmt.Errorf("denyOut takes CIDR blocks and IP addresses only (E2B has no domain deny rules)")
		}
		if err != nil {
			return policy.Policy{}, fmt.Errorf("%s.denyOut[%d] %q: %v: %w", at, i, e, err, errdefs.ErrInvalid)
		}
		if p.Bits() == 0 {
			all = true
		}
		denies = append(denies, p)
	}

	pol := policy.Policy{Egress: "deny"}
	for _, a := range allows {
		pol.Allow = append(pol.Allow, a.text)
	}
	if all {
		return pol, nil
	}
	pol.Egress = "allow"
	for i, a := range allows {
		if !a.prefix.IsValid() {
			return policy.Policy{}, fmt.Errorf("%s.allowOut[%d] %q: a domain in allowOut needs %q in denyOut (or allow_internet_access: false), as in E2B: without it everything is allowed already: %w",
				at, i, a.text, allTraffic, errdefs.ErrInvalid)
		}
		var cut []netip.Prefix
		for _, d := range denies {
			cut = append(cut, subtract(d, a.prefix)...)
		}
		denies = cut
	}
	if len(denies) > maxPolicyEntries {
		return policy.Policy{}, fmt.Errorf("%s: denyOut less the allowOut blocks inside it makes %d CIDR blocks, more than airlock's policy holds (%d): airlock cannot express these rules; use fewer or larger blocks: %w",
			at, len(denies), maxPolicyEntries, errdefs.ErrInvalid)
	}
	for _, d := range denies {
		pol.Deny = append(pol.Deny, prefixText(d))
	}
	return pol, nil
}

// parseIPEntry reads an IPv4 address or CIDR; isIP is false (and err nil)
// for something else, which may be a domain. Ports and IPv6 are refused:
// E2B's entries have neither.
func parseIPEntry(e string) (p netip.Prefix, isIP bool, err error) {
	if e == "" {
		return p, false, fmt.Errorf("an entry is empty")
	}
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return p, false, fmt.Errorf("not a CIDR block")
		}
		if !p.Addr().Is4() {
			return p, false, fmt.Errorf("IPv6 is not supported: sandboxes have IPv4 only")
		}
		return p.Masked(), true, nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if !a.Is4() {
			return p, false, fmt.Errorf("IPv6 is not supported: sandboxes have IPv4 only")
		}
		return netip.PrefixFrom(a, 32), true, nil
	}
	if strings.Contains(e, ":") {
		return p, false, fmt.Errorf("an entry takes no port (E2B's rules apply to every port)")
	}
	return p, false, nil
}

// checkName checks a domain entry as airlock's policy reads it: a name or
// "*.name".
func checkName(name string) error {
	if err := (policy.Policy{Egress: "deny", Allow: []string{name}}).Validate(); err != nil {
		return fmt.Errorf("not a CIDR block, an IP address or a domain name (example.com, *.example.com)")
	}
	return nil
}

// prefixText writes a block as airlock's policy stores it: a lone
// address without "/32".
func prefixText(p netip.Prefix) string {
	if p.Bits() == 32 {
		return p.Addr().String()
	}
	return p.String()
}

// subtract returns the blocks of d that a does not cover.
func subtract(d, a netip.Prefix) []netip.Prefix {
	if !d.Overlaps(a) {
		return []netip.Prefix{d}
	}
	if a.Bits() <= d.Bits() {
		return nil // a covers d
	}
	// Halve d down to a: at each level the half without a is kept.
	var out []netip.Prefix
	cur := d
	for cur.Bits() < a.Bits() {
		lo, hi := halves(cur)
		if lo.Contains(a.Addr()) {
			out, cur = append(out, hi), lo
		} else {
			out, cur = append(out, lo), hi
		}
	}
	return out
}

// halves splits an IPv4 block into its two halves.
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	b := p.Bits() + 1
	a4 := p.Masked().Addr().As4()
	v := uint32(a4[0])<<24 | uint32(a4[1])<<16 | uint32(a4[2])<<8 | uint32(a4[3])
	v |= 1 << (32 - b)
	hi := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return netip.PrefixFrom(p.Masked().Addr(), b), netip.PrefixFrom(hi, b)
}

// networkView is E2B's SandboxNetworkConfig as a sandbox's details show
// it: airlock's policy read back in E2B's terms.
type networkView struct {
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
}

// viewNetwork reads a stored policy back as E2B's network settings and
// allowInternetAccess (nil when neither "all allowed" nor "all denied"
// describes it).
func viewNetwork(raw json.RawMessage) (networkView, *bool) {
	v := networkView{AllowPublicTraffic: true}
	p, err := policy.Parse(raw)
	if err != nil {
		return v, nil
	}
	v.AllowOut = p.Allow
	if p.Egress == "allow" {
		v.DenyOut = p.Deny
		t := true
		return v, &t
	}
	v.DenyOut = []string{allTraffic}
	if len(p.Allow) == 0 {
		f := false
		return v, &f
	}
	return v, nil
}
