package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/internal/testenv"
)

var loopback = &netHost{addr: netip.MustParseAddr("127.0.0.1"), peer: netip.MustParseAddr("127.0.0.1")}

func TestNetScenariosSelectable(t *testing.T) {
	all := Scenarios()
	for _, name := range []string{"net_tcp_throughput", "net_connect_latency", "net_dns_latency"} {
		if !slices.Contains(all, name) {
			t.Errorf("Scenarios() = %v, want it to hold %s", all, name)
		}
		if c := (Config{Scenarios: []string{name}}); !c.selected(name) || c.selected(ScenarioBoot) {
			t.Errorf("--only %s does not select exactly it", name)
		}
	}
}

func TestParseTimings(t *testing.T) {
	tests := []struct {
		name    string
		out     string
		want    int
		wantDs  []time.Duration
		wantErr string // empty: valid
	}{
		{"one a line", "1500000\n2000\n", 2, []time.Duration{1500 * time.Microsecond, 2 * time.Microsecond}, ""},
		{"no final newline, CRLF", "7\r\n8", 2, []time.Duration{7, 8}, ""},
		{"order kept", "3\n1\n2\n", 3, []time.Duration{3, 1, 2}, ""},
		{"too few", "1\n2\n", 3, nil, "printed 2 samples, want 3"},
		{"too many", "1\n2\n3\n4\n", 3, nil, "printed 4 samples, want 3"},
		{"nothing", "", 1, nil, "printed 0 samples, want 1"},
		{"not a number", "12\n1.5\n", 2, nil, `sample 2 of the timing loop, "1.5"`},
		{"a traceback instead", "Traceback (most recent call last):", 5, nil, `sample 1 of the timing loop, "Traceback"`},
		{"zero", "0\n5\n", 2, nil, "sample 1"},
		{"negative", "5\n-5\n", 2, nil, "sample 2"},
		{"overflow", "99999999999999999999\n", 1, nil, "sample 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds, err := parseTimings(tt.out, tt.want)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("parseTimings = %v", err)
				}
				if !slices.Equal(ds, tt.wantDs) {
					t.Errorf("parseTimings = %v, want %v", ds, tt.wantDs)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseTimings = %v, %v; want an error containing %q", ds, err, tt.wantErr)
			}
		})
	}
}

// TestNetHost makes the network scenarios' test host and checks that a
// connection from this host reaches a server in it, from the host's end
// of the veth.
func TestNetHost(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "a network namespace needs root")
	}
	h, err := newNetHost()
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	got := make(chan string, 1)
	srv, err := listenTCP(h, func(c net.Conn) { got <- c.RemoteAddr().String() })
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	c, err := net.DialTimeout("tcp", srv.addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case from := <-got:
		if netip.MustParseAddrPort(from).Addr() != h.peer {
			t.Errorf("connection from %s, want the veth's host end %s", from, h.peer)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server in the namespace got no connection")
	}
}

func TestMedianThroughput(t *testing.T) {
	m := medianThroughput(100<<20, []time.Duration{4 * time.Second, time.Second, 2 * time.Second})
	if m.Runs != 3 || m.Bytes != 100<<20 || m.Seconds != 2 || m.MiBPerS != 50 {
		t.Errorf("medianThroughput = %+v, want 3 runs, the 2 s one: 50 MiB/s", m)
	}
}

func TestBenchAnswer(t *testing.T) {
	tests := []struct {
		name      string
		qname     string
		qtype     uint16
		wantRcode int
		wantA     string // empty: no answer
	}{
		{"A of the name", "bench.test.", dns.TypeA, dns.RcodeSuccess, netDNSAnswer},
		{"any case", "BENCH.Test.", dns.TypeA, dns.RcodeSuccess, netDNSAnswer},
		{"AAAA of the name", "bench.test.", dns.TypeAAAA, dns.RcodeSuccess, ""},
		{"another name", "other.test.", dns.TypeA, dns.RcodeNameError, ""},
		{"below the name", "x.bench.test.", dns.TypeA, dns.RcodeNameError, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := new(dns.Msg).SetQuestion(tt.qname, tt.qtype)
			m := benchAnswer(q)
			if m.Id != q.Id || !m.Response || m.Rcode != tt.wantRcode {
				t.Fatalf("answer %v, want a reply to %d with rcode %d", m, q.Id, tt.wantRcode)
			}
			if tt.wantA == "" {
				if len(m.Answer) != 0 {
					t.Errorf("answers %v, want none", m.Answer)
				}
				return
			}
			if len(m.Answer) != 1 {
				t.Fatalf("answers %v, want one A", m.Answer)
			}
			if a, ok := m.Answer[0].(*dns.A); !ok || a.A.String() != tt.wantA || a.Hdr.Name != tt.qname {
				t.Errorf("answer %v, want %s A %s", m.Answer[0], tt.qname, tt.wantA)
			}
		})
	}
	if m := benchAnswer(new(dns.Msg)); m.Rcode != dns.RcodeFormatError {
		t.Errorf("no question: rcode %d, want FORMERR", m.Rcode)
	}
}

func TestCountConn(t *testing.T) {
	r := io.MultiReader(strings.NewReader("abc"), &slowReader{n: 5, delay: 10 * time.Millisecond})
	res := countConn(r)
	if res.err != nil || res.n != 8 {
		t.Fatalf("countConn = %+v, want 8 bytes and no error", res)
	}
	if res.d < 10*time.Millisecond {
		t.Errorf("time %v, want at least the 10 ms between the first and the last byte", res.d)
	}
	want := errors.New("reset")
	if res := countConn(io.MultiReader(strings.NewReader("ab"), errReader{want})); !errors.Is(res.err, want) || res.n != 2 {
		t.Errorf("countConn of a broken stream = %+v, want 2 bytes and its error", res)
	}
	if res := countConn(strings.NewReader("")); res.err != nil || res.n != 0 || res.d != 0 {
		t.Errorf("countConn of nothing = %+v", res)
	}
}

// slowReader yields n bytes, one a read, after delay each.
type slowReader struct {
	n     int
	delay time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	if s.n == 0 {
		return 0, io.EOF
	}
	time.Sleep(s.delay)
	s.n--
	p[0] = 'x'
	return 1, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// The sink on a real connection: it counts, times, and closes once the
// sender half-closed, which is what the sender waits for.
func TestSinkTime(t *testing.T) {
	s, err := startSink(loopback)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	send := func(n int) func(context.Context) error {
		return func(ctx context.Context) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", s.addr().String())
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.Write(make([]byte, n)); err != nil {
				return err
			}
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				return errors.New("the sink did not close the connection")
			}
			return nil
		}
	}
	ctx := context.Background()
	if _, err := s.time(ctx, 3<<20, send(3<<20)); err != nil {
		t.Fatalf("3 MiB: %v", err)
	}
	if _, err := s.time(ctx, 3<<20, send(3<<20-1)); err == nil || !strings.Contains(err.Error(), "received 3145727 bytes") {
		t.Errorf("one byte short: %v, want the count in an error", err)
	}
	want := errors.New("no sender")
	if _, err := s.time(ctx, 1, func(context.Context) error { return want }); !errors.Is(err, want) {
		t.Errorf("a failing sender: %v, want its error", err)
	}
	// An earlier run's count is not taken for this one's.
	s.results <- sinkResult{n: 99}
	if _, err := s.time(ctx, 5, send(5)); err != nil {
		t.Errorf("after a stale count: %v", err)
	}
}

// A server on a host address takes connections from that address only.
func TestTCPServerTakesOnlyItsOwnAddress(t *testing.T) {
	s, err := startSink(loopback)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	c, err := d.Dial("tcp", s.addr().String())
	if err != nil {
		testenv.Lacking(t, "no 127.0.0.2 to dial from: %v", err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n > 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v; want the server to close the connection", n, err)
	}
	// A sink that took the connection would have counted it by the time
	// it closed it.
	select {
	case res := <-s.results:
		t.Errorf("the sink counted a connection from another address: %+v", res)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestTCPServerCloseEndsOpenConnections(t *testing.T) {
	s, err := startSink(loopback)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("x")) // the sink now holds the connection, reading
	done := make(chan struct{})
	go func() { s.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end a connection still open")
	}
}

// hostPythonOrSkip is the host's python3; without one the test is
// Lacking.
func hostPythonOrSkip(t *testing.T) string {
	t.Helper()
	p, err := hostPython()
	if err != nil {
		testenv.Lacking(t, "%v", err)
	}
	return p
}

// The host side of the network scenarios, on real servers: netProbe's
// every mode, as the baseline runs it.
func TestNetProbeOnHost(t *testing.T) {
	python := hostPythonOrSkip(t)
	ctx := context.Background()
	run := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := runOnHost(ctx, netProbeArgv(python, args[0], args[1:]...), &out)
		return out.String(), err
	}

	t.Run("version", func(t *testing.T) {
		out, err := run(t, "version")
		if err != nil || !strings.HasPrefix(out, "3.") {
			t.Errorf("version = %q, %v", out, err)
		}
	})
	t.Run("send", func(t *testing.T) {
		s, err := startSink(loopback)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		to := s.addr()
		d, err := s.time(ctx, 3<<20, func(ctx context.Context) error {
			_, err := run(t, "send", to.Addr().String(), strconv.Itoa(int(to.Port())), "3")
			return err
		})
		if err != nil || d <= 0 {
			t.Errorf("3 MiB to the sink: %v, %v", d, err)
		}
	})
	t.Run("connect", func(t *testing.T) {
		srv, err := startFirstByte(loopback)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.close()
		to := srv.addr()
		out, err := run(t, "connect", to.Addr().String(), strconv.Itoa(int(to.Port())), "2", "7")
		if err != nil {
			t.Fatal(err)
		}
		if ds, err := parseTimings(out, 7); err != nil || slices.Min(ds) <= 0 {
			t.Errorf("connect printed %q: %v", out, err)
		}
		// A server that sends nothing fails the loop.
		mute, err := listenTCP(loopback, func(net.Conn) {})
		if err != nil {
			t.Fatal(err)
		}
		defer mute.close()
		m := mute.addr()
		if _, err := run(t, "connect", m.Addr().String(), strconv.Itoa(int(m.Port())), "0", "1"); err == nil ||
			!strings.Contains(err.Error(), "want b'x'") {
			t.Errorf("a mute server: %v, want the loop to fail", err)
		}
	})
	t.Run("dns", func(t *testing.T) {
		up, err := startDNSUpstream()
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := up.close(); err != nil {
				t.Error(err)
			}
		}()
		host, port := up.addr.Addr().String(), strconv.Itoa(int(up.addr.Port()))
		out, err := run(t, "dns", host, port, netDNSName, "2", "9")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseTimings(out, 9); err != nil {
			t.Errorf("dns printed %q: %v", out, err)
		}
		if _, err := run(t, "dns", host, port, "other.test", "0", "1"); err == nil || !strings.Contains(err.Error(), "rcode 3") {
			t.Errorf("a name without an address: %v, want the loop to fail on NXDOMAIN", err)
		}
	})
}
