package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/internal/testhost"
)

// testNet is a test host in a network namespace of its own, joined to the
// host by a veth pair: the only place network tests send traffic to. It
// runs HTTP, TLS and plain TCP servers and counts every connection and
// datagram that reaches it, so a test can assert that a denied flow never
// arrived. Its addresses (198.18.N.0/29, a documentation range) are
// routed to the veth, as are the cloud metadata address and an IPv6
// address it also holds, so even a broken gateway sends nothing off the
// machine.
type testNet struct {
	host   *testhost.Host
	hostIP netip.Addr // the host's end of the veth: one of the host's own addresses
	ip     netip.Addr // the test host's main address
	other  netip.Addr // a second address of the test host ("another resolver")
	ip6    netip.Addr
	// private and privateOther are test host addresses in a private range
	// the server opens (--egress-private privateNet): a policy may name
	// them literally.
	private, privateOther netip.Addr
	privateNet            netip.Prefix

	caFile string // PEM of the CA that signed the TLS server's certificate
	dns    *testDNS

	mu   sync.Mutex     // guards seen
	seen map[string]int // "tcp:ADDR:PORT" / "udp:ADDR:PORT" / "http:HOST" -> count

	closers []io.Closer
}

// metadataIP is the cloud metadata address, assigned inside the test
// namespace so that a guest's attempt to reach it is seen there.
var metadataIP = netip.MustParseAddr("169.254.169.254")

// testNames are the names the test DNS answers with the test host's
// address, and the TLS certificate covers.
var testNames = []string{"allowed.test", "api.test", "other.test", "denied.test", "x.wild.test", "bad.wild.test", "wild.test", "live.test"}

// newTestNet makes the namespace, its servers and a DNS server on
// loopback that answers testNames.
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("network tests need root for network namespaces")
	}
	n := os.Getpid()%200 + 20
	tn := &testNet{
		hostIP: netip.MustParseAddr(fmt.Sprintf("198.18.%d.1", n)),
		ip:     netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", n)),
		other:  netip.MustParseAddr(fmt.Sprintf("198.18.%d.3", n)),
		ip6:    netip.MustParseAddr(fmt.Sprintf("fd00:a1:%x::2", n)),
		seen:   map[string]int{},

		private:      netip.MustParseAddr(fmt.Sprintf("10.254.%d.2", n)),
		privateOther: netip.MustParseAddr(fmt.Sprintf("10.254.%d.3", n)),
		privateNet:   netip.MustParsePrefix(fmt.Sprintf("10.254.%d.0/29", n)),
	}
	ip6host := netip.MustParseAddr(fmt.Sprintf("fd00:a1:%x::1", n))
	metadata := netip.PrefixFrom(metadataIP, 32)
	var err error
	tn.host, err = testhost.New(testhost.Config{
		Name:      fmt.Sprintf("alt%d", os.Getpid()),
		HostAddrs: []netip.Prefix{netip.PrefixFrom(tn.hostIP, 29), netip.PrefixFrom(ip6host, 64)},
		Addrs: []netip.Prefix{netip.PrefixFrom(tn.ip, 29), netip.PrefixFrom(tn.other, 29), metadata, netip.PrefixFrom(tn.ip6, 64),
			netip.PrefixFrom(tn.private, 29), netip.PrefixFrom(tn.privateOther, 29)},
		Routes: []netip.Prefix{metadata, tn.privateNet},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tn.close)
	tn.startServers(t)
	tn.dns = newTestDNS(t, map[string][]string{
		// An allowed name whose answers the gateway must drop: loopback
		// and the metadata address (DNS rebinding).
		"rebind.test": {"127.0.0.1", metadataIP.String()},
	}, testNames, tn.ip.String())
	return tn
}

func (tn *testNet) close() {
	for _, c := range tn.closers {
		c.Close()
	}
	tn.host.Close()
}

// count records one connection or datagram.
func (tn *testNet) count(key string) {
	tn.mu.Lock()
	tn.seen[key]++
	tn.mu.Unlock()
}

// seenCount is how often key was recorded.
func (tn *testNet) seenCount(key string) int {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return tn.seen[key]
}

// Ports of the test host's servers.
const (
	netEchoPort  = 8081 // TCP: counts connections, echoes
	netOtherPort = 8082 // TCP: counts connections, echoes
	netHoldPort  = 8083 // TCP: sends a byte every 100 ms for 30 s
)

func (tn *testNet) startServers(t testing.TB) {
	t.Helper()
	cert := tn.makeCA(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		tn.count("http:" + r.Host)
		fmt.Fprintf(w, "hello from %s\n", r.Host)
	})
	// /auth answers with a digest of the Authorization headers it got, so
	// the value itself never travels back into the guest.
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		tn.count("http:" + r.Host + "/auth")
		vals := r.Header.Values("Authorization")
		sum := sha256.Sum256([]byte(strings.Join(vals, "\n")))
		fmt.Fprintf(w, "%d %s", len(vals), hex.EncodeToString(sum[:]))
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://other.test/auth", http.StatusFound)
	})
	err := tn.host.Do(func() error {
		listen := func(port int, serve func(net.Listener)) error {
			ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
			if err != nil {
				return err
			}
			tn.closers = append(tn.closers, ln)
			go serve(&countingListener{Listener: ln, tn: tn})
			return nil
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		if err := listen(80, func(ln net.Listener) { hs.Serve(ln) }); err != nil {
			return err
		}
		ts := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		if err := listen(443, func(ln net.Listener) { ts.ServeTLS(ln, "", "") }); err != nil {
			return err
		}
		for _, port := range []int{netEchoPort, netOtherPort, 53} {
			if err := listen(port, func(ln net.Listener) { serveEcho(ln) }); err != nil {
				return err
			}
		}
		if err := listen(netHoldPort, func(ln net.Listener) { serveHold(ln) }); err != nil {
			return err
		}
		for _, port := range []int{53, 443} {
			pc, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
			if err != nil {
				return err
			}
			tn.closers = append(tn.closers, pc)
			go tn.serveUDP(pc)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("test host servers: %v", err)
	}
}

// countingListener records each accepted connection by its local address.
type countingListener struct {
	net.Listener
	tn *testNet
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.tn.count("tcp:" + c.LocalAddr().String())
	}
	return c, err
}

func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			io.Copy(c, c)
		}()
	}
}

func serveHold(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			for i := 0; i < 300; i++ {
				if _, err := c.Write([]byte{'.'}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
}

func (tn *testNet) serveUDP(pc net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		_, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		tn.count("udp:" + pc.LocalAddr().String())
		pc.WriteTo([]byte("answer"), addr)
	}
}

// makeCA writes a CA (tn.caFile) and returns a server certificate it
// signed for testNames.
func (tn *testNet) makeCA(t testing.TB) tls.Certificate {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock e2e test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "test host"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: testNames, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leafTpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	tn.caFile = filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(tn.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// icmpEchoes reads how many ICMP echo requests the test host received.
func (tn *testNet) icmpEchoes(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", tn.host.Name(), "cat", "/proc/net/snmp").Output()
	if err != nil {
		t.Fatalf("read the test host's ICMP counters: %v", err)
	}
	lines := strings.Split(string(out), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "Icmp: ") || !strings.HasPrefix(lines[i+1], "Icmp: ") {
			continue
		}
		names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j, n := range names {
			if n == "InEchos" && j < len(vals) {
				v, _ := strconv.Atoi(vals[j])
				return v
			}
		}
	}
	t.Fatalf("no Icmp InEchos in the test host's /proc/net/snmp")
	return 0
}

// testDNS is a DNS server on loopback, the gateways' upstream in network
// tests, which counts the queries it gets per name.
type testDNS struct {
	addr  string
	mu    sync.Mutex     // guards asked
	asked map[string]int // lower-case name without the final dot -> queries
}

func newTestDNS(t testing.TB, extra map[string][]string, names []string, ip string) *testDNS {
	t.Helper()
	zone := map[string][]string{}
	for _, n := range names {
		zone[n] = []string{ip}
	}
	for n, ips := range extra {
		zone[n] = ips
	}
	d := &testDNS{asked: map[string]int{}}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 {
			name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
			d.mu.Lock()
			d.asked[name]++
			d.mu.Unlock()
			ips, ok := zone[name]
			switch {
			case !ok:
				m.Rcode = dns.RcodeNameError
			case q.Question[0].Qtype == dns.TypeA:
				for _, ip := range ips {
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(ip)})
				}
			}
		}
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = pc.LocalAddr().String()
	ln, err := net.Listen("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	us := &dns.Server{PacketConn: pc, Handler: h}
	ts := &dns.Server{Listener: ln, Handler: h}
	go us.ActivateAndServe()
	go ts.ActivateAndServe()
	t.Cleanup(func() { us.Shutdown(); ts.Shutdown() })
	return d
}

// queries is how often name was asked for.
func (d *testDNS) queries(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[name]
}
