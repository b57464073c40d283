package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// netEnv is what the network tests share: one test host, one DNS
// upstream, and one server whose gateways use them.
type netEnv struct {
	tn  *testNet
	srv *server
}

var (
	netOnce   sync.Once
	netShared *netEnv
	netErr    error
)

// sharedNet starts the network tests' server the first time it is asked
// for. Its test host lives as long as the test binary.
func sharedNet(t *testing.T) *netEnv {
	t.Helper()
	netOnce.Do(func() {
		// newTestNet fails the first test that asks with its reason; the
		// others get this.
		netErr = errors.New("the network tests' test host could not be made: see the first test that asked for it")
		// The namespace and servers outlive the first test that asks.
		tn := newTestNet(&cleanupLater{T: t})
		srv, err := launchServer(tn.serverEnv(), tn.serverArgs()...)
		netShared, netErr = &netEnv{tn: tn, srv: srv}, err
	})
	if netErr != nil {
		t.Fatalf("start the network tests' server: %v", netErr)
	}
	return netShared
}

// cleanupLater is a testing.T whose cleanups run when the test binary
// ends (TestMain), not when the first test that used it does.
type cleanupLater struct{ *testing.T }

func (c *cleanupLater) Cleanup(f func()) { laterCleanups = append(laterCleanups, f) }

// TempDir is not tied to the test either.
func (c *cleanupLater) TempDir() string {
	d, err := os.MkdirTemp("", "alnet")
	if err != nil {
		c.T.Fatal(err)
	}
	laterCleanups = append(laterCleanups, func() { os.RemoveAll(d) })
	return d
}

// laterCleanups run in TestMain after every test.
var laterCleanups []func()

// serverEnv makes the server trust the test host's CA for upstreams.
func (tn *testNet) serverEnv() []string { return []string{"SSL_CERT_FILE=" + tn.caFile} }

// serverArgs point the server's gateways at the test DNS, and open the
// test host's private range.
func (tn *testNet) serverArgs() []string {
	return []string{"--ping-interval", "1s", "--dns-upstream", tn.dns.addr, "--egress-private", tn.privateNet.String()}
}

// netSandbox creates a sandbox of the base template (python3 runs the
// probes) with policy, and puts the probe scripts and the test CA in it.
func (ne *netEnv) netSandbox(t *testing.T, key string, policy any) apiv1.Sandbox {
	t.Helper()
	raw, err := json.Marshal(policy)
	if err != nil {
		t.Fatal(err)
	}
	sb := ne.srv.createSandbox(t, key, apiv1.CreateSandbox{Template: "base", Network: raw})
	for _, f := range []struct{ src, dst string }{
		{"testdata/netprobe.py", "/root/netprobe.py"},
		{"testdata/guestserver.py", "/root/guestserver.py"},
		{ne.tn.caFile, "/root/test-ca.pem"},
	} {
		b, err := os.ReadFile(f.src)
		if err != nil {
			t.Fatal(err)
		}
		ne.srv.must(t, 204, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path="+f.dst, key, b, nil)
	}
	return sb
}

// probe is one check of netprobe.py and its result.
type probe map[string]any

// probes runs checks in the sandbox, all in one python process, and
// returns their results in order.
func (ne *netEnv) probes(t *testing.T, key, sbx string, checks []probe) []probe {
	t.Helper()
	b, err := json.Marshal(checks)
	if err != nil {
		t.Fatal(err)
	}
	var res apiv1.ExecResult
	ne.srv.must(t, 200, "POST", "/v1/sandboxes/"+sbx+"/exec", key, apiv1.CommandRequest{Argv: []string{"python3", "/root/netprobe.py", string(b)}, TimeoutS: 240}, &res)
	if res.ExitCode != 0 {
		t.Fatalf("netprobe exited %d: %s %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	var out []probe
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &out); err != nil || len(out) != len(checks) {
		t.Fatalf("netprobe output %q: %v", res.Stdout, err)
	}
	return out
}

func (p probe) ok() bool             { v, _ := p["ok"].(bool); return v }
func (p probe) str(k string) string  { v, _ := p[k].(string); return v }
func (p probe) num(k string) float64 { v, _ := p[k].(float64); return v }

// TestNetworkPolicy checks what a policy lets through and what it stops,
// from inside a guest as root, with the bypasses a guest would try: raw
// addresses, other resolvers, names the policy does not allow, SNI and
// Host that differ from what was resolved, IPv6, UDP and QUIC, ICMP, the
// metadata address, the host's own addresses and the gateway itself.
func TestNetworkPolicy(t *testing.T) {
	ne := sharedNet(t)
	tn, s := ne.tn, ne.srv
	ip, other := tn.ip.String(), tn.other.String()

	// A listener on one of the host's own addresses: the guest must never
	// reach it.
	hostLn, err := net.Listen("tcp", net.JoinHostPort(tn.hostIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	var hostHits atomic.Int32
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			hostHits.Add(1)
			c.Close()
		}
	}()
	hostPort := hostLn.Addr().(*net.TCPAddr).Port

	sb := ne.netSandbox(t, s.key, map[string]any{
		"egress": "deny",
		"allow":  []string{"allowed.test", "*.wild.test", "rebind.test", fmt.Sprintf("%s:%d", other, netEchoPort), tn.private.String()},
		"deny":   []string{"bad.wild.test"},
	})
	if !strings.Contains(string(sb.Network), `"allowed.test"`) {
		t.Errorf("the sandbox does not echo its policy: %s", sb.Network)
	}
	echoes := tn.icmpEchoes(t)
	type check struct {
		name   string
		probe  probe
		expect func(p probe) string // "" when the result is right
	}
	fails := func(p probe) string {
		if p.ok() {
			return fmt.Sprintf("succeeded: %v", p)
		}
		return ""
	}
	body := func(want string) func(p probe) string {
		return func(p probe) string {
			if !p.ok() || !strings.Contains(p.str("body"), want) {
				return fmt.Sprintf("want a body with %q: %v", want, p)
			}
			return ""
		}
	}
	addrs := func(want string) func(p probe) string {
		return func(p probe) string {
			got, _ := json.Marshal(p["addrs"])
			if want == "" {
				if p.ok() && string(got) != "[]" && string(got) != "null" {
					return "resolved to " + string(got)
				}
				return ""
			}
			if string(got) != `["`+want+`"]` {
				return fmt.Sprintf("want [%s]: %v", want, p)
			}
			return ""
		}
	}
	unanswered := func(p probe) string {
		if p.ok() && p["answered"] == true {
			return "answered"
		}
		return ""
	}
	checks := []check{
		{"dns allowed name", probe{"op": "dns", "name": "allowed.test"}, addrs(ip)},
		{"dns denied name", probe{"op": "dns", "name": "denied.test"}, addrs("")},
		{"dns wildcard", probe{"op": "dns", "name": "x.wild.test"}, addrs(ip)},
		{"dns wildcard's own name", probe{"op": "dns", "name": "wild.test"}, addrs("")},
		{"dns denied under a wildcard", probe{"op": "dns", "name": "bad.wild.test"}, addrs("")},
		{"dns rebinding to loopback and metadata", probe{"op": "dns", "name": "rebind.test"}, addrs("")},
		{"dns no AAAA", probe{"op": "dns6", "name": "allowed.test"}, addrs("")},
		{"http allowed host", probe{"op": "http", "ip": ip, "port": 80, "host": "allowed.test"}, body("hello from allowed.test")},
		{"https allowed sni", probe{"op": "http", "ip": ip, "port": 443, "host": "allowed.test", "tls": true, "cafile": "/root/test-ca.pem"}, body("hello from allowed.test")},
		{"http wildcard host", probe{"op": "http", "ip": ip, "port": 80, "host": "x.wild.test"}, body("hello from x.wild.test")},
		{"http denied host", probe{"op": "http", "ip": ip, "port": 80, "host": "denied.test"}, fails},
		{"https denied sni with allowed host", probe{"op": "http", "ip": ip, "port": 443, "host": "allowed.test", "sni": "denied.test", "tls": true, "insecure": true}, fails},
		{"http allowed host at an address not resolved for it", probe{"op": "http", "ip": other, "port": 80, "host": "allowed.test"}, fails},
		{"raw ip", probe{"op": "tcp", "ip": other, "port": 80, "send": "x"}, fails},
		// Fronting through the address of an allowed name: every request
		// is judged by its own Host, and on port 80 a connection must name
		// one in its first bytes.
		{"pipelined second host", probe{"op": "tcp", "ip": ip, "port": 80, "send": "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"}, func(p probe) string {
			if d := p.str("data"); !strings.Contains(d, "hello from allowed.test") || !strings.Contains(d, "HTTP/1.1 403") {
				return fmt.Sprintf("want the first answered and the second refused with 403: %v", p)
			}
			return ""
		}},
		{"leading empty line", probe{"op": "tcp", "ip": ip, "port": 80, "send": "\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"}, func(p probe) string {
			if strings.Contains(p.str("data"), "hello") {
				return fmt.Sprintf("reached the test host: %v", p)
			}
			return ""
		}},
		{"address as the Host", probe{"op": "http", "ip": ip, "port": 80, "host": ip}, fails},
		// The test host's main address is one the allowed names resolved
		// to, so a flow without a name is allowed there on any port; the
		// other address is reached by the literal rule alone.
		{"literal ip:port rule", probe{"op": "tcp", "ip": other, "port": netEchoPort, "send": "ping", "first": true}, func(p probe) string {
			if !p.ok() || p.str("data") != "ping" {
				return fmt.Sprintf("want the echo: %v", p)
			}
			return ""
		}},
		{"other port of a literal ip rule", probe{"op": "tcp", "ip": other, "port": netOtherPort, "send": "ping"}, fails},
		// The operator opened the test host's private range, and the
		// policy names one address in it: that one only is reached.
		{"private address named in an opened range", probe{"op": "tcp", "ip": tn.private.String(), "port": netEchoPort, "send": "ping", "first": true}, func(p probe) string {
			if !p.ok() || p.str("data") != "ping" {
				return fmt.Sprintf("want the echo: %v", p)
			}
			return ""
		}},
		{"private address not named in an opened range", probe{"op": "tcp", "ip": tn.privateOther.String(), "port": netEchoPort, "send": "ping"}, fails},
		{"no name at an address an allowed name resolved to", probe{"op": "tcp", "ip": ip, "port": netOtherPort, "send": "ping", "first": true}, func(p probe) string {
			if !p.ok() || p.str("data") != "ping" {
				return fmt.Sprintf("want the echo: %v", p)
			}
			return ""
		}},
		{"udp dns to another resolver", probe{"op": "udp", "ip": other, "port": 53, "dns": "denied.test"}, unanswered},
		{"tcp dns to another resolver", probe{"op": "tcp", "ip": other, "port": 53, "send": "x"}, fails},
		{"quic to an allowed host", probe{"op": "udp", "ip": ip, "port": 443}, unanswered},
		{"metadata address", probe{"op": "tcp", "ip": metadataIP.String(), "port": 80, "send": "x"}, fails},
		{"gateway ssh", probe{"op": "tcp", "ip": "10.0.2.2", "port": 22}, fails},
		{"gateway http", probe{"op": "tcp", "ip": "10.0.2.2", "port": 80}, fails},
		{"host's own address", probe{"op": "tcp", "ip": tn.hostIP.String(), "port": hostPort}, fails},
		{"rebound name at loopback", probe{"op": "http", "ip": "127.0.0.1", "port": 80, "host": "rebind.test", "timeout": 2}, fails},
		{"ipv6", probe{"op": "tcp6", "ip": tn.ip6.String(), "port": 80}, fails},
		{"icmp echo to the test host", probe{"op": "icmp", "ip": ip}, func(probe) string { return "" }},
	}
	var list []probe
	for _, c := range checks {
		list = append(list, c.probe)
	}
	results := ne.probes(t, s.key, sb.ID, list)
	for i, c := range checks {
		if why := c.expect(results[i]); why != "" {
			t.Errorf("%s: %s", c.name, why)
		}
	}

	// What reached the test host, and what its DNS was asked.
	for _, name := range []string{"denied.test", "wild.test", "bad.wild.test"} {
		if n := tn.dns.queries(name); n != 0 {
			t.Errorf("the upstream resolver was asked %d times for %s, which the policy denies", n, name)
		}
	}
	if tn.dns.queries("rebind.test") == 0 {
		t.Errorf("rebind.test was never resolved upstream: the drop of its answers was not tested")
	}
	for key, want := range map[string]int{
		"http:denied.test":     0,
		"http:" + ip:           0,
		"tcp:" + other + ":80": 0,
		"tcp:" + other + fmt.Sprintf(":%d", netOtherPort):      0,
		"udp:" + other + ":53":                                 0,
		"tcp:" + other + ":53":                                 0,
		"udp:" + ip + ":443":                                   0,
		"tcp:" + metadataIP.String() + ":80":                   0,
		"tcp:[" + tn.ip6.String() + "]:80":                     0,
		fmt.Sprintf("tcp:%s:%d", tn.privateOther, netEchoPort): 0,
	} {
		if got := tn.seenCount(key); got != want {
			t.Errorf("the test host saw %s %d times, want %d", key, got, want)
		}
	}
	if tn.seenCount("http:allowed.test") == 0 || tn.seenCount(fmt.Sprintf("tcp:%s:%d", other, netEchoPort)) == 0 ||
		tn.seenCount(fmt.Sprintf("tcp:%s:%d", tn.private, netEchoPort)) == 0 {
		t.Errorf("allowed flows did not reach the test host: %v", tn.seen)
	}
	if hostHits.Load() != 0 {
		t.Errorf("the guest reached a listener on the host's own address %d times", hostHits.Load())
	}
	if now := tn.icmpEchoes(t); now != echoes {
		t.Errorf("ICMP echoes reached the test host: %d before, %d after", echoes, now)
	}

	t.Run("egress log", func(t *testing.T) {
		var log apiv1.List[apiv1.EgressEvent]
		deadline := time.Now().Add(10 * time.Second)
		want := map[string]bool{"dns deny denied.test": false, "tcp allow allowed.test": false, "tcp deny 8082": false, "udp deny": false}
		for time.Now().Before(deadline) {
			s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/egress-log?limit=1000", s.key, nil, &log)
			for _, e := range log.Items {
				switch {
				case e.Proto == "dns" && e.Verdict == "deny" && e.Host == "denied.test":
					want["dns deny denied.test"] = true
				case e.Proto == "tcp" && e.Verdict == "allow" && e.Host == "allowed.test" && e.BytesIn > 0 && e.BytesOut > 0:
					want["tcp allow allowed.test"] = true
				case e.Proto == "tcp" && e.Verdict == "deny" && e.Port == netOtherPort && e.IP == other && e.Reason == "default-deny":
					want["tcp deny 8082"] = true
				case e.Proto == "udp" && e.Verdict == "deny":
					want["udp deny"] = true
				}
			}
			all := true
			for _, v := range want {
				all = all && v
			}
			if all {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		for k, v := range want {
			if !v {
				t.Errorf("egress log has no %q entry: %+v", k, log.Items)
			}
		}
		for i := 1; i < len(log.Items); i++ {
			if log.Items[i].Time.After(log.Items[i-1].Time) {
				t.Errorf("egress log is not newest first at %d", i)
				break
			}
		}
		status, b := s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/egress-log?limit=5000", s.key, nil)
		if status != 400 {
			t.Errorf("limit 5000: %d %s", status, b)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		_, b := s.call(t, "GET", "/metrics", "", nil)
		for _, want := range []string{`airlock_egress_flows_total{verdict="deny"}`, `airlock_egress_flows_total{verdict="allow"}`, `airlock_dns_queries_total{verdict="deny"}`, `airlock_egress_bytes_total{direction="in"}`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})

	t.Run("bad policies", func(t *testing.T) {
		before := s.state(t, sb.ID).Network
		for _, c := range []struct{ body, want string }{
			{`{"egress":"deny","allow":["10.0.0.0/33"]}`, "10.0.0.0/33"},
			{`{"egress":"deny","allow":["example.com:0"]}`, "example.com:0"},
			{`{"egress":"deny","allow":["example.com:65536"]}`, "example.com:65536"},
			{`{"egress":"deny","allow":["*."]}`, `network.allow[0]`},
			{`{"egress":"deny","deny":["a.*.b"]}`, "a.*.b"},
			{`{"egress":"deny","allow":["::1"]}`, "::1"},
			{`{"egress":"sometimes"}`, "sometimes"},
			{`{"egress":"deny","credentials":[{"host":"*.example.com","header":"Authorization","secret":"x"}]}`, "*.example.com"},
			{`{"egress":"deny","credentials":[{"host":"api.test","header":"X-Key","secret":"never-stored"}]}`, "never-stored"},
			{`{"egress":"deny","credentials":[{"host":"api.test","header":"X-Key\r\nEvil: 1","secret":"x"}]}`, "header"},
			{`{"egress":"deny","allow":"example.com"}`, ""},
			{`{"egress":"deny","unknown":1}`, "unknown"},
			{`[]`, ""},
		} {
			status, b := s.call(t, "PUT", "/v1/sandboxes/"+sb.ID+"/network", s.key, c.body)
			if status != 400 || !strings.Contains(string(b), "invalid_argument") || !strings.Contains(string(b), c.want) {
				t.Errorf("PUT network %s: %d %s (want 400 naming %q)", c.body, status, b, c.want)
			}
			status, b = s.call(t, "POST", "/v1/sandboxes", s.key, `{"template":"base","network":`+c.body+`}`)
			if status != 400 {
				t.Errorf("create with network %s: %d %s", c.body, status, b)
			}
		}
		if after := s.state(t, sb.ID).Network; string(after) != string(before) {
			t.Errorf("bad policies changed the sandbox's policy: %s -> %s", before, after)
		}
	})

	// A user key names each range no policy may open, and a private one
	// the operator did not: 403 naming the entry, on create and PUT
	// network alike, and nothing changes (E2B's calls: TestE2BControlPlane).
	t.Run("closed ranges", func(t *testing.T) {
		var k apiv1.KeyCreated
		s.must(t, 201, "POST", "/v1/keys", s.key, map[string]string{"name": "closed-ranges", "role": "user"}, &k)
		mine := ne.netSandbox(t, k.Key, map[string]any{"egress": "deny"})
		before := s.state(t, mine.ID).Network
		var sandboxes apiv1.List[apiv1.Sandbox]
		s.must(t, 200, "GET", "/v1/sandboxes", k.Key, nil, &sandboxes)
		for _, entry := range []string{
			"127.0.0.1", "127.0.0.53:53", "169.254.169.254", "169.254.169.254:80", "169.254.0.0/16", "168.63.129.16",
			"0.0.0.0", "224.0.0.251", "255.255.255.255", "10.0.2.2:80", tn.hostIP.String(), tn.hostIP.String() + ":22",
			"10.0.0.0/8", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", nextPrefix(tn.privateNet).String(),
		} {
			body := fmt.Sprintf(`{"egress":"deny","allow":["allowed.test",%q]}`, entry)
			status, b := s.call(t, "PUT", "/v1/sandboxes/"+mine.ID+"/network", k.Key, body)
			if status != 403 || !strings.Contains(string(b), "permission_denied") || !strings.Contains(string(b), fmt.Sprintf(`network.allow[1] \"%s\"`, entry)) {
				t.Errorf("PUT network allowing %s: %d %s (want 403 naming the entry)", entry, status, b)
			}
			status, b = s.call(t, "POST", "/v1/sandboxes", k.Key, `{"template":"base","network":`+body+`}`)
			if status != 403 || !strings.Contains(string(b), entry) {
				t.Errorf("create allowing %s: %d %s (want 403 naming the entry)", entry, status, b)
			}
		}
		if after := s.state(t, mine.ID).Network; string(after) != string(before) {
			t.Errorf("refused policies changed the sandbox's policy: %s -> %s", before, after)
		}
		var now apiv1.List[apiv1.Sandbox]
		s.must(t, 200, "GET", "/v1/sandboxes", k.Key, nil, &now)
		if len(now.Items) != len(sandboxes.Items) {
			t.Errorf("refused creates made sandboxes: %d before, %d after", len(sandboxes.Items), len(now.Items))
		}
		// Opened, named literally: accepted. Deny entries name anything.
		for _, body := range []string{
			fmt.Sprintf(`{"egress":"deny","allow":[%q]}`, tn.private.String()),
			fmt.Sprintf(`{"egress":"deny","allow":[%q]}`, tn.privateNet.String()),
			`{"egress":"allow","deny":["127.0.0.1","169.254.169.254","10.0.0.0/8"]}`,
			`{"egress":"deny","allow":["0.0.0.0/0"]}`,
		} {
			if status, b := s.call(t, "PUT", "/v1/sandboxes/"+mine.ID+"/network", k.Key, body); status != 200 {
				t.Errorf("PUT network %s: %d %s, want 200", body, status, b)
			}
		}
	})
}

// TestNetworkCredentials checks header injection on HTTPS and HTTP for the
// host named, the replacement of a guest-sent copy, the refusal of a Host
// that differs from the SNI, untouched TLS to other hosts, and that the
// secret and the CA key are nowhere in the guest.
func TestNetworkCredentials(t *testing.T) {
	ne := sharedNet(t)
	tn, s := ne.tn, ne.srv
	ip := tn.ip.String()
	secret := "sk-test-" + strings.Repeat("7", 8) + fmt.Sprint(time.Now().UnixNano())
	s.must(t, 201, "POST", "/v1/secrets", s.key, map[string]string{"name": "apitoken", "value": secret}, nil)
	sb := ne.netSandbox(t, s.key, map[string]any{
		"egress": "deny",
		"allow":  []string{"api.test", "other.test"},
		"credentials": []map[string]any{
			// plain_http: port 80 gets the credential too (docs/network.md).
			{"host": "api.test", "header": "Authorization", "secret": "apitoken", "format": "Bearer {}", "plain_http": true},
		},
	})
	if strings.Contains(string(sb.Network), secret) {
		t.Fatalf("the sandbox's policy shows the secret: %s", sb.Network)
	}
	sum := sha256.Sum256([]byte("Bearer " + secret))
	injected := "1 " + hex.EncodeToString(sum[:])
	guest := map[string]string{"Authorization": "Bearer guest-value"}
	checks := []probe{
		// The system bundle holds the gateway's CA, which signs api.test.
		{"op": "http", "ip": ip, "port": 443, "host": "api.test", "tls": true, "path": "/auth", "headers": guest},
		{"op": "http", "ip": ip, "port": 80, "host": "api.test", "path": "/auth", "headers": guest},
		// Trusting only the test host's CA fails for api.test: it is intercepted...
		{"op": "http", "ip": ip, "port": 443, "host": "api.test", "tls": true, "path": "/auth", "cafile": "/root/test-ca.pem"},
		// ...and works for other.test, which is not, and gets no credential.
		{"op": "http", "ip": ip, "port": 443, "host": "other.test", "tls": true, "path": "/auth", "cafile": "/root/test-ca.pem"},
		// A Host that is not the SNI gets no credential and reaches nothing.
		{"op": "http", "ip": ip, "port": 443, "host": "other.test", "sni": "api.test", "tls": true, "path": "/auth"},
		// A redirect is handed to the guest, not followed with the credential.
		{"op": "http", "ip": ip, "port": 443, "host": "api.test", "tls": true, "path": "/redirect"},
	}
	r := ne.probes(t, s.key, sb.ID, checks)
	if r[0].str("body") != injected {
		t.Errorf("https to api.test: upstream got %q, want the secret once (%q): %v", r[0].str("body"), injected, r[0])
	}
	if r[1].str("body") != injected {
		t.Errorf("http to api.test: upstream got %q, want the secret once: %v", r[1].str("body"), r[1])
	}
	if r[2].ok() {
		t.Errorf("api.test verified with the test host's CA alone: it was not intercepted: %v", r[2])
	}
	empty := sha256.Sum256(nil)
	if r[3].str("body") != "0 "+hex.EncodeToString(empty[:]) {
		t.Errorf("https to other.test: %v (want untouched, without credentials)", r[3])
	}
	if r[4].num("status") != 421 {
		t.Errorf("Host other.test on SNI api.test: %v, want 421", r[4])
	}
	if r[5].num("status") != 302 {
		t.Errorf("redirect: %v, want the 302 itself", r[5])
	}
	if n := tn.seenCount("http:other.test/auth"); n != 1 {
		t.Errorf("other.test/auth was reached %d times, want once (the direct request only)", n)
	}

	// The secret and the CA key are nowhere in the guest: files, every
	// process's environment, command line and memory.
	caKey, err := os.ReadFile(filepath.Join(s.home, "sandboxes", sb.ID, "gateway", "ca.key"))
	if err != nil {
		t.Fatalf("the sandbox's CA key is not on the host: %v", err)
	}
	keyLine := pemBody(string(caKey))
	scan := `
import json, os, sys
needles = [bytes.fromhex(h) for h in sys.argv[1:]]
me = str(os.getpid())
hits = [[] for _ in needles]
def check(what, data):
    for i, n in enumerate(needles):
        if n in data and len(hits[i]) < 5:
            hits[i].append(what)
for root, dirs, files in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for f in files:
        p = os.path.join(root, f)
        try:
            if os.path.islink(p) or os.path.getsize(p) > 64 << 20:
                continue
            with open(p, "rb") as fh:
                check(p, fh.read())
        except OSError:
            pass
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid == me:
        continue
    for f in ("environ", "cmdline"):
        try:
            check(pid + "/" + f, open("/proc/%s/%s" % (pid, f), "rb").read())
        except OSError:
            pass
    try:
        mem = open("/proc/%s/mem" % pid, "rb")
        for line in open("/proc/%s/maps" % pid):
            rng, perms = line.split()[:2]
            if "r" not in perms:
                continue
            a, b = (int(x, 16) for x in rng.split("-"))
            try:
                mem.seek(a)
                check(pid + " memory", mem.read(b - a))
            except (OSError, ValueError, OverflowError):
                pass
    except OSError:
        pass
print(json.dumps(hits))
`
	// The sandbox's ID is in its /etc/hostname and in its shell's memory:
	// the scan must find it, or it could not find anything.
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{
		Argv: []string{"python3", "-c", scan, hex.EncodeToString([]byte(sb.ID)), hex.EncodeToString([]byte(secret)), hex.EncodeToString([]byte(keyLine))}, TimeoutS: 240,
	}, &res)
	var hits [][]string
	if res.ExitCode != 0 || json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &hits) != nil || len(hits) != 3 {
		t.Fatalf("scan of the guest: exit %d %q %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if len(hits[0]) == 0 {
		t.Errorf("the scan did not find the sandbox's own ID: it finds nothing")
	}
	if len(hits[1]) > 0 || len(hits[2]) > 0 {
		t.Errorf("the secret is in the guest at %v; the CA key at %v", hits[1], hits[2])
	}
}

// pemBody is the longest base64 line of a PEM block, which is unique to
// the key.
func pemBody(p string) string {
	best := ""
	for _, l := range strings.Split(p, "\n") {
		if !strings.HasPrefix(l, "-----") && len(l) > len(best) {
			best = l
		}
	}
	return best
}

// TestNetworkLiveChange checks that a policy change closes an open
// connection the new policy forbids, within a second.
func TestNetworkLiveChange(t *testing.T) {
	ne := sharedNet(t)
	tn, s := ne.tn, ne.srv
	target := fmt.Sprintf("%s:%d", tn.ip, netHoldPort)
	sb := ne.netSandbox(t, s.key, map[string]any{"egress": "deny", "allow": []string{target}})
	before := tn.seenCount("tcp:" + target)
	checks, _ := json.Marshal([]probe{{"op": "hold", "ip": tn.ip.String(), "port": netHoldPort, "timeout": 60, "progress": true}})
	var sess apiv1.CommandSession
	s.must(t, 201, "POST", "/v1/sandboxes/"+sb.ID+"/commands", s.key, apiv1.CommandRequest{Argv: []string{"python3", "/root/netprobe.py", string(checks)}}, &sess)
	resp, r := s.attach(t, sess.ID, s.key, 0)
	defer resp.Body.Close()
	// Bytes flow: the probe got some over the held connection.
	readUntil(t, r, contains("got "))
	if tn.seenCount("tcp:"+target) == before {
		t.Fatal("the held connection never reached the test host")
	}
	s.must(t, 200, "PUT", "/v1/sandboxes/"+sb.ID+"/network", s.key, map[string]any{"egress": "deny"}, nil)
	changed := time.Now()
	o := readToExit(t, r)
	took := time.Since(changed)
	var res []probe
	outLines := strings.Split(strings.TrimSpace(o.stdout), "\n")
	if err := json.Unmarshal([]byte(outLines[len(outLines)-1]), &res); err != nil || len(res) != 1 {
		t.Fatalf("hold output %q: %v", o.stdout, err)
	}
	if !res[0].ok() || res[0].num("bytes") < 1 {
		t.Errorf("the held connection: %v", res[0])
	}
	// The probe's own exit and its output's way back take time under
	// emulation; the close itself is asked to take at most a second.
	if took > 5*time.Second || res[0].num("lasted") > 25 {
		t.Errorf("the connection lasted %.1fs and ended %s after the policy change", res[0].num("lasted"), took)
	}
	// And a new connection is refused.
	p := ne.probes(t, s.key, sb.ID, []probe{{"op": "tcp", "ip": tn.ip.String(), "port": netHoldPort}})
	if p[0].ok() {
		t.Errorf("a new connection after the change: %v", p[0])
	}
}

// TestNetworkInbound checks the ports proxy (HTTP and WebSocket) into a
// guest's server, that the API key is not passed on, the 502 of a port
// nothing listens on, and port-forward through the server.
func TestNetworkInbound(t *testing.T) {
	ne := sharedNet(t)
	s := ne.srv
	sb := ne.netSandbox(t, s.key, map[string]any{"egress": "deny"})
	var res apiv1.ExecResult
	s.must(t, 200, "POST", "/v1/sandboxes/"+sb.ID+"/exec", s.key, apiv1.CommandRequest{
		Cmd: "nohup python3 /root/guestserver.py 8000 >/tmp/gs.log 2>&1 & for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.2; done; exit 1",
	}, &res)
	if res.ExitCode != 0 {
		t.Fatalf("guest server did not start: %+v", res)
	}
	status, b := s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/headers?x=1", s.key, nil, "X-Test", "yes")
	var got struct {
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
	}
	if status != 200 || json.Unmarshal(b, &got) != nil {
		t.Fatalf("GET through the ports proxy: %d %s", status, b)
	}
	if got.Path != "/headers?x=1" || got.Headers["x-test"] != "yes" {
		t.Errorf("the guest saw %+v", got)
	}
	if _, leaked := got.Headers["authorization"]; leaked || strings.Contains(string(b), s.key) {
		t.Errorf("the API key reached the guest: %s", b)
	}
	status, b = s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8001/", s.key, nil)
	if status != 502 || !strings.Contains(string(b), `"error"`) {
		t.Errorf("a port nothing listens on: %d %s", status, b)
	}
	if status, _ := s.call(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/headers", "", nil); status != 401 {
		t.Errorf("the ports proxy without a key: %d", status)
	}

	t.Run("websocket", func(t *testing.T) {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(c, "GET /v1/sandboxes/%s/ports/8000/ws HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", sb.ID, s.addr, s.key)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		msg := []byte("hi there")
		mask := []byte{1, 2, 3, 4}
		frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
		for i, m := range msg {
			frame = append(frame, m^mask[i%4])
		}
		c.Write(frame)
		hdr := make([]byte, 2)
		if _, err := io.ReadFull(br, hdr); err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, hdr[1]&0x7f)
		io.ReadFull(br, reply)
		if string(reply) != "echo: hi there" {
			t.Errorf("websocket echo: %q", reply)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		cmd := exec.Command(binPath(), "port-forward", "--url", s.url, sb.ID, "0:8000")
		cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY="+s.key)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		line, err := bufio.NewReader(out).ReadString('\n')
		fields := strings.Fields(line)
		if err != nil || len(fields) < 2 || fields[0] != "forwarding" {
			t.Fatalf("port-forward printed %q: %v", line, err)
		}
		resp, err := http.Get("http://" + fields[1] + "/headers")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"/headers"`) {
			t.Errorf("through port-forward: %d %s", resp.StatusCode, b)
		}
	})
}

// TestNetworkAcrossLifecycle checks that the network works after a
// suspend and wake and after a server restart, which rebuild the gateway.
func TestNetworkAcrossLifecycle(t *testing.T) {
	ne := sharedNet(t)
	tn := ne.tn
	s := newServerEnv(t, tn.serverEnv(), tn.serverArgs()...)
	sb := (&netEnv{tn: tn, srv: s}).netSandbox(t, s.key, map[string]any{"egress": "deny", "allow": []string{"allowed.test"}})
	ne2 := &netEnv{tn: tn, srv: s}
	get := probe{"op": "http", "ip": tn.ip.String(), "port": 80, "host": "allowed.test"}
	check := func(when string) {
		t.Helper()
		r := ne2.probes(t, s.key, sb.ID, []probe{{"op": "dns", "name": "allowed.test"}, get})
		if !strings.Contains(r[1].str("body"), "hello from allowed.test") {
			t.Errorf("%s: %v %v", when, r[0], r[1])
		}
	}
	check("after create")
	s.lifecycle(t, sb.ID, "suspend")
	s.lifecycle(t, sb.ID, "wake")
	check("after suspend and wake")
	s.lifecycle(t, sb.ID, "pause")
	s.lifecycle(t, sb.ID, "wake")
	check("after pause and wake")
	s.stop(syscall.SIGTERM)
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	check("after a server restart")
	// The policy survives the restart, and a live change reaches the
	// rebuilt gateway.
	s.must(t, 200, "PUT", "/v1/sandboxes/"+sb.ID+"/network", s.key, map[string]any{"egress": "deny"}, nil)
	r := ne2.probes(t, s.key, sb.ID, []probe{get})
	if r[0].ok() {
		t.Errorf("after denying everything: %v", r[0])
	}
}

// TestNetworkCLI drives the network through the CLI: a sandbox created
// with --net, secrets, the egress log, a live policy change, and a
// one-shot `airlock run --net`.
func TestNetworkCLI(t *testing.T) {
	ne := sharedNet(t)
	tn, s := ne.tn, ne.srv
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"egress":"deny","allow":["allowed.test"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r := serverCLI(t, s, "", "sandbox", "create", "--template", "base", "--net", policy)
	if r.code != 0 {
		t.Fatalf("sandbox create --net: %d %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { s.deleteSandbox(t, s.key, id) })
	curl := []string{"exec", id, "--", "curl", "-sS", "-m", "10", "http://allowed.test/"}
	if r = serverCLI(t, s, "", curl...); r.code != 0 || !strings.Contains(r.stdout, "hello from allowed.test") {
		t.Errorf("curl allowed.test: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r = serverCLI(t, s, "", "network", "log", "--json", id); r.code != 0 || !strings.Contains(r.stdout, `"host": "allowed.test"`) {
		t.Errorf("network log: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r = serverCLI(t, s, "", "network", "set", id, "deny"); r.code != 0 || !strings.Contains(r.stdout, `"egress":"deny"`) {
		t.Errorf("network set deny: %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r = serverCLI(t, s, "", curl...); r.code == 0 {
		t.Errorf("curl after network set deny: %q", r.stdout)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"allow":["10.0.0.0/33"]}`), 0o644)
	for _, args := range [][]string{
		{"network", "set", id, bad},
		{"network", "set", id, "/no/such/file.json"},
		{"network", "set", id},
		{"sandbox", "create", "--net", bad},
		{"network", "log", "--limit", "0", id},
		{"port-forward", id, "70000"},
	} {
		if r = serverCLI(t, s, "", args...); r.code != 2 || r.stderr == "" {
			t.Errorf("airlock %v: exit %d %q, want 2 with a message", args, r.code, r.stderr)
		}
	}

	t.Run("secrets", func(t *testing.T) {
		if r = serverCLI(t, s, "cli-secret-value\n", "secret", "set", "clitoken"); r.code != 0 {
			t.Fatalf("secret set: %d %s", r.code, r.stderr)
		}
		if r = serverCLI(t, s, "", "secret", "ls"); r.code != 0 || !strings.Contains(r.stdout, "clitoken") || strings.Contains(r.stdout, "cli-secret-value") {
			t.Errorf("secret ls: %d %q", r.code, r.stdout)
		}
		if r = serverCLI(t, s, "", "secret", "rm", "clitoken"); r.code != 0 {
			t.Errorf("secret rm: %d %s", r.code, r.stderr)
		}
	})

	t.Run("run", func(t *testing.T) {
		r := runCLI(t, nil, nil, "run", "--template", "base", "--net", policy, "--dns-upstream", tn.dns.addr,
			"--", "sh", "-c", "curl -sS -m 10 http://allowed.test/ && ! curl -sS -m 5 http://denied.test/")
		if r.code != 0 || !strings.Contains(r.stdout, "hello from allowed.test") {
			t.Errorf("airlock run --net: %d %q %s", r.code, r.stdout, r.stderr)
		}
	})
}

// nextPrefix is the prefix of p's length right after p: a private range
// beside the one the server opened.
func nextPrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr().As4()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	n += 1 << (32 - p.Bits())
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), p.Bits())
}
