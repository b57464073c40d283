package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// hostLog is an upstream that logs the Host of every request it gets.
type hostLog struct {
	mu    sync.Mutex
	hosts []string
}

func (h *hostLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.hosts = append(h.hosts, r.Host)
	h.mu.Unlock()
	fmt.Fprintf(w, "host=%s", r.Host)
}

func (h *hostLog) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.hosts)
}

// frontingNet is a gateway whose guest reaches one shared address (a CDN's)
// on port, where both the allowed cdn names and evil.test resolve; the
// upstream there logs every Host it sees.
func frontingNet(t *testing.T, port uint16, allow ...string) (*testNet, *hostLog, netip.AddrPort) {
	t.Helper()
	log := &hostLog{}
	srv := httptest.NewServer(log)
	t.Cleanup(srv.Close)
	public := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.80"), port)
	n := newTestNet(t, policy.Policy{Allow: allow}, netOptions{
		redirect: map[netip.AddrPort]string{public: srv.Listener.Addr().String()},
	})
	for _, name := range []string{"a.cdn.test", "b.cdn.test", "evil.test"} {
		n.dns.set(name, public.Addr().String())
		if n.gw.rules.Load().AllowName(name).Allow {
			n.resolveA(name) // the guest's own lookup, as a client makes it
		}
	}
	return n, log, public
}

// exchange writes raw on a new guest connection to addr and reads what
// comes back until the gateway or the upstream closes: the responses, in
// order, and how the connection ended.
func exchange(t *testing.T, n *testNet, addr netip.AddrPort, raw ...string) (statuses []int, end error) {
	t.Helper()
	c, err := n.dial(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for i, part := range raw {
		if i > 0 {
			time.Sleep(1500 * time.Millisecond) // past the gateway's first-bytes window
		}
		if _, err := io.WriteString(c, part); err != nil {
			return statuses, err
		}
	}
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return statuses, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
}

func get(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }

// TestHTTPFronting sends what a guest would to reach a host its policy
// does not allow through the address of one it does: a second request on
// a kept-alive connection, pipelined requests, a request behind empty
// lines, a request line sent too slowly, an address as the Host, nothing
// at all. The upstream must never see evil.test.
func TestHTTPFronting(t *testing.T) {
	n, log, public := frontingNet(t, 80, "a.cdn.test", "b.cdn.test")

	t.Run("kept alive", func(t *testing.T) {
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for i, host := range []string{"a.cdn.test", "b.cdn.test", "evil.test"} {
			io.WriteString(c, get(host))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %d (%s): %v", i, host, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if want := map[bool]int{true: 200, false: 403}[host != "evil.test"]; resp.StatusCode != want {
				t.Fatalf("request %d (%s): %d, want %d", i, host, resp.StatusCode, want)
			}
		}
		if _, err := http.ReadResponse(br, nil); err == nil {
			t.Fatal("the connection stayed open after a refused request")
		}
		n.waitEvent(t, func(e Event) bool { return e.Host == "evil.test" && e.Verdict == "deny" && e.Reason == "default-deny" })
	})
	t.Run("pipelined", func(t *testing.T) {
		got, _ := exchange(t, n, public, get("a.cdn.test")+get("evil.test")+get("a.cdn.test"))
		if !slices.Equal(got, []int{200, 403}) {
			t.Fatalf("statuses %v, want [200 403] and the connection closed", got)
		}
	})
	t.Run("absolute target", func(t *testing.T) {
		got, _ := exchange(t, n, public, get("a.cdn.test")+"GET http://evil.test/ HTTP/1.1\r\nHost: a.cdn.test\r\n\r\n")
		if !slices.Equal(got, []int{200, 403}) {
			t.Fatalf("statuses %v, want [200 403]", got)
		}
	})
	t.Run("behind empty lines", func(t *testing.T) {
		if got, _ := exchange(t, n, public, "\r\n\r\n"+get("evil.test")); len(got) != 0 {
			t.Fatalf("statuses %v, want the connection reset", got)
		}
		if got, _ := exchange(t, n, public, "\r\n"+get("a.cdn.test")+"\r\n"+get("evil.test")); !slices.Equal(got, []int{200, 403}) {
			t.Fatalf("statuses %v, want [200 403]", got)
		}
	})
	t.Run("slow request line", func(t *testing.T) {
		got, err := exchange(t, n, public, "GET / HT", "TP/1.1\r\nHost: evil.test\r\n\r\n")
		if len(got) != 0 || !isReset(err) {
			t.Fatalf("statuses %v, %v; want the connection reset", got, err)
		}
		n.waitEvent(t, func(e Event) bool { return e.Verdict == "deny" && e.Reason == reasonNoHost })
	})
	t.Run("address as the Host", func(t *testing.T) {
		if got, _ := exchange(t, n, public, get(public.Addr().String())); len(got) != 0 {
			t.Fatalf("statuses %v, want the connection reset", got)
		}
		if got, _ := exchange(t, n, public, get("a.cdn.test")+get(public.Addr().String())); !slices.Equal(got, []int{200, 403}) {
			t.Fatalf("statuses %v, want [200 403]", got)
		}
	})
	t.Run("nothing sent", func(t *testing.T) {
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		if _, err := c.Read(make([]byte, 1)); !isReset(err) {
			t.Fatalf("read %v, want the connection reset", err)
		}
		if d := time.Since(start); d < 900*time.Millisecond || d > 3*time.Second {
			t.Errorf("reset after %v, want about the 1 s window", d)
		}
	})
	t.Run("not HTTP", func(t *testing.T) {
		if _, err := exchange(t, n, public, "\x00\x01hello\r\n"); !isReset(err) {
			t.Fatalf("%v, want the connection reset", err)
		}
	})
	for _, h := range log.seen() {
		if h != "a.cdn.test" && h != "b.cdn.test" {
			t.Errorf("the upstream saw Host %q", h)
		}
	}
	if len(log.seen()) == 0 {
		t.Error("the upstream saw no request: the allowed ones did not pass")
	}
}

// On a port other than 80, a plain HTTP flow that a name rule admits is
// judged request by request too.
func TestHTTPFrontingOtherPort(t *testing.T) {
	n, log, public := frontingNet(t, 8080, "*.cdn.test:8080")
	if got, _ := exchange(t, n, public, get("a.cdn.test")+get("evil.test")); !slices.Equal(got, []int{200, 403}) {
		t.Fatalf("statuses %v, want [200 403]", got)
	}
	if got := log.seen(); !slices.Equal(got, []string{"a.cdn.test"}) {
		t.Fatalf("the upstream saw %v, want [a.cdn.test]", got)
	}
	// A client-first protocol that is not HTTP still passes by the names
	// the gateway knows for the address.
	c, err := n.dial(public.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 400") {
		t.Fatalf("read %q, %v: want the upstream's own answer (400)", line, err)
	}
}

// Each request is judged with the address the guest dialed, where the
// gateway sends it: an allowed name that resolves elsewhere is refused on
// this connection, as a connection of its own to this address would be.
func TestHTTPPerRequestAddress(t *testing.T) {
	n, log, public := frontingNet(t, 80, "a.cdn.test", "c.cdn.test")
	n.dns.set("c.cdn.test", "203.0.113.81")
	n.resolveA("c.cdn.test")
	if got, _ := exchange(t, n, public, get("a.cdn.test")+get("c.cdn.test")); !slices.Equal(got, []int{200, 403}) {
		t.Fatalf("statuses %v, want [200 403]", got)
	}
	if got := log.seen(); slices.Contains(got, "c.cdn.test") {
		t.Fatalf("the upstream saw %v", got)
	}
	n.waitEvent(t, func(e Event) bool { return e.Host == "c.cdn.test" && e.Verdict == "deny" && e.Reason == "not-resolved" })
}

// On the web ports a connection that names no host in its first bytes is
// refused even where an address rule admits the address; elsewhere the
// address rule is enough, so a protocol whose server speaks first works.
func TestWebPortsNeedAHost(t *testing.T) {
	for _, port := range []uint16{80, 443, 2222} {
		n, _, public := frontingNet(t, port, "203.0.113.80")
		c, err := n.dial(public.String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(3 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if port == 2222 {
			// httptest's server waits for a request: the read times out
			// with the connection still open.
			if isReset(err) {
				t.Errorf("port %d: %v, want the connection kept", port, err)
			}
			continue
		}
		if !isReset(err) {
			t.Errorf("port %d: read %v, want the connection reset", port, err)
		}
		n.waitEvent(t, func(e Event) bool { return e.Port == port && e.Verdict == "deny" && e.Reason == reasonNoHost })
	}
}
