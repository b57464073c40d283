package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/testhost"
)

// The network scenarios run the same Python program, netProbe, in a
// sandbox and on the host, so that their ratios price the sandbox's
// network (virtio-net, the gateway's userspace TCP/IP stack, its policy and
// its own connection or query upstream) and not a language or a tool.
// They use template base, the one with python3, whatever Config.Template
// says: busybox nc, the only client template tiny has, copies 1 KiB per
// poll, read and write, which under TCG caps the guest near 2.4 MiB/s
// where Python's 64 KiB writes from the same guest reach 35 MiB/s.
const netTemplate = "base"

// Sizes and counts of the network scenarios.
const (
	// netThroughputMiB is what one run of net_tcp_throughput sends.
	netThroughputMiB = 100
	// netThroughputRuns is how many runs each side of net_tcp_throughput
	// makes, alternating; the median one by time counts.
	netThroughputRuns = 5
	// netRounds is how many processes each side of a latency scenario
	// runs, alternating, and netPerRound how many samples each of them
	// times after netWarmup untimed ones.
	netRounds   = 5
	netPerRound = 10
	netWarmup   = 5
	// netHTTPRequests is how many requests one process of
	// net_http_keepalive sends on its connection.
	netHTTPRequests = 1000
	// netRunTimeout bounds one process of a latency scenario, Python's
	// start under TCG included.
	netRunTimeout = 2 * time.Minute
)

// The DNS upstream of net_dns_latency answers netDNSName's A query with
// netDNSAnswer, a documentation address outside the set the gateway drops
// from answers, so that the guest gets the answer whole; nobody connects
// to it.
const (
	netDNSName   = "bench.test"
	netDNSAnswer = "198.51.100.1"
)

// netProbe is the program both sides of the network scenarios run, as
// `python3 -c netProbe MODE ARGS...`:
//
//	send HOST PORT MIB             MIB MiB in 64 KiB writes on one connection, then
//	                               half-close and wait for the server to close
//	connect HOST PORT WARMUP N     connect and read the server's first byte, N+WARMUP
//	                               times; prints the last N times
//	dns SERVER PORT NAME WARMUP N  an A query for NAME over UDP, N+WARMUP times;
//	                               prints the last N times
//	http HOST PORT NAME WARMUP N FRESH
//	                               N+WARMUP GETs with Host NAME, each to its 200
//	                               and body "ok": on one kept-alive connection
//	                               (FRESH 0) or each on a new one (FRESH 1);
//	                               prints the last N times
//	version                        prints Python's version
//
// Times are in nanoseconds, one a line, from time.perf_counter_ns. A
// connection that does not bring the byte, or a query answered with an
// error or no answer, exits with a message.
const netProbe = `import platform, socket, struct, sys, time

def send(host, port, mib):
    s = socket.create_connection((host, int(port)), timeout=60)
    buf = bytes(65536)
    for _ in range(int(mib) * 16):
        s.sendall(buf)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()

def connect(host, port, warmup, n):
    out = []
    for i in range(int(warmup) + int(n)):
        t0 = time.perf_counter_ns()
        s = socket.create_connection((host, int(port)), timeout=10)
        b = s.recv(1)
        t1 = time.perf_counter_ns()
        s.close()
        if b != b"x":
            sys.exit("connection %d: got %r from the server, want b'x'" % (i, b))
        if i >= int(warmup):
            out.append(t1 - t0)
    return out

def dns(server, port, name, warmup, n):
    qname = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.connect((server, int(port)))
    out = []
    for i in range(int(warmup) + int(n)):
        q = struct.pack(">6H", (i * 7919 + 1) & 0xffff, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">2H", 1, 1)
        t0 = time.perf_counter_ns()
        s.send(q)
        while True:
            r = s.recv(1232)
            if len(r) >= 12 and r[:2] == q[:2]:
                break
        t1 = time.perf_counter_ns()
        rcode, answers = r[3] & 15, struct.unpack(">H", r[6:8])[0]
        if rcode or answers < 1:
            sys.exit("query %d for %s: rcode %d, %d answers" % (i, name, rcode, answers))
        if i >= int(warmup):
            out.append(t1 - t0)
    return out

def http(host, port, name, warmup, n, fresh):
    req = ("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name).encode()
    s = f = None
    out = []
    for i in range(int(warmup) + int(n)):
        t0 = time.perf_counter_ns()
        if s is None:
            s = socket.create_connection((host, int(port)), timeout=30)
            f = s.makefile("rb")
        s.sendall(req)
        status, length = f.readline(), 0
        while True:
            line = f.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        body = f.read(length)
        t1 = time.perf_counter_ns()
        if not status.startswith(b"HTTP/1.1 200") or body != b"ok":
            sys.exit("request %d: %r %r from the server, want 200 and b'ok'" % (i, status, body))
        if fresh == "1":
            f.close()
            s.close()
            s = None
        if i >= int(warmup):
            out.append(t1 - t0)
    return out

def version():
    return [platform.python_version()]

out = {"send": send, "connect": connect, "dns": dns, "http": http, "version": version}[sys.argv[1]](*sys.argv[2:])
if out:
    print("\n".join(map(str, out)))
`

// netProbeArgv runs netProbe's mode with args under python.
func netProbeArgv(python, mode string, args ...string) []string {
	return append([]string{python, "-c", netProbe, mode}, args...)
}

// parseTimings reads what netProbe's timing loops print: want samples in
// nanoseconds, one a line.
func parseTimings(out string, want int) ([]time.Duration, error) {
	fields := strings.Fields(out)
	if len(fields) != want {
		return nil, fmt.Errorf("the timing loop printed %d samples, want %d: %q", len(fields), want, clip(out))
	}
	ds := make([]time.Duration, 0, want)
	for i, f := range fields {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil || ns <= 0 {
			return nil, fmt.Errorf("sample %d of the timing loop, %q, is not a positive count of nanoseconds", i+1, clip(f))
		}
		ds = append(ds, time.Duration(ns))
	}
	return ds, nil
}

// hostPython finds python3 on the host, for the baseline side.
func hostPython() (string, error) {
	p, err := exec.LookPath("python3")
	if err != nil {
		return "", fmt.Errorf("the network scenarios run python3 on the host as their baseline: %w", err)
	}
	return p, nil
}

// pythonVersions asks both sides which Python runs netProbe, for the
// notes. A side that cannot say is "unknown": the timed runs will fail
// with the reason.
func pythonVersions(ctx context.Context, sb *sandbox.Sandbox, python string) (guest, host string) {
	ctx, cancel := context.WithTimeout(ctx, netRunTimeout)
	defer cancel()
	var g, h bytes.Buffer
	guest, host = "unknown", "unknown"
	if runInSandbox(ctx, sb, netProbeArgv("python3", "version"), &g) == nil {
		guest = strings.TrimSpace(g.String())
	}
	if runOnHost(ctx, netProbeArgv(python, "version"), &h) == nil {
		host = strings.TrimSpace(h.String())
	}
	return guest, host
}

// netHost is where the network scenarios' servers run: a test host in a
// network namespace of its own (198.19.N.2), joined to this host by a veth
// pair whose host end is 198.19.N.1. A gateway never dials the host's own
// addresses, and nothing sent there leaves the machine.
type netHost struct {
	host *testhost.Host // nil: addr is the host's own (the unit tests' loopback)
	addr netip.Addr     // the servers' address, in the namespace
	peer netip.Addr     // the host's end of the veth: where every connection to addr comes from
}

// newNetHost makes the test host; close removes it.
func newNetHost() (*netHost, error) {
	n := os.Getpid()%200 + 20
	h := &netHost{
		addr: netip.AddrFrom4([4]byte{198, 19, byte(n), 2}),
		peer: netip.AddrFrom4([4]byte{198, 19, byte(n), 1}),
	}
	var err error
	h.host, err = testhost.New(testhost.Config{
		Name:      fmt.Sprintf("alb%d", os.Getpid()),
		HostAddrs: []netip.Prefix{netip.PrefixFrom(h.peer, 29)},
		Addrs:     []netip.Prefix{netip.PrefixFrom(h.addr, 29)},
	})
	if err != nil {
		return nil, fmt.Errorf("the network scenarios' test host (a network namespace, which needs root): %w", err)
	}
	return h, nil
}

func (h *netHost) close() {
	if h.host != nil {
		h.host.Close()
	}
}

// listen listens on TCP port of h (0: a free one).
func (h *netHost) listen(port uint16) (ln net.Listener, err error) {
	listen := func() error {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(h.addr, port).String())
		return err
	}
	if h.host == nil {
		return ln, listen()
	}
	return ln, h.host.Do(listen)
}

// tcpServer accepts TCP connections on a port of a netHost and hands
// each to handle on a goroutine of its own. It takes only connections from
// the host's end of the veth, where the host's own connections to it, the
// gateway's included, come from; others are closed unread.
type tcpServer struct {
	ln     net.Listener
	handle func(net.Conn)
	wg     sync.WaitGroup // the accept loop and every handler; close waits for them

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

// listenTCP starts a tcpServer on a free port of h. Its goroutines end
// with close.
func listenTCP(h *netHost, handle func(net.Conn)) (*tcpServer, error) {
	return listenTCPOn(h, 0, handle)
}

// listenTCPOn is listenTCP on port (0: a free one).
func listenTCPOn(h *netHost, port uint16, handle func(net.Conn)) (*tcpServer, error) {
	ln, err := h.listen(port)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", h.addr, err)
	}
	s := &tcpServer{ln: ln, handle: handle, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.serve(h.peer) // ends when close closes the listener
	return s, nil
}

func (s *tcpServer) serve(from netip.Addr) {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		if peer, err := netip.ParseAddrPort(c.RemoteAddr().String()); err != nil || peer.Addr().Unmap() != from {
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.conns == nil { // closing
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() { // ends when handle returns; close ends a handler's connection
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.handle(c)
		}()
	}
}

// addr is where the server listens.
func (s *tcpServer) addr() netip.AddrPort {
	return netip.MustParseAddrPort(s.ln.Addr().String())
}

// close stops accepting, closes the open connections and waits for every
// goroutine of the server.
func (s *tcpServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.conns = nil
	s.mu.Unlock()
	s.wg.Wait()
}

// sinkResult is what a sink counted on one connection: its bytes and the
// time from the first to the last, or why it broke off.
type sinkResult struct {
	n   int64
	d   time.Duration
	err error
}

// sink is a tcpServer that reads each connection to its end, counting,
// and then closes it; net_tcp_throughput's senders wait for that close.
type sink struct {
	*tcpServer
	results chan sinkResult // one per connection; a full channel drops them
}

// sinkResults is how many results a sink holds until they are read: only
// one connection at a time is expected.
const sinkResults = 8

func startSink(host *netHost) (*sink, error) {
	s := &sink{results: make(chan sinkResult, sinkResults)}
	srv, err := listenTCP(host, func(c net.Conn) {
		select {
		case s.results <- countConn(c):
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	s.tcpServer = srv
	return s, nil
}

// sinkReadSize is the sink's read buffer.
const sinkReadSize = 256 << 10

// countConn reads r to its end and times its bytes from the return of the
// read that brought the first to that of the read that brought the last.
func countConn(r io.Reader) sinkResult {
	buf := make([]byte, sinkReadSize)
	var res sinkResult
	var first, last time.Time
	for {
		k, err := r.Read(buf)
		if k > 0 {
			last = time.Now()
			if res.n == 0 {
				first = last
			}
			res.n += int64(k)
		}
		if err != nil {
			res.d = last.Sub(first)
			if !errors.Is(err, io.EOF) {
				res.err = err
			}
			return res
		}
	}
}

// sinkWait bounds the wait for the sink's count once the sender exited:
// the sink counts before it closes the connection the sender waits on, so
// the count is there unless the sender never connected.
const sinkWait = 5 * time.Second

// time runs send, which must send want bytes to the sink on one
// connection and return once the sink closed it, and returns the time the
// sink saw the bytes arrive in.
func (s *sink) time(ctx context.Context, want int64, send func(context.Context) error) (time.Duration, error) {
	for len(s.results) > 0 { // what an earlier, failed run left
		<-s.results
	}
	if err := send(ctx); err != nil {
		return 0, err
	}
	select {
	case res := <-s.results:
		if res.err != nil {
			return 0, fmt.Errorf("the sink's connection broke after %d bytes: %w", res.n, res.err)
		}
		if res.n != want {
			return 0, fmt.Errorf("the sink received %d bytes, want %d", res.n, want)
		}
		return res.d, nil
	case <-time.After(sinkWait):
		return 0, errors.New("the sender exited, but the sink counted no connection")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// medianThroughput describes size bytes moved in each of ds: the median
// run by time, with the count of runs.
func medianThroughput(size int64, ds []time.Duration) Measurement {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	m := throughput(size, percentile(sorted, 50))
	m.Runs = len(ds)
	return m
}

// firstByteWriteTimeout bounds the one write of a startFirstByte server.
const firstByteWriteTimeout = 10 * time.Second

// startFirstByte starts net_connect_latency's server: it writes "x" on
// every connection and closes it.
func startFirstByte(host *netHost) (*tcpServer, error) {
	return listenTCP(host, func(c net.Conn) {
		c.SetWriteDeadline(time.Now().Add(firstByteWriteTimeout))
		c.Write([]byte("x"))
	})
}

// dnsUpstream is net_dns_latency's resolver on the host's loopback: the
// gateway's upstream, and what the host side queries directly.
type dnsUpstream struct {
	srv  *dns.Server
	addr netip.AddrPort
	done chan error // the serving goroutine's end
}

// startDNSUpstream serves benchAnswer over UDP on a free port of
// 127.0.0.1. Its goroutine ends with close.
func startDNSUpstream() (*dnsUpstream, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("DNS upstream: %w", err)
	}
	started := make(chan struct{})
	u := &dnsUpstream{
		addr: netip.MustParseAddrPort(pc.LocalAddr().String()),
		done: make(chan error, 1),
		srv: &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) },
			Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { w.WriteMsg(benchAnswer(q)) })},
	}
	go func() { u.done <- u.srv.ActivateAndServe() }() // ends with Shutdown
	select {
	case <-started:
		return u, nil
	case err := <-u.done:
		pc.Close()
		return nil, fmt.Errorf("DNS upstream: %w", err)
	}
}

// close stops the server and waits for its goroutine.
func (u *dnsUpstream) close() error {
	err := u.srv.Shutdown()
	<-u.done
	return err
}

// benchAnswer answers q: netDNSAnswer for an A query of netDNSName, no
// records for its other types, NXDOMAIN for any other name.
func benchAnswer(q *dns.Msg) *dns.Msg {
	m := new(dns.Msg).SetReply(q)
	if len(q.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	qq := q.Question[0]
	switch {
	case !strings.EqualFold(strings.TrimSuffix(qq.Name, "."), netDNSName):
		m.Rcode = dns.RcodeNameError
	case qq.Qtype == dns.TypeA && qq.Qclass == dns.ClassINET:
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   net.ParseIP(netDNSAnswer),
		})
	}
	return m
}

// netSandbox creates a sandbox of template netTemplate whose gateway
// enforces pol and asks upstream for names ("" means the host's
// resolvers), on a runtime of its own with the bench's directory,
// accelerator and boot timeout. The caller destroys it.
func (r *runner) netSandbox(ctx context.Context, scenario string, pol policy.Policy, upstream string) (*sandbox.Sandbox, string, error) {
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: r.cfg.Dir, Accel: r.cfg.Accel, BootTimeout: r.cfg.BootTimeout,
		Log: r.cfg.Log, Network: sandbox.NetworkConfig{DNSUpstream: upstream}})
	if err != nil {
		return nil, "", err
	}
	tpl, err := rt.Templates().Resolve(netTemplate)
	if err != nil {
		return nil, "", fmt.Errorf("%s needs template %s (python3): %w", scenario, netTemplate, err)
	}
	r.progressf("%s: creating a %s sandbox that may reach %s", scenario, tpl.Ref(), strings.Join(pol.Allow, ", "))
	start := time.Now()
	sb, err := rt.Create(ctx, sandbox.Spec{Template: netTemplate, Network: &pol})
	if err != nil {
		return nil, "", err
	}
	if sb.Gateway() == nil {
		err := fmt.Errorf("sandbox %s has no network device", sb.ID)
		return nil, "", errors.Join(err, destroy(sb))
	}
	r.progressf("%s: sandbox ready in %.0f ms", scenario, ms(time.Since(start)))
	return sb, tpl.Ref(), nil
}

// netTCPThroughput measures netThroughputMiB sent from a sandbox over one
// TCP connection through its gateway to a sink on the host, against the
// same sender on the host into the same sink.
func (r *runner) netTCPThroughput(ctx context.Context) (_ Result, err error) {
	python, err := hostPython()
	if err != nil {
		return Result{}, err
	}
	host, err := newNetHost()
	if err != nil {
		return Result{}, err
	}
	defer host.close()
	s, err := startSink(host)
	if err != nil {
		return Result{}, err
	}
	defer s.close()
	to := s.addr()
	sb, tpl, err := r.netSandbox(ctx, ScenarioNetThroughput, policy.Policy{Egress: "deny", Allow: []string{to.String()}}, "")
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, destroy(sb)) }()
	guestPy, hostPy := pythonVersions(ctx, sb, python)

	size := int64(netThroughputMiB) << 20
	args := []string{to.Addr().String(), strconv.Itoa(int(to.Port())), strconv.Itoa(netThroughputMiB)}
	timeout := streamTimeout(netThroughputMiB)
	sender := func(run func(context.Context) error) measure {
		return func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return s.time(ctx, size, run)
		}
	}
	guest := sender(func(ctx context.Context) error {
		return runInSandbox(ctx, sb, netProbeArgv("python3", "send", args...), nil)
	})
	hostSide := sender(func(ctx context.Context) error {
		return runOnHost(ctx, netProbeArgv(python, "send", args...), nil)
	})
	n := netThroughputRuns
	da, db, err := timePairs(ctx, n, guest, hostSide, func(i int, da, db time.Duration) {
		r.progressf("%s %d/%d: sandbox %.1f MiB/s, host %.1f MiB/s", ScenarioNetThroughput, i, n,
			throughput(size, da).MiBPerS, throughput(size, db).MiBPerS)
	})
	if err != nil {
		return Result{}, err
	}
	a, b := medianThroughput(size, da), medianThroughput(size, db)
	return Result{
		Name:     ScenarioNetThroughput,
		Unit:     "MiB/s",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.MiBPerS, b.MiBPerS),
		Notes: fmt.Sprintf("airlock: Python %s in a %s sandbox sends %d MiB in 64 KiB writes over one TCP connection "+
			"through its gateway (virtio-net, the gateway's userspace TCP/IP stack, its connection on the host) to a "+
			"byte counter on a test host at %s (a network namespace behind a veth pair), allowed by a literal "+
			"policy entry; baseline: the same program under the host's Python %s into the same counter, over the same veth; timed by the "+
			"counter from the first byte's arrival to the last's, byte counts verified; %d runs each, alternating, "+
			"the median by time counts; ratio of MiB/s", guestPy, tpl, netThroughputMiB, to, hostPy, n),
	}, nil
}

// netConnectLatency measures a connection from a sandbox through its
// gateway to a host server until the server's first byte, against the
// same loop on the host to the same server.
func (r *runner) netConnectLatency(ctx context.Context) (_ Result, err error) {
	python, err := hostPython()
	if err != nil {
		return Result{}, err
	}
	host, err := newNetHost()
	if err != nil {
		return Result{}, err
	}
	defer host.close()
	srv, err := startFirstByte(host)
	if err != nil {
		return Result{}, err
	}
	defer srv.close()
	to := srv.addr()
	sb, tpl, err := r.netSandbox(ctx, ScenarioNetConnect, policy.Policy{Egress: "deny", Allow: []string{to.String()}}, "")
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, destroy(sb)) }()
	guestPy, hostPy := pythonVersions(ctx, sb, python)

	args := []string{to.Addr().String(), strconv.Itoa(int(to.Port())), strconv.Itoa(netWarmup), strconv.Itoa(netPerRound)}
	a, b, err := r.netLatency(ctx, ScenarioNetConnect, netPerRound, inSandbox("sandbox", sb, netProbeArgv("python3", "connect", args...)), onHost(netProbeArgv(python, "connect", args...)))
	if err != nil {
		return Result{}, err
	}
	return Result{
		Name:     ScenarioNetConnect,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("airlock: Python %s in a %s sandbox connects through its gateway to a server on a test host "+
			"(a network namespace behind a veth pair) at %s that writes one byte and closes, and reads that byte (the gateway completes the guest's "+
			"handshake, judges the flow by the literal policy entry that allows it, and connects on the host); "+
			"baseline: the same program under the host's Python %s to the same server; each sample from before "+
			"connect to the byte's arrival, timed inside the program (time.perf_counter_ns), so no exec counts; "+
			"%d processes each side, alternating, each timing %d connections after %d untimed; ratio of p50s",
			guestPy, tpl, to, hostPy, netRounds, netPerRound, netWarmup),
	}, nil
}

// netDNSLatency measures a DNS query from a sandbox to its gateway, which
// judges it and asks the upstream, against the same query from the host
// straight to the upstream.
func (r *runner) netDNSLatency(ctx context.Context) (_ Result, err error) {
	python, err := hostPython()
	if err != nil {
		return Result{}, err
	}
	up, err := startDNSUpstream()
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, up.close()) }()
	sb, tpl, err := r.netSandbox(ctx, ScenarioNetDNS, policy.Policy{Egress: "deny", Allow: []string{netDNSName}}, up.addr.String())
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, destroy(sb)) }()
	guestPy, hostPy := pythonVersions(ctx, sb, python)

	counts := []string{netDNSName, strconv.Itoa(netWarmup), strconv.Itoa(netPerRound)}
	guestArgv := netProbeArgv("python3", "dns", append([]string{gateway.GatewayIP, "53"}, counts...)...)
	hostArgv := netProbeArgv(python, "dns", append([]string{up.addr.Addr().String(), strconv.Itoa(int(up.addr.Port()))}, counts...)...)
	a, b, err := r.netLatency(ctx, ScenarioNetDNS, netPerRound, inSandbox("sandbox", sb, guestArgv), onHost(hostArgv))
	if err != nil {
		return Result{}, err
	}
	return Result{
		Name:     ScenarioNetDNS,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("airlock: Python %s in a %s sandbox sends an A query for %s over UDP to its gateway "+
			"(%s:53), which allows the name by a policy entry, asks the upstream and filters the answer; the upstream "+
			"is a resolver of the bench's on the host's loopback (%s) answering %s; baseline: the same program under "+
			"the host's Python %s sends the same query straight to that upstream; each sample from the send to the "+
			"answer's arrival, timed inside the program (time.perf_counter_ns), so no exec counts; every answer "+
			"checked (no error, an address); %d processes each side, alternating, each timing %d queries after %d "+
			"untimed; ratio of p50s", guestPy, tpl, netDNSName, gateway.GatewayIP, up.addr, netDNSAnswer, hostPy,
			netRounds, netPerRound, netWarmup),
	}, nil
}

// netSide is one side of a latency scenario: a label for the progress
// lines, and what runs netProbe's timing loop there.
type netSide struct {
	label string
	run   func(ctx context.Context, w io.Writer) error
}

// inSandbox runs argv in sb; onHost runs it on the host.
func inSandbox(label string, sb *sandbox.Sandbox, argv []string) netSide {
	return netSide{label, func(ctx context.Context, w io.Writer) error { return runInSandbox(ctx, sb, argv, w) }}
}

func onHost(argv []string) netSide {
	return netSide{"host", func(ctx context.Context, w io.Writer) error { return runOnHost(ctx, argv, w) }}
}

// netLatency runs a timing loop of netProbe netRounds times on each side,
// alternating, each printing perRound samples, and summarizes every sample
// of each side.
func (r *runner) netLatency(ctx context.Context, scenario string, perRound int, a, b netSide) (Measurement, Measurement, error) {
	var air, base []time.Duration
	loop := func(samples *[]time.Duration, run func(context.Context, io.Writer) error) measure {
		return func(ctx context.Context) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, netRunTimeout)
			defer cancel()
			var out bytes.Buffer
			if err := run(ctx, &out); err != nil {
				return 0, err
			}
			ds, err := parseTimings(out.String(), perRound)
			if err != nil {
				return 0, err
			}
			*samples = append(*samples, ds...)
			var sum time.Duration
			for _, d := range ds {
				sum += d
			}
			return sum, nil
		}
	}
	sides := []side{
		{a.label + " run", loop(&air, a.run)},
		{b.label + " run", loop(&base, b.run)},
	}
	if _, err := timeRounds(ctx, netRounds, sides, func(i int, ds []time.Duration) {
		r.progressf("%s %d/%d: %s mean %.3f ms, %s mean %.3f ms", scenario, i, netRounds,
			a.label, ms(ds[0]/time.Duration(perRound)), b.label, ms(ds[1]/time.Duration(perRound)))
	}); err != nil {
		return Measurement{}, Measurement{}, err
	}
	return summarize(air), summarize(base), nil
}

// httpOK answers every HTTP/1.1 request on c with 200 and the body "ok",
// keeping the connection, until c closes or sends what does not parse:
// the least a server can do, so that the scenarios price the gateway.
func httpOK(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// netHTTP measures HTTP requests from a sandbox through its gateway to a
// server on a test host: to port 80, where the gateway reads every request
// and judges its Host, against the same requests to another port of the
// same server, which the policy admits by address alone so that the
// gateway splices the connection. keepAlive: netHTTPRequests requests on
// one connection; else each request on a new connection.
func (r *runner) netHTTP(ctx context.Context, keepAlive bool) (_ Result, err error) {
	scenario := ScenarioNetHTTPConnect
	if keepAlive {
		scenario = ScenarioNetHTTPKeepAlive
	}
	host, err := newNetHost()
	if err != nil {
		return Result{}, err
	}
	defer host.close()
	web, err := listenTCPOn(host, 80, httpOK)
	if err != nil {
		return Result{}, err
	}
	defer web.close()
	other, err := listenTCP(host, httpOK)
	if err != nil {
		return Result{}, err
	}
	defer other.close()
	pol := policy.Policy{Egress: "deny", Allow: []string{web.addr().String(), other.addr().String()}}
	sb, tpl, err := r.netSandbox(ctx, scenario, pol, "")
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, destroy(sb)) }()
	guestPy, _ := pythonVersions(ctx, sb, "python3")

	perRound, warmup, fresh := netHTTPRequests, netWarmup, "0"
	if !keepAlive {
		perRound, fresh = netPerRound, "1"
	}
	argv := func(to netip.AddrPort) []string {
		return netProbeArgv("python3", "http", to.Addr().String(), strconv.Itoa(int(to.Port())), netDNSName,
			strconv.Itoa(warmup), strconv.Itoa(perRound), fresh)
	}
	a, b, err := r.netLatency(ctx, scenario, perRound, inSandbox("per-request", sb, argv(web.addr())), inSandbox("spliced", sb, argv(other.addr())))
	if err != nil {
		return Result{}, err
	}
	what := fmt.Sprintf("%d GETs on one kept-alive connection, each timed from its send to its whole answer", perRound)
	if !keepAlive {
		what = fmt.Sprintf("%d GETs, each on a new connection, timed from before the connect to the whole answer", perRound)
	}
	return Result{
		Name:     scenario,
		Unit:     "ms",
		Airlock:  a,
		Baseline: b,
		Ratio:    ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("airlock: Python %s in a %s sandbox sends %s (Host %s) through its gateway to port 80 of a test "+
			"host at %s, where the gateway reads each request, judges its Host by the policy and forwards it (the policy "+
			"admits the address by a literal entry); baseline: the same program in the same sandbox to port %d of the same "+
			"server, which the same kind of entry admits by address alone, so that the gateway splices the connection "+
			"after its first judgment; the server answers 200 and \"ok\" without a look at the request; timed inside the "+
			"program (time.perf_counter_ns) after %d untimed; %d processes each side, alternating; ratio of p50s",
			guestPy, tpl, what, netDNSName, web.addr().Addr(), other.addr().Port(), warmup, netRounds),
	}, nil
}
