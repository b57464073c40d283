package e2b

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

func TestEgressPolicy(t *testing.T) {
	no, yes := false, true
	for _, c := range []struct {
		name              string
		internet          *bool
		allowOut, denyOut []string
		want              string // the policy as JSON, or "error: <text in it>"
	}{
		{"E2B's default: open", nil, nil, nil, `{"egress":"allow"}`},
		{"internet allowed", &yes, nil, nil, `{"egress":"allow"}`},
		{"no internet", &no, nil, nil, `{"egress":"deny"}`},
		{"deny all", nil, nil, []string{"0.0.0.0/0"}, `{"egress":"deny"}`},
		{"deny all but names and blocks", nil, []string{"pypi.org", "*.github.com", "8.8.8.8", "1.2.3.0/24"}, []string{"0.0.0.0/0"},
			`{"egress":"deny","allow":["pypi.org","*.github.com","8.8.8.8","1.2.3.0/24"]}`},
		{"no internet but names", &no, []string{"PyPI.org."}, nil, `{"egress":"deny","allow":["pypi.org"]}`},
		// allowOut wins over denyOut: a deny entry besides 0.0.0.0/0 adds
		// nothing, and must not block what allowOut opens.
		{"allow wins over a narrower deny", nil, []string{"1.2.3.0/24"}, []string{"0.0.0.0/0", "1.2.3.4"},
			`{"egress":"deny","allow":["1.2.3.0/24"]}`},
		{"deny blocks", nil, nil, []string{"203.0.113.0/24", "198.51.100.7/32"},
			`{"egress":"allow","deny":["203.0.113.0/24","198.51.100.7"]}`},
		{"allow cuts a hole in a deny block", nil, []string{"10.0.0.128/25"}, []string{"10.0.0.0/24"},
			`{"egress":"allow","allow":["10.0.0.128/25"],"deny":["10.0.0.0/25"]}`},
		{"allow covers a deny block", nil, []string{"10.0.0.0/8"}, []string{"10.1.0.0/16", "192.0.2.1"},
			`{"egress":"allow","allow":["10.0.0.0/8"],"deny":["192.0.2.1"]}`},
		{"an address out of a block", nil, []string{"192.0.2.5"}, []string{"192.0.2.4/30"},
			`{"egress":"allow","allow":["192.0.2.5"],"deny":["192.0.2.6/31","192.0.2.4"]}`},
		{"a domain needs deny all", nil, []string{"pypi.org"}, nil, "error: network.allowOut[0] \"pypi.org\": a domain in allowOut needs \"0.0.0.0/0\""},
		{"a domain needs deny all, not a block", nil, []string{"pypi.org"}, []string{"10.0.0.0/8"}, "error: needs \"0.0.0.0/0\""},
		{"no domains in deny", nil, nil, []string{"evil.example"}, "error: network.denyOut[0] \"evil.example\": denyOut takes CIDR blocks and IP addresses only"},
		{"not a name", &no, []string{"exa mple.com"}, nil, "error: network.allowOut[0] \"exa mple.com\": not a CIDR block, an IP address or a domain name"},
		{"no ports", &no, []string{"pypi.org:443"}, nil, "error: takes no port"},
		{"no IPv6 allow", &no, []string{"2001:db8::1"}, nil, "error: IPv6"},
		{"no IPv6 deny", nil, nil, []string{"::/0"}, "error: IPv6"},
		{"bad CIDR", nil, nil, []string{"10.0.0.0/33"}, "error: not a CIDR block"},
		{"empty entry", nil, []string{""}, nil, "error: empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := egressPolicy("network", c.internet, c.allowOut, c.denyOut)
			if want, ok := strings.CutPrefix(c.want, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want one saying %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Validate(); err != nil {
				t.Errorf("the policy is not valid for airlock: %v", err)
			}
			if b, _ := json.Marshal(p); string(b) != c.want {
				t.Errorf("policy %s, want %s", b, c.want)
			}
		})
	}
}

// TestEgressPolicyTooMany: cutting many holes makes more blocks than a
// policy holds, and the request is refused rather than cut short.
func TestEgressPolicyTooMany(t *testing.T) {
	var allow []string
	for i := 0; i < 20; i++ {
		allow = append(allow, netip.AddrFrom4([4]byte{10, byte(i), 0, 1}).String())
	}
	_, err := egressPolicy("network", nil, allow, []string{"10.0.0.0/8"})
	if err == nil || !strings.Contains(err.Error(), "cannot express") {
		t.Fatalf("error %v", err)
	}
}

func TestSubtract(t *testing.T) {
	pp := netip.MustParsePrefix
	for _, c := range []struct {
		d, a string
		want string
	}{
		{"10.0.0.0/8", "192.168.0.0/16", "10.0.0.0/8"},
		{"10.0.0.0/8", "0.0.0.0/0", ""},
		{"10.0.0.0/8", "10.0.0.0/8", ""},
		{"10.0.0.0/8", "10.0.0.0/9", "10.128.0.0/9"},
		{"0.0.0.0/0", "128.0.0.0/1", "0.0.0.0/1"},
		{"10.0.0.0/30", "10.0.0.2/32", "10.0.0.0/31 10.0.0.3/32"},
	} {
		var got []string
		for _, p := range subtract(pp(c.d), pp(c.a)) {
			got = append(got, p.String())
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s - %s = %v, want %s", c.d, c.a, got, c.want)
		}
	}
	// Whatever is cut, the pieces and the hole make up the block exactly.
	d, a := pp("172.16.0.0/12"), pp("172.20.33.64/27")
	size := func(p netip.Prefix) uint64 { return 1 << (32 - p.Bits()) }
	total := size(a)
	for _, p := range subtract(d, a) {
		if !d.Contains(p.Addr()) || p.Overlaps(a) {
			t.Errorf("piece %s is outside %s or overlaps %s", p, d, a)
		}
		total += size(p)
	}
	if total != size(d) {
		t.Errorf("pieces cover %d addresses, want %d", total, size(d))
	}
}

func TestViewNetwork(t *testing.T) {
	for _, c := range []struct {
		stored, want string
		internet     string
	}{
		{`{"egress":"allow"}`, `{"allowPublicTraffic":true}`, "true"},
		{`{"egress":"deny"}`, `{"allowPublicTraffic":true,"denyOut":["0.0.0.0/0"]}`, "false"},
		{`{"egress":"deny","allow":["pypi.org"]}`, `{"allowPublicTraffic":true,"allowOut":["pypi.org"],"denyOut":["0.0.0.0/0"]}`, "null"},
		{`{"egress":"allow","deny":["1.2.3.4"]}`, `{"allowPublicTraffic":true,"denyOut":["1.2.3.4"]}`, "true"},
	} {
		v, internet := viewNetwork(json.RawMessage(c.stored))
		b, _ := json.Marshal(v)
		ib, _ := json.Marshal(internet)
		if string(b) != c.want || string(ib) != c.internet {
			t.Errorf("%s: %s %s, want %s %s", c.stored, b, ib, c.want, c.internet)
		}
	}
}

// TestCreateNetworkDefault checks that a create saying nothing of egress
// leaves the policy to the server's --default-egress, and that one saying
// anything gets E2B's meaning.
func TestCreateNetworkDefault(t *testing.T) {
	yes := true
	tests := []struct {
		name string
		req  newSandbox
		want string
	}{
		{"nothing said", newSandbox{TemplateID: "base"}, ""},
		{"internet allowed", newSandbox{TemplateID: "base", AllowInternetAccess: &yes}, `{"egress":"allow"}`},
		{"allowOut", newSandbox{TemplateID: "base", Network: &createNetwork{AllowOut: []string{"8.8.8.8"}, DenyOut: []string{"0.0.0.0/0"}}}, `{"egress":"deny","allow":["8.8.8.8"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := createRequest(tt.req, true)
			if err != nil {
				t.Fatal(err)
			}
			if string(in.Network) != tt.want {
				t.Fatalf("network %s, want %q", in.Network, tt.want)
			}
		})
	}
}
