package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

var (
	gatewayAddr = netip.MustParseAddr("192.168.127.1")
	hostPublic  = netip.MustParseAddr("198.51.100.1") // the host's own public address
	hostPrivate = netip.MustParseAddr("10.0.0.5")     // the host's own LAN address
	hostAddrs   = []netip.Addr{hostPublic, hostPrivate, netip.MustParseAddr("fe80::1")}

	exampleIP = netip.MustParseAddr("93.184.216.34") // example.com, as the gateway resolved it
	otherIP   = netip.MustParseAddr("203.0.113.50")  // resolved for nothing the policy names
	evilIP    = netip.MustParseAddr("203.0.113.66")  // evil.com, as the gateway resolved it
	metadata  = netip.MustParseAddr("169.254.169.254")

	// bounds is the tests' host: 10.0.0.0/8 is opened by the operator,
	// the other private ranges are not.
	bounds = Bounds{Gateway: gatewayAddr, Host: hostAddrs, Private: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func compile(t testing.TB, p Policy) *Rules {
	t.Helper()
	r, err := Compile(p, bounds)
	if err != nil {
		t.Fatalf("Compile(%+v): %v", p, err)
	}
	return r
}

// tcp is a flow with no name to dst:port.
func tcp(dst netip.Addr, port uint16) Flow { return Flow{Proto: "tcp", Dst: dst, Port: port} }

// named is a flow to dst:port whose SNI or Host is name, which the gateway
// resolved to resolved.
func named(dst netip.Addr, port uint16, name string, resolved ...netip.Addr) Flow {
	return Flow{Proto: "tcp", Dst: dst, Port: port, Name: name, NameAddrs: resolved}
}

// known is a flow with no name to dst:port, an address the gateway resolved
// for dstNames.
func known(dst netip.Addr, port uint16, dstNames ...string) Flow {
	return Flow{Proto: "tcp", Dst: dst, Port: port, DstNames: dstNames}
}

// webKnown is known on a port where the flow must name its host.
func webKnown(dst netip.Addr, port uint16, dstNames ...string) Flow {
	f := known(dst, port, dstNames...)
	f.HostRequired = true
	return f
}

func allowed(reason, rule string) Verdict { return Verdict{Allow: true, Reason: reason, Rule: rule} }
func denied(reason, rule string) Verdict  { return Verdict{Reason: reason, Rule: rule} }

func TestDecide(t *testing.T) {
	egressAllow := Policy{Egress: "allow"}
	onlyExample := Policy{Allow: []string{"example.com"}}
	tests := []struct {
		name string
		p    Policy
		flow Flow
		want Verdict
	}{
		// Egress.
		{"default deny", Policy{}, tcp(otherIP, 443), denied("default-deny", "")},
		{"explicit deny", Policy{Egress: "deny"}, tcp(otherIP, 443), denied("default-deny", "")},
		{"default allow", egressAllow, tcp(otherIP, 443), allowed("default-allow", "")},
		{"default allow with a name", egressAllow, named(otherIP, 443, "anything.test"), allowed("default-allow", "")},

		// Allow IP and CIDR entries.
		{"allow address", Policy{Allow: []string{"203.0.113.50"}}, tcp(otherIP, 22), allowed("allow-rule", "203.0.113.50")},
		{"allow address, other address", Policy{Allow: []string{"203.0.113.51"}}, tcp(otherIP, 22), denied("default-deny", "")},
		{"allow cidr", Policy{Allow: []string{"203.0.113.0/24"}}, tcp(otherIP, 22), allowed("allow-rule", "203.0.113.0/24")},
		{"allow cidr, outside", Policy{Allow: []string{"203.0.113.0/26"}}, tcp(evilIP, 22), denied("default-deny", "")},
		{"allow cidr not canonical", Policy{Allow: []string{"203.0.113.99/24"}}, tcp(otherIP, 22), allowed("allow-rule", "203.0.113.99/24")},
		{"allow address with port", Policy{Allow: []string{"203.0.113.50:5432"}}, tcp(otherIP, 5432), allowed("allow-rule", "203.0.113.50:5432")},
		{"allow address with port, other port", Policy{Allow: []string{"203.0.113.50:5432"}}, tcp(otherIP, 5433), denied("default-deny", "")},
		{"allow cidr with port", Policy{Allow: []string{"203.0.113.0/24:443"}}, tcp(otherIP, 443), allowed("allow-rule", "203.0.113.0/24:443")},
		{"allow cidr with port, other port", Policy{Allow: []string{"203.0.113.0/24:443"}}, tcp(otherIP, 80), denied("default-deny", "")},
		{"allow everything", Policy{Allow: []string{"0.0.0.0/0"}}, tcp(otherIP, 25), allowed("allow-rule", "0.0.0.0/0")},
		{"first matching entry reported", Policy{Allow: []string{"203.0.113.0/24:80", "203.0.113.0/25", "203.0.113.50"}}, tcp(otherIP, 443), allowed("allow-rule", "203.0.113.0/25")},
		{"allow ip admits any name", Policy{Allow: []string{"203.0.113.0/24"}}, named(otherIP, 443, "whatever.test"), allowed("allow-rule", "203.0.113.0/24")},

		// Allow name entries.
		{"allow name, resolved", onlyExample, named(exampleIP, 443, "example.com", exampleIP), allowed("allow-rule", "example.com")},
		{"allow name, resolved among others", onlyExample, named(exampleIP, 443, "example.com", otherIP, exampleIP), allowed("allow-rule", "example.com")},
		{"allow name, upper case and trailing dot", onlyExample, named(exampleIP, 443, "EXAMPLE.Com.", exampleIP), allowed("allow-rule", "example.com")},
		{"allow name written in upper case", Policy{Allow: []string{"Example.COM."}}, named(exampleIP, 443, "example.com", exampleIP), allowed("allow-rule", "example.com")},
		{"allow name, subdomain not matched", onlyExample, named(exampleIP, 443, "www.example.com", exampleIP), denied("default-deny", "")},
		{"allow name, suffix not matched", onlyExample, named(exampleIP, 443, "notexample.com", exampleIP), denied("default-deny", "")},
		{"allow name, as a prefix not matched", onlyExample, named(exampleIP, 443, "example.com.evil.net", exampleIP), denied("default-deny", "")},
		{"allow single label", Policy{Allow: []string{"intranet"}}, named(otherIP, 80, "intranet", otherIP), allowed("allow-rule", "intranet")},
		{"wildcard, one label below", Policy{Allow: []string{"*.example.org"}}, named(otherIP, 443, "www.example.org", otherIP), allowed("allow-rule", "*.example.org")},
		{"wildcard, deep below", Policy{Allow: []string{"*.example.org"}}, named(otherIP, 443, "a.b.c.example.org", otherIP), allowed("allow-rule", "*.example.org")},
		{"wildcard, not the name itself", Policy{Allow: []string{"*.example.org"}}, named(otherIP, 443, "example.org", otherIP), denied("default-deny", "")},
		{"wildcard, not a suffix without a dot", Policy{Allow: []string{"*.example.org"}}, named(otherIP, 443, "evilexample.org", otherIP), denied("default-deny", "")},
		{"wildcard, not an empty label", Policy{Allow: []string{"*.example.org"}}, named(otherIP, 443, ".example.org", otherIP), denied("default-deny", "")},
		{"name with port", Policy{Allow: []string{"api.example.com:443"}}, named(otherIP, 443, "api.example.com", otherIP), allowed("allow-rule", "api.example.com:443")},
		{"name with port, other port", Policy{Allow: []string{"api.example.com:443"}}, named(otherIP, 80, "api.example.com", otherIP), denied("default-deny", "")},
		{"wildcard with port, other port", Policy{Allow: []string{"*.example.org:443"}}, named(otherIP, 8443, "a.example.org", otherIP), denied("default-deny", "")},
		{"no name, address known for an allowed name", onlyExample, known(exampleIP, 443, "example.com"), allowed("allow-rule", "example.com")},
		{"no name on a web port, address known for an allowed name", onlyExample, webKnown(exampleIP, 443, "example.com"), denied("default-deny", "")},
		{"no name on a web port, address known for a denied name", Policy{Egress: "allow", Deny: []string{"evil.com"}}, webKnown(evilIP, 80, "evil.com"), denied("deny-rule", "evil.com")},
		{"no name on a web port, address rule", Policy{Allow: []string{"203.0.113.0/24"}}, webKnown(otherIP, 80, "example.com"), allowed("allow-rule", "203.0.113.0/24")},
		{"no name on a web port, egress allow", Policy{Egress: "allow"}, webKnown(otherIP, 80), allowed("default-allow", "")},
		{"a name on a web port", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 443, Name: "example.com", NameAddrs: []netip.Addr{exampleIP}, HostRequired: true}, allowed("allow-rule", "example.com")},
		{"no name, address known for a wildcard name", Policy{Allow: []string{"*.example.org"}}, known(otherIP, 22, "other.test", "git.example.org"), allowed("allow-rule", "*.example.org")},
		{"no name, known name with other port", Policy{Allow: []string{"example.com:443"}}, known(exampleIP, 22, "example.com"), denied("default-deny", "")},
		{"no name, known names not allowed", onlyExample, known(otherIP, 443, "other.test"), denied("default-deny", "")},
		{"address as Host counts as no name", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 80, Name: "93.184.216.34", DstNames: []string{"example.com"}}, allowed("allow-rule", "example.com")},
		{"host with port", Policy{Egress: "allow", Deny: []string{"evil.com"}}, named(evilIP, 8080, "evil.com:8080", evilIP), denied("deny-rule", "evil.com")},
		{"host with empty port", Policy{Egress: "allow", Deny: []string{"evil.com"}}, named(evilIP, 80, "evil.com:", evilIP), denied("deny-rule", "evil.com")},
		{"host with port, allowed name", onlyExample, named(exampleIP, 443, "Example.com.:443", exampleIP), allowed("allow-rule", "example.com")},
		{"bracketed ipv6 host counts as no name", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 80, Name: "[::1]:80", DstNames: []string{"example.com"}}, allowed("allow-rule", "example.com")},
		{"bare ipv6 host counts as no name", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 80, Name: "::1", DstNames: []string{"example.com"}}, allowed("allow-rule", "example.com")},
		{"address with port as Host counts as no name", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 80, Name: "93.184.216.34:80", DstNames: []string{"example.com"}}, allowed("allow-rule", "example.com")},
		{"allowed name not resolved under egress allow", Policy{Egress: "allow", Allow: []string{"example.com"}}, named(otherIP, 443, "example.com", exampleIP), denied("not-resolved", "example.com")},

		// Deny entries, over allow entries and egress.
		{"deny address over egress allow", Policy{Egress: "allow", Deny: []string{"203.0.113.66"}}, tcp(evilIP, 443), denied("deny-rule", "203.0.113.66")},
		{"deny address over allow cidr", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"203.0.113.66"}}, tcp(evilIP, 443), denied("deny-rule", "203.0.113.66")},
		{"deny cidr over allow address", Policy{Allow: []string{"203.0.113.66"}, Deny: []string{"203.0.113.0/24"}}, tcp(evilIP, 443), denied("deny-rule", "203.0.113.0/24")},
		{"deny address over allow name", Policy{Allow: []string{"example.com"}, Deny: []string{"93.184.216.34"}}, named(exampleIP, 443, "example.com", exampleIP), denied("deny-rule", "93.184.216.34")},
		{"deny address with port", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"203.0.113.66:25"}}, tcp(evilIP, 25), denied("deny-rule", "203.0.113.66:25")},
		{"deny address with port, other port", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"203.0.113.66:25"}}, tcp(evilIP, 443), allowed("allow-rule", "203.0.113.0/24")},
		{"deny name over allow wildcard", Policy{Allow: []string{"*.example.org"}, Deny: []string{"evil.example.org"}}, named(otherIP, 443, "evil.example.org", otherIP), denied("deny-rule", "evil.example.org")},
		{"deny name, sibling still allowed", Policy{Allow: []string{"*.example.org"}, Deny: []string{"evil.example.org"}}, named(otherIP, 443, "good.example.org", otherIP), allowed("allow-rule", "*.example.org")},
		{"deny name over allow cidr", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"evil.com"}}, named(evilIP, 443, "evil.com", evilIP), denied("deny-rule", "evil.com")},
		{"deny name over egress allow", Policy{Egress: "allow", Deny: []string{"evil.com"}}, named(evilIP, 443, "Evil.COM.", evilIP), denied("deny-rule", "evil.com")},
		{"deny wildcard", Policy{Egress: "allow", Deny: []string{"*.evil.com"}}, named(evilIP, 443, "a.b.evil.com", evilIP), denied("deny-rule", "*.evil.com")},
		{"deny wildcard, not the apex", Policy{Egress: "allow", Deny: []string{"*.evil.com"}}, named(evilIP, 443, "evil.com", evilIP), allowed("default-allow", "")},
		{"deny name with port", Policy{Egress: "allow", Deny: []string{"evil.com:80"}}, named(evilIP, 80, "evil.com", evilIP), denied("deny-rule", "evil.com:80")},
		{"deny name with port, other port", Policy{Egress: "allow", Deny: []string{"evil.com:80"}}, named(evilIP, 443, "evil.com", evilIP), allowed("default-allow", "")},
		{"no name, address known for a denied name", Policy{Egress: "allow", Deny: []string{"evil.com"}}, known(evilIP, 22, "evil.com"), denied("deny-rule", "evil.com")},
		{"no name, one of the known names denied", Policy{Allow: []string{"example.com"}, Deny: []string{"evil.com"}}, known(evilIP, 443, "example.com", "evil.com"), denied("deny-rule", "evil.com")},
		{"deny over allow ip for a known name", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"evil.com"}}, known(evilIP, 22, "evil.com"), denied("deny-rule", "evil.com")},

		// Attack 1: a raw IP instead of a name.
		{"raw ip under a name policy", onlyExample, tcp(otherIP, 443), denied("default-deny", "")},
		{"raw ip of an allowed name, no name sent", onlyExample, known(exampleIP, 443, "example.com"), allowed("allow-rule", "example.com")},

		// Attack 2: other resolvers.
		{"tcp dns to another resolver", onlyExample, tcp(addr("8.8.8.8"), 53), denied("default-deny", "")},
		{"dns over tls to another resolver", onlyExample, tcp(addr("1.1.1.1"), 853), denied("default-deny", "")},
		{"dns over https by name", onlyExample, named(addr("8.8.8.8"), 443, "dns.google", addr("8.8.8.8")), denied("default-deny", "")},
		{"udp dns to another resolver", onlyExample, Flow{Proto: "udp", Dst: addr("8.8.8.8"), Port: 53}, denied("udp", "")},

		// Attack 4: DNS rebinding, an allowed name resolving into the always-denied set.
		{"allowed name resolving to loopback", onlyExample, named(addr("127.0.0.1"), 443, "example.com", addr("127.0.0.1")), denied("always-denied", "")},
		{"allowed wildcard resolving to metadata", Policy{Allow: []string{"*.attacker.net"}}, named(metadata, 80, "x.attacker.net", metadata), denied("always-denied", "")},
		{"allowed name resolving to private", onlyExample, named(addr("192.168.1.1"), 443, "example.com", addr("192.168.1.1")), denied("always-denied", "")},
		{"allowed name resolving to the host", onlyExample, named(hostPublic, 443, "example.com", hostPublic), denied("always-denied", "")},
		{"known name resolving to cgnat", onlyExample, known(addr("100.64.0.1"), 443, "example.com"), denied("always-denied", "")},

		// Attack 5: SNI or Host and address disagree.
		{"allowed name, address not resolved for it", onlyExample, named(otherIP, 443, "example.com", exampleIP), denied("not-resolved", "example.com")},
		{"allowed name, nothing resolved", onlyExample, named(otherIP, 443, "example.com"), denied("not-resolved", "example.com")},
		{"allowed name, address resolved for another name", onlyExample, Flow{Proto: "tcp", Dst: evilIP, Port: 443, Name: "example.com", NameAddrs: []netip.Addr{exampleIP}, DstNames: []string{"evil.com"}}, denied("not-resolved", "example.com")},

		// Attack 6 and 7: domain fronting and ECH, a name no rule names at an allowed name's address.
		{"fronting: other name to an allowed name's address", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 443, Name: "evil.com", DstNames: []string{"example.com"}}, denied("default-deny", "")},
		{"ech: generic outer name", onlyExample, Flow{Proto: "tcp", Dst: exampleIP, Port: 443, Name: "cloudflare-ech.com", DstNames: []string{"example.com"}}, denied("default-deny", "")},
		{"made-up name to a denied name's address", Policy{Egress: "allow", Deny: []string{"evil.com"}}, Flow{Proto: "tcp", Dst: evilIP, Port: 443, Name: "innocent.test", DstNames: []string{"evil.com"}}, denied("deny-rule", "evil.com")},
		{"shared address, name resolved to it", Policy{Egress: "allow", Deny: []string{"evil.com"}}, Flow{Proto: "tcp", Dst: evilIP, Port: 443, Name: "good.test", NameAddrs: []netip.Addr{evilIP}, DstNames: []string{"evil.com", "good.test"}}, allowed("default-allow", "")},
		{"unicode folding into an allowed name", onlyExample, named(exampleIP, 443, "exampl\u0435.com", exampleIP), denied("default-deny", "")},
		{"kelvin sign folding into an allowed name", Policy{Allow: []string{"ok.com"}}, named(exampleIP, 443, "o\u212a.com", exampleIP), denied("default-deny", "")},

		// Attack 8: IPv6.
		{"ipv6 loopback", egressAllow, tcp(addr("::1"), 443), denied("ipv6", "")},
		{"ipv6 global", egressAllow, tcp(addr("2606:4700::1111"), 443), denied("ipv6", "")},
		{"ipv6 link-local", egressAllow, tcp(addr("fe80::1"), 80), denied("ipv6", "")},
		{"ipv6 metadata", egressAllow, tcp(addr("fd00:ec2::254"), 80), denied("ipv6", "")},
		{"no address", egressAllow, tcp(netip.Addr{}, 443), denied("ipv6", "")},
		{"ipv4-mapped metadata judged as ipv4", egressAllow, tcp(addr("::ffff:169.254.169.254"), 80), denied("always-denied", "")},
		{"ipv4-mapped allowed address", Policy{Allow: []string{"203.0.113.50"}}, tcp(addr("::ffff:203.0.113.50"), 22), allowed("allow-rule", "203.0.113.50")},
		{"ipv4-mapped resolved address", onlyExample, named(exampleIP, 443, "example.com", addr("::ffff:93.184.216.34")), allowed("allow-rule", "example.com")},

		// Attack 9: UDP and QUIC.
		{"udp to an allowed address", Policy{Allow: []string{"203.0.113.50"}}, Flow{Proto: "udp", Dst: otherIP, Port: 443}, denied("udp", "")},
		{"quic to an allowed name", onlyExample, Flow{Proto: "udp", Dst: exampleIP, Port: 443, Name: "example.com", NameAddrs: []netip.Addr{exampleIP}}, denied("udp", "")},
		{"udp under egress allow", egressAllow, Flow{Proto: "udp", Dst: otherIP, Port: 53}, denied("udp", "")},
		{"no protocol", egressAllow, Flow{Dst: otherIP, Port: 443}, denied("udp", "")},

		// Attack 12: the always-denied set, and what opens it.
		{"metadata under egress allow", egressAllow, tcp(metadata, 80), denied("always-denied", "")},
		{"loopback under egress allow", egressAllow, tcp(addr("127.0.0.1"), 7700), denied("always-denied", "")},
		{"loopback range under egress allow", egressAllow, tcp(addr("127.1.2.3"), 22), denied("always-denied", "")},
		{"this network", egressAllow, tcp(addr("0.0.0.0"), 80), denied("always-denied", "")},
		{"private 10", egressAllow, tcp(addr("10.1.2.3"), 22), denied("always-denied", "")},
		{"private 172.16", egressAllow, tcp(addr("172.31.255.1"), 22), denied("always-denied", "")},
		{"not private 172.32", egressAllow, tcp(addr("172.32.0.1"), 22), allowed("default-allow", "")},
		{"private 192.168", egressAllow, tcp(addr("192.168.0.1"), 22), denied("always-denied", "")},
		{"cgnat", egressAllow, tcp(addr("100.100.100.100"), 22), denied("always-denied", "")},
		{"multicast", egressAllow, tcp(addr("224.0.0.251"), 5353), denied("always-denied", "")},
		{"reserved", egressAllow, tcp(addr("240.0.0.1"), 80), denied("always-denied", "")},
		{"broadcast", egressAllow, tcp(addr("255.255.255.255"), 80), denied("always-denied", "")},
		{"host public address", egressAllow, tcp(hostPublic, 7700), denied("always-denied", "")},
		{"host private address", egressAllow, tcp(hostPrivate, 22), denied("always-denied", "")},
		{"host neighbour is public", egressAllow, tcp(addr("198.51.100.2"), 22), allowed("default-allow", "")},
		{"allow 0.0.0.0/0 does not open metadata", Policy{Allow: []string{"0.0.0.0/0"}}, tcp(metadata, 80), denied("always-denied", "")},
		{"allow 0.0.0.0/0 does not open loopback", Policy{Allow: []string{"0.0.0.0/0"}}, tcp(addr("127.0.0.1"), 22), denied("always-denied", "")},
		{"allow wider than the range does not open it", Policy{Allow: []string{"10.0.0.0/7"}}, tcp(addr("10.1.2.3"), 22), denied("always-denied", "")},
		{"allow metadata literally", Policy{Allow: []string{"169.254.169.254"}}, tcp(metadata, 80), denied("always-denied", "")},
		{"allow metadata with port", Policy{Allow: []string{"169.254.169.254:80"}}, tcp(metadata, 80), denied("always-denied", "")},
		{"allow metadata with port, other port", Policy{Allow: []string{"169.254.169.254:80"}}, tcp(metadata, 443), denied("always-denied", "")},
		{"allow link-local range", Policy{Allow: []string{"169.254.0.0/16"}}, tcp(metadata, 80), denied("always-denied", "")},
		{"allow loopback", Policy{Allow: []string{"127.0.0.1:8080"}}, tcp(addr("127.0.0.1"), 8080), denied("always-denied", "")},
		{"allow cloud service address", Policy{Allow: []string{"168.63.129.16"}}, tcp(addr("168.63.129.16"), 80), denied("always-denied", "")},
		{"allow private range the operator did not open", Policy{Allow: []string{"192.168.0.0/16"}}, tcp(addr("192.168.1.1"), 22), denied("always-denied", "")},
		{"allow cgnat the operator did not open", Policy{Allow: []string{"100.64.0.0/10"}}, tcp(addr("100.64.1.1"), 22), denied("always-denied", "")},
		{"allow private range", Policy{Allow: []string{"10.0.0.0/8"}}, tcp(addr("10.1.2.3"), 5432), allowed("allow-rule", "10.0.0.0/8")},
		{"allow private subnet", Policy{Allow: []string{"10.1.0.0/16"}}, tcp(addr("10.1.2.3"), 5432), allowed("allow-rule", "10.1.0.0/16")},
		{"allow private range does not open the host in it", Policy{Allow: []string{"10.0.0.0/8"}}, tcp(hostPrivate, 22), denied("always-denied", "")},
		{"allow host subnet does not open the host", Policy{Allow: []string{"198.51.100.0/24"}}, tcp(hostPublic, 22), denied("always-denied", "")},
		{"allow host subnet opens its neighbours", Policy{Allow: []string{"198.51.100.0/24"}}, tcp(addr("198.51.100.2"), 22), allowed("allow-rule", "198.51.100.0/24")},
		{"allow host literally", Policy{Allow: []string{"198.51.100.1:8080"}}, tcp(hostPublic, 8080), denied("always-denied", "")},
		{"allow reserved range does not open broadcast", Policy{Allow: []string{"240.0.0.0/4"}}, tcp(addr("255.255.255.255"), 80), denied("always-denied", "")},
		{"name rule never opens private", Policy{Allow: []string{"db.internal"}}, named(addr("10.1.2.3"), 5432, "db.internal", addr("10.1.2.3")), denied("always-denied", "")},
		{"deny wins over a literal opening", Policy{Allow: []string{"10.0.0.0/8"}, Deny: []string{"10.9.0.0/16"}}, tcp(addr("10.9.1.1"), 22), denied("deny-rule", "10.9.0.0/16")},

		// Attack 13: the gateway's own address.
		{"gateway ssh", egressAllow, tcp(gatewayAddr, 22), denied("gateway", "")},
		{"gateway tcp dns", egressAllow, tcp(gatewayAddr, 53), denied("gateway", "")},
		{"gateway allowed literally", Policy{Allow: []string{"192.168.127.1"}}, tcp(gatewayAddr, 80), denied("gateway", "")},
		{"gateway allowed by its range", Policy{Allow: []string{"192.168.0.0/16"}}, tcp(gatewayAddr, 80), denied("gateway", "")},
		{"gateway by name", onlyExample, named(gatewayAddr, 443, "example.com", gatewayAddr), denied("gateway", "")},
		{"gateway ipv4-mapped", egressAllow, tcp(addr("::ffff:192.168.127.1"), 22), denied("gateway", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := compile(t, tt.p)
			if got := r.Decide(tt.flow); got != tt.want {
				t.Errorf("Decide(%+v) = %+v, want %+v", tt.flow, got, tt.want)
			}
		})
	}
}

func TestAllowName(t *testing.T) {
	tests := []struct {
		name  string
		p     Policy
		query string
		want  Verdict
	}{
		{"default deny", Policy{}, "example.com", denied("default-deny", "")},
		{"default allow", Policy{Egress: "allow"}, "example.com", allowed("default-allow", "")},
		{"allow name", Policy{Allow: []string{"example.com"}}, "example.com", allowed("allow-rule", "example.com")},
		{"allow name, case and trailing dot", Policy{Allow: []string{"example.com"}}, "EXAMPLE.com.", allowed("allow-rule", "example.com")},
		{"allow name, subdomain not allowed", Policy{Allow: []string{"example.com"}}, "www.example.com", denied("default-deny", "")},
		{"allow name with port", Policy{Allow: []string{"api.example.com:443"}}, "api.example.com", allowed("allow-rule", "api.example.com:443")},
		{"allow wildcard", Policy{Allow: []string{"*.example.org"}}, "a.b.example.org", allowed("allow-rule", "*.example.org")},
		{"allow wildcard, not its apex", Policy{Allow: []string{"*.example.org"}}, "example.org", denied("default-deny", "")},
		{"allow ip entries allow no names", Policy{Allow: []string{"0.0.0.0/0"}}, "example.com", denied("default-deny", "")},
		{"deny name over allow wildcard", Policy{Allow: []string{"*.example.org"}, Deny: []string{"evil.example.org"}}, "evil.example.org", denied("deny-rule", "evil.example.org")},
		{"deny name over egress allow", Policy{Egress: "allow", Deny: []string{"evil.com"}}, "evil.com.", denied("deny-rule", "evil.com")},
		{"deny wildcard", Policy{Egress: "allow", Deny: []string{"*.evil.com"}}, "x.evil.com", denied("deny-rule", "*.evil.com")},
		{"deny name with port leaves the name resolvable", Policy{Egress: "allow", Deny: []string{"evil.com:25"}}, "evil.com", allowed("default-allow", "")},
		{"deny name with port, allow name", Policy{Allow: []string{"mail.test"}, Deny: []string{"mail.test:25"}}, "mail.test", allowed("allow-rule", "mail.test")},
		{"deny ip entries deny no names", Policy{Egress: "allow", Deny: []string{"0.0.0.0/0"}}, "example.com", allowed("default-allow", "")},
		// Attack 3: DNS tunnelling through the gateway.
		{"tunnel below a name not allowed", Policy{Allow: []string{"example.com"}}, "aGVsbG8gd29ybGQ.exfil.evil.com", denied("default-deny", "")},
		{"tunnel below an allowed name's sibling", Policy{Allow: []string{"example.com"}}, "data.example.com", denied("default-deny", "")},
		{"tunnel suffix trick", Policy{Allow: []string{"example.com"}}, "data.example.com.evil.com", denied("default-deny", "")},
		{"root query", Policy{Allow: []string{"example.com"}}, ".", denied("default-deny", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := compile(t, tt.p).AllowName(tt.query); got != tt.want {
				t.Errorf("AllowName(%q) = %+v, want %+v", tt.query, got, tt.want)
			}
		})
	}
}

func TestAlwaysDenied(t *testing.T) {
	tests := []struct {
		addr      string
		want      bool
		wantRange string
	}{
		{"0.0.0.0", true, "this-network 0.0.0.0/8"},
		{"0.255.255.255", true, "this-network 0.0.0.0/8"},
		{"127.0.0.1", true, "loopback 127.0.0.0/8"},
		{"127.255.255.254", true, "loopback 127.0.0.0/8"},
		{"169.254.169.254", true, "link-local 169.254.0.0/16"},
		{"168.63.129.16", true, "cloud-service 168.63.129.16/32"},
		{"168.63.129.15", false, ""},
		{"10.0.0.1", true, "private 10.0.0.0/8"},
		{"172.16.0.1", true, "private 172.16.0.0/12"},
		{"172.31.255.255", true, "private 172.16.0.0/12"},
		{"192.168.1.1", true, "private 192.168.0.0/16"},
		{"100.64.0.1", true, "cgnat 100.64.0.0/10"},
		{"100.127.255.255", true, "cgnat 100.64.0.0/10"},
		{"224.0.0.1", true, "multicast 224.0.0.0/4"},
		{"239.255.255.250", true, "multicast 224.0.0.0/4"},
		{"240.0.0.1", true, "reserved 240.0.0.0/4"},
		{"255.255.255.255", true, "broadcast 255.255.255.255/32"},
		{"198.51.100.1", true, "host 198.51.100.1/32"},
		{"10.0.0.5", true, "host 10.0.0.5/32"},
		{"192.168.127.1", true, "gateway 192.168.127.1/32"},
		{"::ffff:127.0.0.1", true, "loopback 127.0.0.0/8"},
		{"::1", true, "ipv6"},
		{"2001:db8::1", true, "ipv6"},
		{"fe80::1", true, "ipv6"},
		{"1.1.1.1", false, ""},
		{"93.184.216.34", false, ""},
		{"100.63.255.255", false, ""},
		{"100.128.0.0", false, ""},
		{"172.15.255.255", false, ""},
		{"172.32.0.0", false, ""},
		{"169.253.255.255", false, ""},
		{"223.255.255.255", false, ""},
		{"198.51.100.2", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			got, gotRange := AlwaysDenied(addr(tt.addr), bounds)
			if got != tt.want || gotRange != tt.wantRange {
				t.Errorf("AlwaysDenied(%s) = %v, %q, want %v, %q", tt.addr, got, gotRange, tt.want, tt.wantRange)
			}
		})
	}
	if got, _ := AlwaysDenied(netip.Addr{}, Bounds{Gateway: gatewayAddr}); !got {
		t.Error("AlwaysDenied(zero Addr) = false, want true")
	}
}

func TestOpenedLiterally(t *testing.T) {
	tests := []struct {
		name  string
		allow []string
		addr  string
		port  uint16
		want  bool
	}{
		{"no entries", nil, "10.1.2.3", 0, false},
		{"address", []string{"10.1.2.3"}, "10.1.2.3", 0, true},
		{"address, other address", []string{"10.1.2.3"}, "10.1.2.4", 0, false},
		{"range", []string{"10.0.0.0/8"}, "10.1.2.3", 0, true},
		{"subnet", []string{"10.1.2.0/24"}, "10.1.2.3", 0, true},
		{"wider than the range", []string{"0.0.0.0/0"}, "10.1.2.3", 0, false},
		{"wider than metadata's range", []string{"169.0.0.0/8"}, "169.254.169.254", 0, false},
		{"metadata", []string{"169.254.169.254"}, "169.254.169.254", 0, false},
		{"loopback", []string{"127.0.0.1"}, "127.0.0.1", 0, false},
		{"cloud service address", []string{"168.63.129.16"}, "168.63.129.16", 0, false},
		{"private range not opened", []string{"172.16.0.0/12"}, "172.16.1.1", 0, false},
		{"cgnat not opened", []string{"100.64.0.1"}, "100.64.0.1", 0, false},
		{"with port, any port asked", []string{"10.1.2.3:5432"}, "10.1.2.3", 0, true},
		{"with port, that port asked", []string{"10.1.2.3:5432"}, "10.1.2.3", 5432, true},
		{"with port, other port asked", []string{"10.1.2.3:5432"}, "10.1.2.3", 22, false},
		{"without port, a port asked", []string{"10.1.2.3"}, "10.1.2.3", 22, true},
		{"public address covered", []string{"0.0.0.0/0"}, "1.1.1.1", 0, true},
		{"public address not covered", []string{"10.0.0.0/8"}, "1.1.1.1", 0, false},
		{"host address by its subnet", []string{"198.51.100.0/24"}, "198.51.100.1", 0, false},
		{"host address literally", []string{"198.51.100.1"}, "198.51.100.1", 0, false},
		{"host address in a private range", []string{"10.0.0.0/8"}, "10.0.0.5", 0, false},
		{"gateway literally", []string{"192.168.127.1"}, "192.168.127.1", 0, false},
		{"gateway literally with port", []string{"192.168.127.1:80"}, "192.168.127.1", 80, false},
		{"ipv6", []string{"0.0.0.0/0"}, "::1", 0, false},
		{"ipv4-mapped", []string{"10.1.2.3"}, "::ffff:10.1.2.3", 0, true},
		{"name entries do not open", []string{"db.internal", "*.internal"}, "10.1.2.3", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := compile(t, Policy{Allow: tt.allow})
			if got := r.OpenedLiterally(addr(tt.addr), tt.port); got != tt.want {
				t.Errorf("OpenedLiterally(%s, %d) = %v, want %v", tt.addr, tt.port, got, tt.want)
			}
		})
	}
}

func TestPrecheck(t *testing.T) {
	tests := []struct {
		name     string
		p        Policy
		dst      netip.Addr
		port     uint16
		dstNames []string
		wantDeny bool
		want     Verdict
	}{
		{"no rules", Policy{}, otherIP, 443, nil, true, denied("default-deny", "")},
		{"egress allow", Policy{Egress: "allow"}, otherIP, 443, nil, false, allowed("default-allow", "")},
		{"raw ip under a name policy at the name's port", Policy{Allow: []string{"example.com"}}, otherIP, 443, nil, false, denied("default-deny", "")},
		{"raw ip under a name policy at another port", Policy{Allow: []string{"example.com:443"}}, otherIP, 22, nil, true, denied("default-deny", "")},
		{"allowed ip", Policy{Allow: []string{"203.0.113.0/24"}}, otherIP, 22, nil, false, allowed("allow-rule", "203.0.113.0/24")},
		{"denied ip", Policy{Egress: "allow", Deny: []string{"203.0.113.50"}}, otherIP, 22, nil, true, denied("deny-rule", "203.0.113.50")},
		{"known name allowed", Policy{Allow: []string{"example.com"}}, exampleIP, 443, []string{"example.com"}, false, allowed("allow-rule", "example.com")},
		{"known name denied, another name could pass", Policy{Egress: "allow", Deny: []string{"evil.com"}}, evilIP, 443, []string{"evil.com"}, false, denied("deny-rule", "evil.com")},
		{"metadata", Policy{Egress: "allow", Allow: []string{"*.example.org"}}, metadata, 80, []string{"x.example.org"}, true, denied("always-denied", "")},
		{"metadata named", Policy{Allow: []string{"169.254.169.254:80"}}, metadata, 80, nil, true, denied("always-denied", "")},
		{"private opened", Policy{Allow: []string{"10.1.2.3:80"}}, addr("10.1.2.3"), 80, nil, false, allowed("allow-rule", "10.1.2.3:80")},
		{"gateway", Policy{Egress: "allow"}, gatewayAddr, 22, nil, true, denied("gateway", "")},
		{"ipv6", Policy{Egress: "allow"}, addr("::1"), 22, nil, true, denied("ipv6", "")},
		{"every allowed name denied", Policy{Allow: []string{"a.test", "*.b.test"}, Deny: []string{"a.test", "*.test"}}, otherIP, 443, nil, true, denied("default-deny", "")},
		{"allowed wildcard denied on its port", Policy{Allow: []string{"*.b.test"}, Deny: []string{"*.b.test:443"}}, otherIP, 443, nil, true, denied("default-deny", "")},
		{"allowed wildcard denied on another port", Policy{Allow: []string{"*.b.test"}, Deny: []string{"*.b.test:443"}}, otherIP, 80, nil, false, denied("default-deny", "")},
		{"allowed wildcard, some names denied", Policy{Allow: []string{"*.b.test"}, Deny: []string{"x.b.test", "*.y.b.test"}}, otherIP, 443, nil, false, denied("default-deny", "")},
		{"allowed apex, wildcard denied", Policy{Allow: []string{"b.test"}, Deny: []string{"*.b.test"}}, otherIP, 443, nil, false, denied("default-deny", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotDeny, got := compile(t, tt.p).Precheck(tt.dst, tt.port, tt.dstNames)
			if gotDeny != tt.wantDeny || got != tt.want {
				t.Errorf("Precheck(%s, %d, %q) = %v, %+v, want %v, %+v", tt.dst, tt.port, tt.dstNames, gotDeny, got, tt.wantDeny, tt.want)
			}
		})
	}
}

func TestNeedsName(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		dst  netip.Addr
		port uint16
		want bool
	}{
		{"no rules", Policy{}, otherIP, 443, false},
		{"egress allow, no rules", Policy{Egress: "allow"}, otherIP, 443, false},
		{"ip rules only", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"203.0.113.66"}}, otherIP, 22, false},
		{"allow name", Policy{Allow: []string{"example.com"}}, otherIP, 443, true},
		{"allow name on another port", Policy{Allow: []string{"example.com:443"}}, otherIP, 22, false},
		{"allow name, egress allow", Policy{Egress: "allow", Allow: []string{"example.com"}}, otherIP, 443, true},
		{"deny name, egress allow", Policy{Egress: "allow", Deny: []string{"evil.com"}}, otherIP, 443, true},
		{"deny name on another port, egress allow", Policy{Egress: "allow", Deny: []string{"evil.com:443"}}, otherIP, 22, false},
		{"deny name only, egress deny", Policy{Deny: []string{"evil.com"}}, otherIP, 443, false},
		{"allowed ip, no deny names", Policy{Allow: []string{"203.0.113.0/24", "example.com"}}, otherIP, 443, false},
		{"allowed ip, a deny name", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"evil.com"}}, otherIP, 443, true},
		{"allowed ip, a deny name on another port", Policy{Allow: []string{"203.0.113.0/24"}, Deny: []string{"evil.com:80"}}, otherIP, 443, false},
		{"denied ip", Policy{Allow: []string{"example.com"}, Deny: []string{"203.0.113.50"}}, otherIP, 443, false},
		{"always denied", Policy{Egress: "allow", Allow: []string{"example.com"}, Deny: []string{"evil.com"}}, metadata, 80, false},
		{"private, opened, a deny name", Policy{Allow: []string{"10.1.2.3"}, Deny: []string{"evil.com"}}, addr("10.1.2.3"), 80, true},
		{"metadata named, a deny name", Policy{Allow: []string{"169.254.169.254"}, Deny: []string{"evil.com"}}, metadata, 80, false},
		{"gateway", Policy{Egress: "allow", Allow: []string{"example.com"}}, gatewayAddr, 443, false},
		{"ipv6", Policy{Allow: []string{"example.com"}}, addr("::1"), 443, false},
		{"allowed names all denied by a wildcard", Policy{Allow: []string{"a.test"}, Deny: []string{"*.test"}}, otherIP, 443, false},
		{"allowed names all denied by exact name", Policy{Allow: []string{"a.test"}, Deny: []string{"a.test"}}, otherIP, 443, false},
		{"allowed names denied on their port only", Policy{Allow: []string{"a.test"}, Deny: []string{"a.test:80"}}, otherIP, 443, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := compile(t, tt.p).NeedsName(tt.dst, tt.port); got != tt.want {
				t.Errorf("NeedsName(%s, %d) = %v, want %v", tt.dst, tt.port, got, tt.want)
			}
		})
	}
}

// TestPrecheckAgreesWithDecide checks, over random policies and flows, that
// Precheck and NeedsName never contradict Decide: when Precheck denies, no
// name and no resolution make Decide allow; when NeedsName is false, no name
// changes Decide's answer; Precheck's verdict is Decide's without a name; and
// when Precheck does not deny, some name makes Decide allow.
func TestPrecheckAgreesWithDecide(t *testing.T) {
	entries := []string{
		"a.example", "b.example", "x.a.example", "example", "evil.test", "other.test",
		"*.example", "*.a.example", "*.test", "a.example:443", "*.example:80", "evil.test:443",
		"203.0.113.1", "203.0.113.0/24", "203.0.113.2:443", "10.0.0.0/8", "0.0.0.0/0",
		"169.254.169.254:80", "198.51.100.1", "198.51.100.0/24:443", "192.168.127.1",
	}
	names := []string{
		"", "a.example", "b.example", "c.example", "d.example", "x.a.example", "y.a.example",
		"z.a.example", "example", "evil.test", "other.test", "e.test", "fresh.invalid", "203.0.113.1",
	}
	dsts := []netip.Addr{
		addr("203.0.113.1"), addr("203.0.113.2"), addr("203.0.113.3"), addr("10.0.0.1"), metadata,
		gatewayAddr, hostPublic, addr("198.51.100.2"), addr("8.8.8.8"), addr("::1"),
	}
	ports := []uint16{22, 80, 443}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(pool []string, n int) []string {
		var out []string
		for range rng.IntN(n + 1) {
			out = append(out, pool[rng.IntN(len(pool))])
		}
		return out
	}
	for i := range 400 {
		p := Policy{Allow: pick(entries, 4), Deny: pick(entries, 3)}
		if rng.IntN(2) == 0 {
			p.Egress = "allow"
		}
		r := compile(t, p)
		for _, dst := range dsts {
			for _, port := range ports {
				dstNamesSets := [][]string{nil, pick(names[1:], 2), pick(names[1:], 3)}
				needs := r.NeedsName(dst, port)
				var nameless []bool
				for _, dstNames := range dstNamesSets {
					deny, v := r.Precheck(dst, port, dstNames)
					where := fmt.Sprintf("policy %d %+v, flow to %s:%d known as %q", i, p, dst, port, dstNames)
					if want := r.Decide(known(dst, port, dstNames...)); v != want {
						t.Fatalf("%s: Precheck verdict %+v, Decide without a name %+v", where, v, want)
					}
					if deny && v.Allow {
						t.Fatalf("%s: Precheck denies with an allowing verdict %+v", where, v)
					}
					nameless = append(nameless, v.Allow)
					someAllow := v.Allow
					for _, name := range names {
						for _, resolved := range [][]netip.Addr{nil, {dst}} {
							f := Flow{Proto: "tcp", Dst: dst, Port: port, Name: name, NameAddrs: resolved, DstNames: dstNames}
							got := r.Decide(f)
							someAllow = someAllow || got.Allow
							if deny && got.Allow {
								t.Fatalf("%s: Precheck denies, Decide(%+v) = %+v", where, f, got)
							}
							if !needs && got.Allow != v.Allow {
								t.Fatalf("%s: NeedsName false, Decide(%+v) = %+v but without a name %+v", where, f, got, v)
							}
						}
					}
					if !deny && !someAllow {
						t.Fatalf("%s: Precheck does not deny, yet no name makes Decide allow", where)
					}
				}
				if !needs && (nameless[0] != nameless[1] || nameless[0] != nameless[2]) {
					t.Fatalf("policy %d %+v, %s:%d: NeedsName false, yet DstNames change the verdict", i, p, dst, port)
				}
			}
		}
	}
}

func TestCredentials(t *testing.T) {
	p := Policy{
		Allow: []string{"api.example.com"},
		Credentials: []Credential{
			{Host: "API.Example.com.", Header: "Authorization", Secret: "openai", Format: "Bearer {}"},
			{Host: "other.example.com", Header: "X-Key", Secret: "other"},
			{Host: "api.example.com", Header: "OpenAI-Organization", Secret: "org"},
		},
	}
	r := compile(t, p)
	tests := []struct {
		host string
		want []Credential
	}{
		{"api.example.com", []Credential{
			{Host: "api.example.com", Header: "Authorization", Secret: "openai", Format: "Bearer {}"},
			{Host: "api.example.com", Header: "OpenAI-Organization", Secret: "org", Format: "{}"},
		}},
		{"API.example.com.", []Credential{
			{Host: "api.example.com", Header: "Authorization", Secret: "openai", Format: "Bearer {}"},
			{Host: "api.example.com", Header: "OpenAI-Organization", Secret: "org", Format: "{}"},
		}},
		{"other.example.com", []Credential{{Host: "other.example.com", Header: "X-Key", Secret: "other", Format: "{}"}}},
		{"example.com", nil},
		{"x.api.example.com", nil},
		{"api.example.com.evil.com", nil},
		{"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			if got := r.Credentials(tt.host); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Credentials(%q) = %+v, want %+v", tt.host, got, tt.want)
			}
		})
	}
	r.Credentials("api.example.com")[0].Secret = "changed"
	if got := r.Credentials("api.example.com")[0].Secret; got != "openai" {
		t.Errorf("changing a returned credential changed the rules: secret %q", got)
	}
}

func TestCompile(t *testing.T) {
	t.Run("invalid policy", func(t *testing.T) {
		_, err := Compile(Policy{Allow: []string{"10.0.0.0/33"}}, bounds)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `network.allow[0] "10.0.0.0/33"`) {
			t.Fatalf("error %v, want ErrInvalid naming the entry", err)
		}
	})
	for _, gw := range []netip.Addr{{}, addr("fe80::1")} {
		t.Run("gateway "+gw.String(), func(t *testing.T) {
			if _, err := Compile(Policy{}, Bounds{Gateway: gw}); !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error %v, want ErrInvalid", err)
			}
		})
	}
	t.Run("ipv4-mapped gateway", func(t *testing.T) {
		r, err := Compile(Policy{Egress: "allow"}, Bounds{Gateway: addr("::ffff:192.168.127.1")})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Decide(tcp(gatewayAddr, 80)); got.Reason != "gateway" {
			t.Fatalf("Decide to the gateway = %+v, want reason gateway", got)
		}
	})
	t.Run("host addresses copied", func(t *testing.T) {
		hosts := []netip.Addr{hostPublic}
		r, err := Compile(Policy{Egress: "allow"}, Bounds{Gateway: gatewayAddr, Host: hosts})
		if err != nil {
			t.Fatal(err)
		}
		hosts[0] = otherIP
		if got := r.Decide(tcp(hostPublic, 80)); got.Reason != "always-denied" {
			t.Fatalf("Decide to the host = %+v, want always-denied", got)
		}
	})
	t.Run("policy normalized and copied", func(t *testing.T) {
		p := Policy{Allow: []string{"Example.COM."}, Deny: []string{"Evil.com"}, Credentials: []Credential{{Host: "Example.com", Header: "X-Key", Secret: "s"}}}
		r := compile(t, p)
		want := Policy{Egress: "deny", Allow: []string{"example.com"}, Deny: []string{"evil.com"}, Credentials: []Credential{{Host: "example.com", Header: "X-Key", Secret: "s", Format: "{}"}}}
		got := r.Policy()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Policy() = %+v, want %+v", got, want)
		}
		got.Allow[0], got.Deny[0], got.Credentials[0].Secret = "x.test", "y.test", "z"
		p.Allow[0] = "changed.test"
		if again := r.Policy(); !reflect.DeepEqual(again, want) {
			t.Fatalf("Policy() after changing copies = %+v, want %+v", again, want)
		}
		if got := r.Decide(named(exampleIP, 443, "example.com", exampleIP)); !got.Allow {
			t.Fatalf("Decide after changing the source policy = %+v, want allowed", got)
		}
	})
}

// TestRulesConcurrent runs every method of one Rules at once; the race
// detector checks that none of them writes.
func TestRulesConcurrent(t *testing.T) {
	r := compile(t, Policy{
		Allow:       []string{"example.com", "*.example.org", "203.0.113.0/24", "169.254.169.254:80"},
		Deny:        []string{"evil.example.org", "203.0.113.66"},
		Credentials: []Credential{{Host: "example.com", Header: "Authorization", Secret: "s"}},
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				r.Decide(named(exampleIP, 443, "example.com", exampleIP))
				r.Decide(known(evilIP, 443, "evil.example.org"))
				r.NeedsName(otherIP, 443)
				r.Precheck(metadata, 80, nil)
				r.AllowName("www.example.org")
				r.OpenedLiterally(metadata, 0)
				r.Credentials("example.com")
				r.Policy()
			}
		})
	}
	wg.Wait()
}

// TestBoundsCheck names each range no policy may open, and the private
// ones the operator did not, as a user's allow entry: each is refused with
// ErrPermission naming it.
func TestBoundsCheck(t *testing.T) {
	b := Bounds{Gateway: gatewayAddr, Host: hostAddrs, Private: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	refused := []struct{ entry, says string }{
		{"127.0.0.1", "loopback 127.0.0.0/8"},
		{"127.0.0.0/8:22", "loopback 127.0.0.0/8"},
		{"169.254.169.254", "link-local 169.254.0.0/16"},
		{"169.254.169.254:80", "link-local"},
		{"169.254.0.0/16", "link-local"},
		{"168.63.129.16", "cloud-service"},
		{"0.0.0.0", "this-network"},
		{"224.0.0.1", "multicast"},
		{"255.255.255.255", "broadcast"},
		{"240.0.0.0/4", "reserved"},
		{"198.51.100.1", "an address of the host's"},
		{"198.51.100.1:8080", "an address of the host's"},
		{"192.168.127.1", "the gateway's own address"},
		{"192.168.1.1", "private 192.168.0.0/16 is closed on this server"},
		{"172.16.0.0/12", "private 172.16.0.0/12 is closed"},
		{"100.64.0.1", "cgnat 100.64.0.0/10 is closed"},
		{"10.2.0.1", "private 10.0.0.0/8 is closed"},
		{"10.0.0.0/8", "private 10.0.0.0/8 is closed"}, // wider than what was opened
	}
	for _, tt := range refused {
		t.Run(tt.entry, func(t *testing.T) {
			p := Policy{Egress: "deny", Allow: []string{"example.com", tt.entry}}
			err := b.Check(p, "network")
			if !errors.Is(err, errdefs.ErrPermission) || !strings.Contains(err.Error(), fmt.Sprintf("network.allow[1] %q", tt.entry)) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Check(%q) = %v, want ErrPermission naming the entry and %q", tt.entry, err, tt.says)
			}
		})
	}
	for _, entry := range []string{"10.1.2.3", "10.1.0.0/16", "10.1.2.0/24:5432", "0.0.0.0/0", "8.8.8.8", "198.51.100.0/24", "example.com", "*.internal"} {
		p := Policy{Allow: []string{entry}, Deny: []string{"127.0.0.1", "169.254.169.254", "10.0.0.0/8"}}
		if err := b.Check(p, "network"); err != nil {
			t.Errorf("Check(allow %q) = %v, want it accepted", entry, err)
		}
	}
	// What the operator did not open stays shut to entries that got past
	// Check when it was wider.
	r, err := Compile(Policy{Allow: []string{"10.0.0.0/8"}}, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Decide(tcp(addr("10.2.0.1"), 22)); got.Allow {
		t.Errorf("Decide to 10.2.0.1 outside the opened 10.1.0.0/16 = %+v, want denied", got)
	}
	if got := r.Decide(tcp(addr("10.1.0.1"), 22)); !got.Allow {
		t.Errorf("Decide to 10.1.0.1 inside the opened 10.1.0.0/16 = %+v, want allowed", got)
	}
}

func TestParsePrivate(t *testing.T) {
	got, err := ParsePrivate(" 10.1.0.0/16, 192.168.5.7,100.64.0.0/10,172.16.9.9/12")
	want := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("192.168.5.7/32"),
		netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("172.16.0.0/12")}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParsePrivate = %v, %v; want %v", got, err, want)
	}
	if got, err := ParsePrivate(""); err != nil || got != nil {
		t.Fatalf("ParsePrivate(\"\") = %v, %v", got, err)
	}
	for _, bad := range []string{"127.0.0.0/8", "169.254.169.254", "0.0.0.0/0", "10.0.0.0/7", "8.8.8.8", "fd00::/8", "10.0.0.0/33", "nope", "10.1.0.0/16,x"} {
		if _, err := ParsePrivate(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParsePrivate(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
