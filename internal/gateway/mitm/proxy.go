// Package mitm is the part of a sandbox's egress gateway that reads the guest's HTTP requests: to a
// host with credential rules, so that it can set the credential headers on them outside the VM, and
// every plain HTTP request, so that each is judged by its own Host.
//
// For HTTPS the guest's TLS is terminated with a leaf certificate from the sandbox's own CA (which
// the guest trusts), and every request goes on to the upstream over a new TLS connection dialed by
// the name the gateway judged and verified against the host's roots. Every request's Host must equal
// that name, and the policy is asked again before every request. A credential is only ever set as a
// whole header on a request to that verified upstream; bodies, queries and other headers are never
// touched, and redirects are never followed.
//
// A plain HTTP connection may be served request by request (Conn.PerRequest): each request may name
// its own host, which the caller judges, and all go to the one upstream the caller dials.
//
// The package does no policy and no name resolution: the caller judges the connection, resolves and
// checks addresses in Config.Dial, and says per request whether it may go and what to inject through
// Config.Judge.
package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

const (
	// maxRequestHeaderBytes bounds a guest request's header block (request line included).
	maxRequestHeaderBytes = 64 << 10
	// maxResponseHeaderBytes bounds an upstream response's header block.
	maxResponseHeaderBytes = 1 << 20
	// defaultIdleTimeout is how long a guest read may wait: between requests on a keep-alive
	// connection, and within a request's header or body.
	defaultIdleTimeout = 2 * time.Minute
	// defaultHandshakeTimeout bounds each TLS handshake, with the guest and with the upstream.
	defaultHandshakeTimeout = 30 * time.Second
	// lingerTimeout and maxLingerBytes bound the draining of a guest after an error reply.
	lingerTimeout  = 500 * time.Millisecond
	maxLingerBytes = 1 << 20
	// bufSize is the size of the guest and upstream read and write buffers.
	bufSize = 4 << 10
	// maxEmptyLines bounds the CR and LF bytes skipped before a request line.
	maxEmptyLines = 16
)

// Injection is one header to set on every request: Value is final (the secret already formatted).
type Injection struct{ Header, Value string }

// Verdict is what the caller says of one request to a host.
type Verdict struct {
	// Allowed false: the policy does not allow the host (now); the proxy answers 403 and closes.
	Allowed bool
	// Inject are the headers to set on the request.
	Inject []Injection
	// Credentialed: the host has credential rules, so TRACE and TRACK to it are refused (a server
	// that answers them echoes the request back).
	Credentialed bool
}

// Config configures a Proxy. Dial and Injections are required.
type Config struct {
	// CA makes the certificates shown to the guest. Required to serve TLS connections.
	CA *CA
	// RootCAs verifies upstream servers; nil means the host's system roots (crypto/x509 honours SSL_CERT_FILE).
	RootCAs *x509.CertPool
	// Dial opens a TCP connection to host:port for the upstream, by name (the caller resolves and checks
	// the addresses). Required.
	Dial func(ctx context.Context, host string, port uint16) (net.Conn, error)
	// Judge says whether a request to host may go and what to set on it. Asked before every request,
	// so a policy change applies to the next request on a keep-alive connection. host is the request's
	// host as sent, without a port ("" when it has none).
	Judge func(host string) Verdict
	Log   *slog.Logger // nil: discard
}

// Validate reports whether cfg can build a Proxy.
func (cfg *Config) Validate() error {
	if cfg.Dial == nil {
		return fmt.Errorf("mitm config: Dial is required: %w", errdefs.ErrInvalid)
	}
	if cfg.Judge == nil {
		return fmt.Errorf("mitm config: Judge is required: %w", errdefs.ErrInvalid)
	}
	return nil
}

// Proxy serves intercepted guest connections. It is safe for concurrent use; each Serve call is
// independent.
type Proxy struct {
	cfg              Config
	log              *slog.Logger
	idleTimeout      time.Duration // see defaultIdleTimeout; shorter in tests
	handshakeTimeout time.Duration // see defaultHandshakeTimeout
}

// New checks cfg and returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Proxy{
		cfg:              cfg,
		log:              log,
		idleTimeout:      defaultIdleTimeout,
		handshakeTimeout: defaultHandshakeTimeout,
	}, nil
}

// Conn is one intercepted guest connection.
type Conn struct {
	Guest net.Conn // the guest's side; no byte has been consumed from it (the caller replays peeked bytes)
	Host  string   // the name the gateway judged: TLS SNI (TLS true) or the first request's Host
	Port  uint16   // destination port the guest dialed (upstream is dialed on the same port)
	TLS   bool     // true: terminate TLS with CA.Leaf(Host) and speak TLS upstream; false: plain HTTP
	// PerRequest (plain HTTP only): a request may name another host than Host (or none); Judge
	// decides each. Otherwise every request's host must equal Host (421).
	PerRequest bool
}

// Serve proxies HTTP/1.1 requests on c until either side closes or ctx ends, and returns the bytes
// sent upstream and received from upstream.
//
// The byte counts are those on the upstream TCP connections (TLS records included), summed over
// reconnects. Serve owns c.Guest and closes it before returning. The error is nil when the guest
// closed or idled out between requests, or when a spliced (upgraded) connection ended; it is the
// context's error when ctx ended; requests refused by the policy or the Host check wrap
// errdefs.ErrPermission.
func (p *Proxy) Serve(ctx context.Context, c Conn) (bytesOut, bytesIn int64, err error) {
	s := &session{
		p:    p,
		c:    c,
		host: normalizeHost(c.Host),
		log:  p.log.With("host", normalizeHost(c.Host), "port", c.Port),
	}
	stop := context.AfterFunc(ctx, s.abort)
	err = s.run(ctx)
	if !stop() { // abort ran: whatever run saw, the context ended it
		err = ctx.Err()
	}
	s.close()
	return s.out.Load(), s.in.Load(), err
}

// session is the state of one Serve call. Apart from the fields under mu and the counters, it is
// used by the Serve goroutine alone, and by the splice goroutines once a connection is upgraded.
type session struct {
	p    *Proxy
	c    Conn
	host string // c.Host normalised
	log  *slog.Logger

	out, in atomic.Int64 // bytes written to and read from upstream connections

	guest net.Conn       // c.Guest, or the TLS server over it
	gr    *limitedReader // below gbr: idle deadlines and the header limit
	gbr   *bufio.Reader  // reads requests from the guest
	gw    *bufio.Writer  // writes responses to the guest

	up *upstream // the current upstream connection; nil before the first dial and after a close

	linger bool // an error reply was sent: drain the guest before closing, so it can read the reply

	mu      sync.Mutex // guards aborted and upRaw
	aborted bool       // ctx ended: no new upstream connection may stay open
	upRaw   net.Conn   // the raw connection under up, for abort to close
}

// upstream is one connection to the upstream server.
type upstream struct {
	conn   net.Conn       // TLS client or the counted raw connection
	raw    net.Conn       // the counted raw connection
	cr     *limitedReader // below br: the response header limit
	br     *bufio.Reader  // reads responses
	bw     *bufio.Writer  // writes requests
	served int            // responses read so far
	// peek is non-nil while a background br.Peek(1) runs between responses; it receives the Peek's
	// error (nil: a byte arrived). The goroutine ends when a byte arrives or the connection closes.
	peek chan error
}

// abort closes both raw connections so that every blocked read and write returns; it runs when ctx ends.
func (s *session) abort() {
	s.mu.Lock()
	s.aborted = true
	up := s.upRaw
	s.mu.Unlock()
	s.c.Guest.Close()
	if up != nil {
		up.Close()
	}
}

// close closes the guest and the upstream connection, and waits for the upstream's peek goroutine.
func (s *session) close() {
	s.dropUpstream()
	if s.linger {
		s.lingerGuest()
	}
	if s.guest != nil {
		s.guest.Close()
	}
	s.c.Guest.Close()
}

// lingerGuest ends the gateway's side of the guest connection and discards what the guest still
// sends, for a short while. Closing with unread input makes TCP reset the connection, and a reset
// can destroy the error reply before the guest reads it.
func (s *session) lingerGuest() {
	if tc, ok := s.guest.(*tls.Conn); ok {
		tc.CloseWrite()
	}
	if cw, ok := s.c.Guest.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	if s.c.Guest.SetReadDeadline(time.Now().Add(lingerTimeout)) == nil {
		io.CopyN(io.Discard, s.c.Guest, maxLingerBytes)
	}
}

func (s *session) run(ctx context.Context) error {
	if s.c.PerRequest && s.c.TLS {
		return fmt.Errorf("serve %q port %d: a TLS connection is not served per request: %w", s.c.Host, s.c.Port, errdefs.ErrInvalid)
	}
	if !s.c.PerRequest && !validLeafName(s.host) || s.c.Port == 0 {
		return fmt.Errorf("serve %q port %d: invalid destination: %w", s.c.Host, s.c.Port, errdefs.ErrInvalid)
	}
	s.guest = s.c.Guest
	if s.c.TLS {
		if s.p.cfg.CA == nil {
			return fmt.Errorf("serve %s: tls connection but Config.CA is nil: %w", s.host, errdefs.ErrInvalid)
		}
		tc := tls.Server(s.c.Guest, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
			GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
				if normalizeHost(hello.ServerName) != s.host {
					return nil, fmt.Errorf("server name %q is not %q", hello.ServerName, s.host)
				}
				return s.p.cfg.CA.Leaf(s.host)
			},
		})
		s.guest = tc
		hctx, cancel := context.WithTimeout(ctx, s.p.handshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return fmt.Errorf("guest tls handshake for %s: %w", s.host, err)
		}
	}
	s.gr = &limitedReader{r: s.guest, conn: s.guest, idle: s.p.idleTimeout, limit: -1}
	s.gbr = bufio.NewReaderSize(s.gr, bufSize)
	s.gw = bufio.NewWriterSize(s.guest, bufSize)
	for {
		more, err := s.serveRequest(ctx)
		if err != nil || !more {
			return err
		}
	}
}

// serveRequest reads one request from the guest and answers it. more false: the connection is done.
func (s *session) serveRequest(ctx context.Context) (more bool, err error) {
	// Wait for the first byte under the idle deadline: ending here is a normal close. Empty lines
	// before a request line are skipped, as servers do (RFC 9112 2.2).
	for skipped := 0; ; skipped++ {
		b, err := s.gbr.Peek(1)
		if err != nil {
			if isClosed(err) {
				return false, nil
			}
			return false, fmt.Errorf("read request: %w", err)
		}
		if b[0] != '\r' && b[0] != '\n' || skipped == maxEmptyLines {
			break
		}
		s.gbr.Discard(1)
	}

	s.gr.limit = maxRequestHeaderBytes + bufSize // the bufio slack; the exact check follows
	s.gr.hitLimit = false
	start := s.gr.total - int64(s.gbr.Buffered())
	req, err := http.ReadRequest(s.gbr)
	s.gr.limit = -1
	if err != nil {
		if s.gr.hitLimit {
			s.reply(http.StatusRequestHeaderFieldsTooLarge, "request header block over 64 KiB")
			return false, fmt.Errorf("read request: header block over %d bytes: %w", maxRequestHeaderBytes, errdefs.ErrTooLarge)
		}
		if isClosed(err) {
			return false, fmt.Errorf("read request: %w", err)
		}
		s.reply(http.StatusBadRequest, "malformed request")
		return false, fmt.Errorf("read request: %w", err)
	}
	if n := s.gr.total - int64(s.gbr.Buffered()) - start; n > maxRequestHeaderBytes {
		s.reply(http.StatusRequestHeaderFieldsTooLarge, "request header block over 64 KiB")
		return false, fmt.Errorf("read request: header block of %d bytes over %d: %w", n, maxRequestHeaderBytes, errdefs.ErrTooLarge)
	}

	if req.ProtoMajor != 1 {
		s.reply(http.StatusHTTPVersionNotSupported, "only HTTP/1.x is supported")
		return false, fmt.Errorf("request with protocol %s: %w", req.Proto, errdefs.ErrInvalid)
	}
	if req.Method == http.MethodConnect {
		s.reply(http.StatusMethodNotAllowed, "CONNECT is not supported")
		return false, fmt.Errorf("CONNECT request: %w", errdefs.ErrInvalid)
	}
	// req.Host is the absolute-form URL's host when there is one, else the Host header (ReadRequest
	// refuses two Host headers); it is also the Host that req.Write sends upstream.
	host := normalizeHost(hostname(req.Host))
	if !s.c.PerRequest && host != s.host {
		s.reply(http.StatusMisdirectedRequest, "request host does not match the connection's host")
		return false, fmt.Errorf("request for host %q on connection to %s: %w", req.Host, s.host, errdefs.ErrPermission)
	}

	v := s.p.cfg.Judge(host)
	if !v.Allowed {
		s.reply(http.StatusForbidden, "the sandbox's network policy does not allow this host")
		return false, fmt.Errorf("request to %q: the policy does not allow the host: %w", host, errdefs.ErrPermission)
	}
	// A server that answers TRACE echoes the request it got, credential
	// headers included, back to the guest.
	if (v.Credentialed || len(v.Inject) > 0) && (strings.EqualFold(req.Method, http.MethodTrace) || strings.EqualFold(req.Method, "TRACK")) {
		s.reply(http.StatusMethodNotAllowed, req.Method+" is refused on a host with credentials: the answer would echo them")
		return false, fmt.Errorf("%s request to a credential host: %w", req.Method, errdefs.ErrPermission)
	}
	inj := v.Inject
	if err := checkInjections(inj); err != nil {
		s.reply(http.StatusBadGateway, "credential configuration is invalid")
		return false, fmt.Errorf("request to %s: %w", host, err)
	}

	upType, err := s.prepare(req, inj)
	if err != nil {
		return false, err
	}
	guestClose := req.Close || req.ProtoMinor == 0

	resp, err := s.send(ctx, req)
	if err != nil {
		var gerr guestError
		if !errors.As(err, &gerr) {
			s.reply(http.StatusBadGateway, upstreamMessage(err))
		}
		return false, err
	}
	names := make([]string, len(inj))
	for i, in := range inj {
		names[i] = http.CanonicalHeaderKey(in.Header)
	}
	s.log.Debug("request", "method", req.Method, "status", resp.StatusCode, "injected", names)

	if resp.StatusCode == http.StatusSwitchingProtocols {
		return false, s.splice(req, resp, upType)
	}
	return s.relay(req, resp, guestClose)
}

// prepare turns the guest's request into the one sent upstream, in place: hop-by-hop headers go, the
// injections are set (after the guest's own copies are deleted), and nothing is added that the guest
// did not send. It returns the upgrade protocol kept on the request, if any.
func (s *session) prepare(req *http.Request, inj []Injection) (upType string, err error) {
	upType = upgradeType(req.Header)
	if strings.EqualFold(upType, "h2c") {
		upType = "" // HTTP/2 inside would escape the per-request checks
	}
	te := req.Header.Values("Te")
	removeHopByHop(req.Header)
	for _, v := range te {
		if hasToken(v, "trailers") {
			req.Header.Set("Te", "trailers")
			break
		}
	}
	if upType != "" {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", upType)
	}
	delete(req.Header, "Host") // req.Write sends req.Host

	expectContinue := false
	if expect := req.Header.Get("Expect"); expect != "" {
		if !strings.EqualFold(strings.TrimSpace(expect), "100-continue") {
			s.reply(http.StatusExpectationFailed, "unsupported Expect")
			return "", fmt.Errorf("request with Expect %q: %w", expect, errdefs.ErrInvalid)
		}
		// The gateway answers 100 Continue itself when it starts reading the body; the upstream
		// then gets the body at once.
		req.Header.Del("Expect")
		expectContinue = true
	}
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = &guestBody{rc: req.Body, gw: s.gw, sendContinue: expectContinue}
	}

	for _, in := range inj {
		deleteFold(req.Header, in.Header)
		req.Header[http.CanonicalHeaderKey(in.Header)] = []string{in.Value}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keeps req.Write from adding its own
	}
	if req.ProtoMinor == 0 {
		req.Close = true // HTTP/1.0 guests get one request per connection
	}
	return upType, nil
}

// send writes req upstream and reads its final response, relaying any 1xx responses to the guest.
// A request without a body that is safe to replay is retried once on a new connection when a
// reused keep-alive connection turns out to be closed.
func (s *session) send(ctx context.Context, req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		u, err := s.upstreamConn(ctx)
		if err != nil {
			return nil, err
		}
		retry := attempt == 0 && u.served > 0 && replayable(req)
		gb, _ := req.Body.(*guestBody)
		if gb != nil {
			gb.up = u.bw
		}
		// Not a *bufio.Writer, so req.Write neither wraps it nor copies a body through ReadFrom;
		// guestBody flushes it before each read from the guest instead.
		werr := req.Write(byteWriter{u.bw})
		if werr == nil {
			werr = u.bw.Flush()
		}
		if werr != nil {
			if gb != nil && gb.err != nil {
				return nil, guestError{fmt.Errorf("read request body from guest: %w", gb.err)}
			}
			if retry {
				s.dropUpstream()
				continue
			}
			return nil, fmt.Errorf("write request to %s: %w", s.host, werr)
		}
		if u.peek != nil {
			perr := <-u.peek
			u.peek = nil
			if perr != nil {
				if retry {
					s.dropUpstream()
					continue
				}
				return nil, fmt.Errorf("read response from %s: %w", s.host, perr)
			}
		}
		for {
			u.cr.limit = maxResponseHeaderBytes + bufSize
			u.cr.hitLimit = false
			resp, err := http.ReadResponse(u.br, req)
			u.cr.limit = -1
			if err != nil {
				if u.cr.hitLimit {
					err = fmt.Errorf("header block over %d bytes: %w", maxResponseHeaderBytes, errdefs.ErrTooLarge)
				}
				return nil, fmt.Errorf("read response from %s: %w", s.host, err)
			}
			u.served++
			if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
				return resp, nil
			}
			// 100, 102, 103: informational, then the real response follows.
			removeHopByHop(resp.Header)
			if err := s.writeHead(resp); err != nil {
				return nil, guestError{fmt.Errorf("write %d response to guest: %w", resp.StatusCode, err)}
			}
		}
	}
}

// upstreamConn returns the connection to send the next request on, dialing when there is none or
// the kept one has closed or sent bytes nobody asked for.
func (s *session) upstreamConn(ctx context.Context) (*upstream, error) {
	if u := s.up; u != nil {
		select {
		case <-u.peek: // the Peek ended before a request was sent: EOF, an error, or stray bytes
			u.peek = nil
			s.dropUpstream()
		default:
			return u, nil
		}
	}
	raw, err := s.p.cfg.Dial(ctx, s.host, s.c.Port)
	if err != nil {
		return nil, fmt.Errorf("dial %s port %d: %w", s.host, s.c.Port, err)
	}
	cc := &countingConn{Conn: raw, out: &s.out, in: &s.in}
	s.mu.Lock()
	aborted := s.aborted
	if !aborted {
		s.upRaw = cc
	}
	s.mu.Unlock()
	if aborted {
		raw.Close()
		return nil, fmt.Errorf("dial %s port %d: %w", s.host, s.c.Port, net.ErrClosed)
	}
	u := &upstream{conn: cc, raw: cc}
	s.up = u
	if s.c.TLS {
		tc := tls.Client(cc, &tls.Config{
			ServerName: s.host,
			RootCAs:    s.p.cfg.RootCAs,
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
		})
		u.conn = tc
		hctx, cancel := context.WithTimeout(ctx, s.p.handshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			s.dropUpstream()
			return nil, fmt.Errorf("tls handshake with %s: %w", s.host, err)
		}
	}
	u.cr = &limitedReader{r: u.conn, limit: -1}
	u.br = bufio.NewReaderSize(u.cr, bufSize)
	u.bw = bufio.NewWriterSize(u.conn, bufSize)
	return u, nil
}

// dropUpstream closes the current upstream connection, if any, and waits for its peek goroutine.
func (s *session) dropUpstream() {
	u := s.up
	if u == nil {
		return
	}
	s.up = nil
	s.mu.Lock()
	s.upRaw = nil
	s.mu.Unlock()
	u.conn.Close()
	u.raw.Close()
	if u.peek != nil {
		<-u.peek
	}
}

// relay streams resp to the guest and leaves the connections ready for the next request.
func (s *session) relay(req *http.Request, resp *http.Response, guestClose bool) (more bool, err error) {
	upstreamClose := resp.Close
	removeHopByHop(resp.Header)
	bodyless := req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified
	if req.ProtoMinor == 0 {
		// An HTTP/1.0 guest reads the body until the connection closes.
		guestClose = true
		if !bodyless && len(resp.TransferEncoding) > 0 {
			resp.TransferEncoding = nil
			resp.ContentLength = -1
		}
	} else {
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
		if !bodyless && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 {
			// A body that ends with the upstream connection is chunked for the guest, whose
			// connection can then stay open.
			resp.TransferEncoding = []string{"chunked"}
		}
	}
	if req.Method == http.MethodHead && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 {
		resp.ContentLength = 0 // else Response.Write takes the unknown length for a close-delimited body
	}
	resp.Close = guestClose
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = &flushingBody{rc: resp.Body, w: s.gw}
	}
	if err := resp.Write(writerOnly{s.gw}); err != nil {
		return false, fmt.Errorf("relay %d response from %s: %w", resp.StatusCode, s.host, err)
	}
	if err := s.gw.Flush(); err != nil {
		return false, fmt.Errorf("relay %d response from %s: %w", resp.StatusCode, s.host, err)
	}
	if upstreamClose {
		s.dropUpstream()
	} else if u := s.up; u != nil {
		u.peek = make(chan error, 1)
		go func(br *bufio.Reader, ch chan<- error) {
			_, err := br.Peek(1)
			ch <- err
		}(u.br, u.peek)
	}
	return !guestClose, nil
}

// splice relays a 101 response and then copies bytes both ways until either side closes.
func (s *session) splice(req *http.Request, resp *http.Response, upType string) error {
	got := upgradeType(resp.Header)
	if upType == "" || !strings.EqualFold(got, upType) {
		s.reply(http.StatusBadGateway, "upstream switched protocols unasked")
		return fmt.Errorf("upstream %s switched to %q when %q was asked", s.host, got, upType)
	}
	removeHopByHop(resp.Header)
	resp.Header.Set("Connection", "Upgrade")
	resp.Header.Set("Upgrade", got)
	if err := s.writeHead(resp); err != nil {
		return fmt.Errorf("relay 101 response from %s: %w", s.host, err)
	}
	u := s.up
	// Upgraded protocols may stay quiet for long; ctx and the two sides bound them now.
	s.gr.idle = 0
	if err := s.guest.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("splice with %s: %w", s.host, err)
	}
	s.log.Debug("upgraded", "protocol", got, "method", req.Method)

	done := make(chan struct{}, 2)
	go func() { // guest to upstream; ends when either connection closes
		io.Copy(u.conn, s.gbr)
		done <- struct{}{}
	}()
	go func() { // upstream to guest; ends when either connection closes
		io.Copy(s.guest, u.br)
		done <- struct{}{}
	}()
	<-done
	s.mu.Lock()
	s.upRaw = nil
	s.mu.Unlock()
	s.up = nil
	u.raw.Close()
	s.c.Guest.Close()
	<-done
	return nil
}

// writeHead writes a response without a body (1xx) to the guest and flushes it.
func (s *session) writeHead(resp *http.Response) error {
	text := http.StatusText(resp.StatusCode)
	if _, err := fmt.Fprintf(s.gw, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, text); err != nil {
		return err
	}
	if err := resp.Header.Write(s.gw); err != nil {
		return err
	}
	if _, err := s.gw.WriteString("\r\n"); err != nil {
		return err
	}
	return s.gw.Flush()
}

// reply answers the guest with a short plain-text error; the connection closes after it.
func (s *session) reply(code int, msg string) {
	s.linger = true
	body := "airlock gateway: " + msg + "\n"
	fmt.Fprintf(s.gw, "HTTP/1.1 %03d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
	s.gw.Flush()
}

// upstreamMessage says what went wrong upstream in words fit for the guest: the error itself may
// carry what the caller's Dial knows (addresses, policy), which stays out of the VM.
func upstreamMessage(err error) string {
	var verr *tls.CertificateVerificationError
	switch {
	case errors.As(err, &verr):
		return "the upstream's certificate did not verify: " + verr.Err.Error()
	case errors.Is(err, errdefs.ErrTooLarge):
		return "the upstream's response header block is too large"
	default:
		return "the upstream could not be reached or failed"
	}
}

// replayable reports whether req may be sent again after a connection failed before any response:
// no body and a method without side effects, as net/http's Transport judges.
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// isClosed reports whether err means the peer went away or the read idled out.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
