package mitm

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

const (
	testHost   = "api.example.test"
	testSecret = "Bearer sk-test-9f8e7d6c5b4a"
)

// seenRequest is one request as the upstream test server received it.
type seenRequest struct {
	Method   string
	Path     string
	RawQuery string
	Host     string
	Header   http.Header
	Body     string
}

// upstreamServer is an HTTP(S) test server that records every request and echoes it as JSON.
type upstreamServer struct {
	srv   *httptest.Server
	roots *x509.CertPool // trusts srv's certificate; nil for plain HTTP

	mu   sync.Mutex // guards seen
	seen []seenRequest

	// bodyRead, when set, receives the first 5 body bytes of /stream-in before the rest is read.
	bodyRead chan string
	// release, when set, holds /stream-out between its first and second chunk.
	release chan struct{}
}

// newUpstream starts the test server; with certCA it serves TLS for testHost signed by certCA.
func newUpstream(t *testing.T, certCA *CA) *upstreamServer {
	t.Helper()
	return newUpstreamCert(t, certCA, testHost)
}

// newUpstreamCert is newUpstream with a certificate for certName.
func newUpstreamCert(t *testing.T, certCA *CA, certName string) *upstreamServer {
	t.Helper()
	u := &upstreamServer{bodyRead: make(chan string, 1), release: make(chan struct{})}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.handle))
	if certCA == nil {
		u.srv.Start()
	} else {
		leaf, err := certCA.Leaf(certName)
		if err != nil {
			t.Fatal(err)
		}
		u.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
		u.srv.StartTLS()
		u.roots = x509.NewCertPool()
		u.roots.AppendCertsFromPEM(certCA.CertPEM())
	}
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstreamServer) record(r *http.Request, body string) seenRequest {
	s := seenRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Host: r.Host,
		Header: r.Header.Clone(), Body: body}
	u.mu.Lock()
	u.seen = append(u.seen, s)
	u.mu.Unlock()
	return s
}

func (u *upstreamServer) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

func (u *upstreamServer) handle(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/ws":
		u.record(r, "")
		u.handleUpgrade(w, r)
		return
	case "/stream-in":
		buf := make([]byte, 5)
		io.ReadFull(r.Body, buf)
		u.bodyRead <- string(buf)
		rest, _ := io.ReadAll(r.Body)
		u.record(r, string(buf)+string(rest))
		w.Write([]byte("done"))
		return
	case "/stream-out":
		u.record(r, "")
		w.Write([]byte("first;"))
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-time.After(10 * time.Second):
		}
		w.Write([]byte("second"))
		return
	}
	body, _ := io.ReadAll(r.Body)
	s := u.record(r, string(body))
	if r.URL.Path == "/redirect" {
		http.Redirect(w, r, "https://other.example.test/landing", http.StatusFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s)
}

// handleUpgrade switches to a line protocol: it greets, then echoes each line back.
func (u *upstreamServer) handleUpgrade(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "want an upgrade", http.StatusBadRequest)
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nhello\n")
	rw.Flush()
	for {
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		rw.WriteString("echo: " + line)
		rw.Flush()
	}
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// fixture is one proxy wired to one upstream address.
type fixture struct {
	t      *testing.T
	ca     *CA
	proxy  *Proxy
	dials  atomic.Int32
	inj    func(call int) ([]Injection, bool)
	calls  atomic.Int32
	tlsOn  bool
	target string // the upstream address every dial goes to
}

// defaultInjections sets testSecret as Authorization on every request.
func defaultInjections(int) ([]Injection, bool) {
	return []Injection{{Header: "Authorization", Value: testSecret}}, true
}

func newFixture(t *testing.T, tlsOn bool, target string, roots *x509.CertPool, inj func(int) ([]Injection, bool)) *fixture {
	t.Helper()
	ca, err := NewCA("airlock test sandbox CA")
	if err != nil {
		t.Fatal(err)
	}
	if inj == nil {
		inj = defaultInjections
	}
	f := &fixture{t: t, ca: ca, inj: inj, tlsOn: tlsOn, target: target}
	f.proxy, err = New(Config{
		CA:      ca,
		RootCAs: roots,
		Dial: func(ctx context.Context, host string, port uint16) (net.Conn, error) {
			if host != testHost || port != 443 {
				return nil, fmt.Errorf("dial to unexpected %s:%d", host, port)
			}
			f.dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", f.target)
		},
		Judge: func(host string) Verdict {
			if host != testHost {
				return Verdict{}
			}
			inj, ok := f.inj(int(f.calls.Add(1)))
			return Verdict{Allowed: ok, Inject: inj, Credentialed: true}
		},
		Log: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// serveResult is what one Serve call returned.
type serveResult struct {
	out, in int64
	err     error
}

// guest is the guest's end of one intercepted connection.
type guest struct {
	conn net.Conn
	br   *bufio.Reader
	done chan struct{} // closed when Serve has returned res
	res  serveResult
}

// connect starts Serve on a fresh connection and returns the guest's end, the TLS handshake done
// with the given SNI (TLS mode), trusting the sandbox CA.
func (f *fixture) connect(ctx context.Context, sni string) (*guest, error) {
	f.t.Helper()
	return f.connectTLS(ctx, &tls.Config{ServerName: sni, RootCAs: trustPool(f.ca), NextProtos: []string{"http/1.1"}})
}

// connectTLS is connect with the guest's TLS configuration given.
func (f *fixture) connectTLS(ctx context.Context, cfg *tls.Config) (*guest, error) {
	f.t.Helper()
	client, server := tcpPair(f.t)
	g := &guest{conn: client, done: make(chan struct{})}
	go func() {
		out, in, err := f.proxy.Serve(ctx, Conn{Guest: server, Host: testHost, Port: 443, TLS: f.tlsOn})
		g.res = serveResult{out, in, err}
		close(g.done)
	}()
	// Serve logs to the test: it must end before the test does.
	f.t.Cleanup(func() { client.Close(); <-g.done })
	if f.tlsOn {
		tc := tls.Client(client, cfg)
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			return g, err
		}
		tc.SetDeadline(time.Time{})
		g.conn = tc
	}
	g.br = bufio.NewReader(g.conn)
	return g, nil
}

// do writes a raw request and reads the final response (skipping 1xx) and its body.
func (g *guest) do(raw string) (*http.Response, []byte, error) {
	g.conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer g.conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(g.conn, raw); err != nil {
		return nil, nil, err
	}
	return g.read(methodOf(raw))
}

func (g *guest) read(method string) (*http.Response, []byte, error) {
	for {
		resp, err := http.ReadResponse(g.br, &http.Request{Method: method})
		if err != nil {
			return nil, nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			body, err := io.ReadAll(resp.Body)
			return resp, body, err
		}
	}
}

func methodOf(raw string) string {
	m, _, _ := strings.Cut(raw, " ")
	return m
}

// closedByProxy reports whether the proxy closed the connection (the next read ends, not times out).
func (g *guest) closedByProxy() bool {
	g.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := g.br.ReadByte()
	return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// result waits for Serve to return.
func (g *guest) result(t *testing.T) serveResult {
	t.Helper()
	select {
	case <-g.done:
		return g.res
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
		return serveResult{}
	}
}

func get(path, host string, extra ...string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n" + strings.Join(extra, "") + "\r\n"
}

// step is one request of a case and what should come of it.
type step struct {
	req    string
	status int
	// seen: the upstream received this request; auth is then the Authorization values it saw.
	seen  bool
	auth  []string
	check func(t *testing.T, got seenRequest, resp *http.Response, body []byte)
}

func TestServe(t *testing.T) {
	injectOnce := func(call int) ([]Injection, bool) {
		if call > 1 {
			return nil, false
		}
		return defaultInjections(call)
	}
	tests := []struct {
		name    string
		inj     func(call int) ([]Injection, bool)
		steps   []step
		closed  bool  // the proxy closes the connection after the last step
		dials   int32 // upstream connections made
		wantErr error // Serve's error must match (errors.Is); nil: no error
	}{
		{
			name:  "injects the header",
			steps: []step{{req: get("/a", testHost), status: 200, seen: true, auth: []string{testSecret}}},
			dials: 1,
		},
		{
			name: "replaces every guest copy",
			steps: []step{{
				req:    get("/a", testHost, "Authorization: Bearer guest-one\r\n", "authorization: guest-two\r\n"),
				status: 200, seen: true, auth: []string{testSecret},
			}},
			dials: 1,
		},
		{
			name: "keep-alive: second request injected too, one upstream connection",
			steps: []step{
				{req: get("/one", testHost), status: 200, seen: true, auth: []string{testSecret}},
				{req: get("/two", testHost, "Authorization: Bearer guest\r\n"), status: 200, seen: true, auth: []string{testSecret}},
			},
			dials: 1,
		},
		{
			name: "HEAD then GET on the same connection",
			steps: []step{
				{req: "HEAD /h HTTP/1.1\r\nHost: " + testHost + "\r\n\r\n", status: 200, seen: true, auth: []string{testSecret},
					check: func(t *testing.T, _ seenRequest, resp *http.Response, body []byte) {
						if len(body) != 0 || resp.Close {
							t.Errorf("HEAD: body %q, close %v", body, resp.Close)
						}
					}},
				{req: get("/g", testHost), status: 200, seen: true, auth: []string{testSecret}},
			},
			dials: 1,
		},
		{
			name: "pipelined requests",
			steps: []step{
				{req: get("/one", testHost) + get("/two", testHost), status: 200, seen: true, auth: []string{testSecret}},
				{status: 200, seen: true, auth: []string{testSecret}},
			},
			dials: 1,
		},
		{
			name: "host case, port and trailing dot are ignored",
			steps: []step{{req: get("/a", "API.Example.TEST.:443"), status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					if got.Host != "API.Example.TEST.:443" {
						t.Errorf("upstream Host = %q, want the guest's", got.Host)
					}
				}}},
			dials: 1,
		},
		{
			name:    "other host: 421 without contacting the upstream",
			steps:   []step{{req: get("/a", "evil.example.test"), status: http.StatusMisdirectedRequest}},
			closed:  true,
			wantErr: errdefs.ErrPermission,
		},
		{
			name:    "absolute-form URL to another host: 421",
			steps:   []step{{req: get("https://evil.example.test/a", testHost), status: http.StatusMisdirectedRequest}},
			closed:  true,
			wantErr: errdefs.ErrPermission,
		},
		{
			name:    "host with a suffix: 421",
			steps:   []step{{req: get("/a", testHost+".evil.test"), status: http.StatusMisdirectedRequest}},
			closed:  true,
			wantErr: errdefs.ErrPermission,
		},
		{
			name:    "HTTP/1.0 without Host: 421",
			steps:   []step{{req: "GET / HTTP/1.0\r\n\r\n", status: http.StatusMisdirectedRequest}},
			closed:  true,
			wantErr: errdefs.ErrPermission,
		},
		{
			name: "second request to another host: 421, first went through",
			steps: []step{
				{req: get("/one", testHost), status: 200, seen: true, auth: []string{testSecret}},
				{req: get("/two", "evil.example.test", "Authorization: Bearer guest\r\n"), status: http.StatusMisdirectedRequest},
			},
			closed:  true,
			dials:   1,
			wantErr: errdefs.ErrPermission,
		},
		{
			name: "policy revoked mid-connection: 403",
			inj:  injectOnce,
			steps: []step{
				{req: get("/one", testHost), status: 200, seen: true, auth: []string{testSecret}},
				{req: get("/two", testHost), status: http.StatusForbidden},
			},
			closed:  true,
			dials:   1,
			wantErr: errdefs.ErrPermission,
		},
		{
			name: "redirect goes back to the guest unfollowed",
			steps: []step{{req: get("/redirect", testHost), status: http.StatusFound, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, _ seenRequest, resp *http.Response, _ []byte) {
					if loc := resp.Header.Get("Location"); loc != "https://other.example.test/landing" {
						t.Errorf("Location = %q", loc)
					}
				}}},
			dials: 1,
		},
		{
			name: "secret only in its header, never in body, query or other headers",
			steps: []step{{
				req: "POST /store?note=hello&q=2 HTTP/1.1\r\nHost: " + testHost + "\r\nCookie: c=1\r\nUser-Agent: guest/1\r\n" +
					"X-Api-Key: guest-key\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world",
				status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					if got.Body != "hello world" || got.RawQuery != "note=hello&q=2" {
						t.Errorf("body %q query %q, want the guest's", got.Body, got.RawQuery)
					}
					for k, vs := range got.Header {
						for _, v := range vs {
							if k != "Authorization" && strings.Contains(v, "sk-test") {
								t.Errorf("secret in header %s", k)
							}
						}
					}
					if got.Header.Get("X-Api-Key") != "guest-key" || got.Header.Get("User-Agent") != "guest/1" {
						t.Errorf("guest headers changed: %v", got.Header)
					}
				}}},
			dials: 1,
		},
		{
			name: "no user agent is added",
			steps: []step{{req: get("/a", testHost), status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					if ua, ok := got.Header["User-Agent"]; ok {
						t.Errorf("User-Agent %q added", ua)
					}
				}}},
			dials: 1,
		},
		{
			name: "chunked request body",
			steps: []step{{
				req:    "POST /c HTTP/1.1\r\nHost: " + testHost + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
				status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					if got.Body != "hello world" {
						t.Errorf("body = %q", got.Body)
					}
				}}},
			dials: 1,
		},
		{
			name: "expect 100-continue",
			steps: []step{{
				req:    "PUT /e HTTP/1.1\r\nHost: " + testHost + "\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
				status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					if got.Body != "abc" {
						t.Errorf("body = %q", got.Body)
					}
				}}},
			dials: 1,
		},
		{
			name: "hop-by-hop headers removed, injected header survives Connection",
			steps: []step{{
				req: get("/h", testHost, "Connection: keep-alive, Authorization, X-Drop\r\n", "X-Drop: 1\r\n",
					"Proxy-Authorization: Basic Zm9v\r\n", "Keep-Alive: 300\r\n", "X-Keep: 2\r\n"),
				status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					for _, h := range []string{"X-Drop", "Proxy-Authorization", "Keep-Alive"} {
						if _, ok := got.Header[h]; ok {
							t.Errorf("%s reached the upstream", h)
						}
					}
					if got.Header.Get("X-Keep") != "2" {
						t.Errorf("X-Keep lost")
					}
				}}},
			dials: 1,
		},
		{
			name:   "connection close",
			steps:  []step{{req: get("/a", testHost, "Connection: close\r\n"), status: 200, seen: true, auth: []string{testSecret}}},
			closed: true,
			dials:  1,
		},
		{
			name:  "no injection for the host: guest's header passes",
			inj:   func(int) ([]Injection, bool) { return nil, true },
			steps: []step{{req: get("/a", testHost, "Authorization: Bearer guest\r\n"), status: 200, seen: true, auth: []string{"Bearer guest"}}},
			dials: 1,
		},
		{
			name: "two injections",
			inj: func(int) ([]Injection, bool) {
				return []Injection{{"Authorization", testSecret}, {"x-api-key", "k2"}}, true
			},
			steps: []step{{req: get("/a", testHost, "X-API-KEY: guest\r\n"), status: 200, seen: true, auth: []string{testSecret},
				check: func(t *testing.T, got seenRequest, _ *http.Response, _ []byte) {
					if v := got.Header.Values("X-Api-Key"); len(v) != 1 || v[0] != "k2" {
						t.Errorf("X-Api-Key = %q", v)
					}
				}}},
			dials: 1,
		},
		{
			name:    "injection value with a newline: 502, nothing sent",
			inj:     func(int) ([]Injection, bool) { return []Injection{{"Authorization", "Bearer a\r\nX-Evil: 1"}}, true },
			steps:   []step{{req: get("/a", testHost), status: http.StatusBadGateway}},
			closed:  true,
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:    "injection of a framing header: 502, nothing sent",
			inj:     func(int) ([]Injection, bool) { return []Injection{{"Content-Length", "5"}}, true },
			steps:   []step{{req: get("/a", testHost), status: http.StatusBadGateway}},
			closed:  true,
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:    "header block over 64 KiB: 431",
			steps:   []step{{req: get("/a", testHost, "X-Big: "+strings.Repeat("a", 70<<10)+"\r\n"), status: http.StatusRequestHeaderFieldsTooLarge}},
			closed:  true,
			wantErr: errdefs.ErrTooLarge,
		},
		{
			name:    "header block just over 64 KiB: 431",
			steps:   []step{{req: get("/a", testHost, "X-Big: "+strings.Repeat("a", 64<<10)+"\r\n"), status: http.StatusRequestHeaderFieldsTooLarge}},
			closed:  true,
			wantErr: errdefs.ErrTooLarge,
		},
		{
			name:  "header block just under 64 KiB passes",
			steps: []step{{req: get("/a", testHost, "X-Big: "+strings.Repeat("a", 63<<10)+"\r\n"), status: 200, seen: true, auth: []string{testSecret}}},
			dials: 1,
		},
		{
			name:    "HTTP/2 preface: 505",
			steps:   []step{{req: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", status: http.StatusHTTPVersionNotSupported}},
			closed:  true,
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:    "CONNECT: 405",
			steps:   []step{{req: "CONNECT " + testHost + ":443 HTTP/1.1\r\nHost: " + testHost + ":443\r\n\r\n", status: http.StatusMethodNotAllowed}},
			closed:  true,
			wantErr: errdefs.ErrInvalid,
		},
		{
			name:   "malformed request: 400",
			steps:  []step{{req: "GET / HTTP/1.1\r\nHost: " + testHost + "\r\nBad Header\r\n\r\n", status: http.StatusBadRequest}},
			closed: true,
			// Any error will do.
			wantErr: errAny,
		},
	}
	for _, mode := range []struct {
		name string
		tls  bool
	}{{"tls", true}, {"plain", false}} {
		for _, tt := range tests {
			t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
				var up *upstreamServer
				if mode.tls {
					upCA, err := NewCA("upstream test CA")
					if err != nil {
						t.Fatal(err)
					}
					up = newUpstream(t, upCA)
				} else {
					up = newUpstream(t, nil)
				}
				f := newFixture(t, mode.tls, up.srv.Listener.Addr().String(), up.roots, tt.inj)
				g, err := f.connect(t.Context(), testHost)
				if err != nil {
					t.Fatalf("handshake: %v", err)
				}
				seen := 0
				for i, st := range tt.steps {
					var resp *http.Response
					var body []byte
					if st.req != "" {
						resp, body, err = g.do(st.req)
					} else {
						resp, body, err = g.read("GET")
					}
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if resp.StatusCode != st.status {
						t.Fatalf("step %d: status %d, want %d (body %q)", i, resp.StatusCode, st.status, body)
					}
					reqs := up.requests()
					if st.seen {
						seen++
					}
					// Pipelined requests may run ahead; the exact count is checked at the end.
					if len(reqs) < seen {
						t.Fatalf("step %d: upstream saw %d requests, want %d", i, len(reqs), seen)
					}
					if !st.seen {
						if strings.Contains(string(body), "sk-test") {
							t.Errorf("step %d: secret in the gateway's reply", i)
						}
						continue
					}
					got := reqs[seen-1]
					if a := got.Header.Values("Authorization"); strings.Join(a, "|") != strings.Join(st.auth, "|") {
						t.Errorf("step %d: upstream Authorization = %q, want %q", i, a, st.auth)
					}
					if st.check != nil {
						st.check(t, got, resp, body)
					}
				}
				if tt.closed && !g.closedByProxy() {
					t.Error("connection still open, want closed by the proxy")
				}
				g.conn.Close()
				r := g.result(t)
				if n := len(up.requests()); n != seen {
					t.Errorf("upstream saw %d requests in all, want %d", n, seen)
				}
				switch {
				case tt.wantErr == errAny && r.err == nil:
					t.Error("Serve returned nil, want an error")
				case tt.wantErr != nil && tt.wantErr != errAny && !errors.Is(r.err, tt.wantErr):
					t.Errorf("Serve error = %v, want %v", r.err, tt.wantErr)
				case tt.wantErr == nil && r.err != nil:
					t.Errorf("Serve error = %v, want nil", r.err)
				}
				if d := f.dials.Load(); d != tt.dials {
					t.Errorf("dials = %d, want %d", d, tt.dials)
				}
				if tt.dials == 0 && (r.out != 0 || r.in != 0) {
					t.Errorf("bytes out %d in %d without an upstream", r.out, r.in)
				}
				if tt.dials > 0 && (r.out == 0 || r.in == 0) {
					t.Errorf("bytes out %d in %d, want both counted", r.out, r.in)
				}
			})
		}
	}
}

// errAny in wantErr accepts any non-nil error.
var errAny = errors.New("any error")

func TestGuestHandshake(t *testing.T) {
	tests := []struct {
		name      string
		sni       string
		alpn      []string
		maxVer    uint16
		wantOK    bool
		wantProto string
	}{
		{name: "matching SNI", sni: testHost, alpn: []string{"http/1.1"}, wantOK: true, wantProto: "http/1.1"},
		{name: "SNI in upper case", sni: "API.EXAMPLE.TEST", wantOK: true},
		{name: "h2 offered too: http/1.1 chosen", sni: testHost, alpn: []string{"h2", "http/1.1"}, wantOK: true, wantProto: "http/1.1"},
		{name: "h2 only: refused", sni: testHost, alpn: []string{"h2"}},
		{name: "other SNI: refused", sni: "evil.example.test"},
		{name: "SNI with suffix: refused", sni: testHost + ".evil.test"},
		{name: "no SNI: refused", sni: "127.0.0.1"}, // Go sends no SNI for an IP
		{name: "TLS 1.1: refused", sni: testHost, maxVer: tls.VersionTLS11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, true, "127.0.0.1:1", nil, nil)
			cfg := &tls.Config{ServerName: tt.sni, RootCAs: trustPool(f.ca), NextProtos: tt.alpn}
			if !tt.wantOK {
				// Only the proxy may refuse: the guest would take any certificate.
				cfg.InsecureSkipVerify = true
			}
			if tt.maxVer != 0 {
				cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tt.maxVer
			}
			g, herr := f.connectTLS(t.Context(), cfg)
			if !tt.wantOK {
				if herr == nil {
					t.Fatal("handshake succeeded, want refused")
				}
				if r := g.result(t); r.err == nil || !strings.Contains(r.err.Error(), "guest tls handshake") {
					t.Errorf("Serve error = %v, want a handshake error", r.err)
				}
				if f.dials.Load() != 0 {
					t.Error("upstream dialed")
				}
				return
			}
			if herr != nil {
				t.Fatalf("handshake: %v", herr)
			}
			if p := g.conn.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != tt.wantProto {
				t.Errorf("ALPN = %q, want %q", p, tt.wantProto)
			}
			g.conn.Close()
			if r := g.result(t); r.err != nil {
				t.Errorf("Serve: %v", r.err)
			}
		})
	}
}

func TestUpstreamUntrusted(t *testing.T) {
	trusted, err := NewCA("trusted upstream CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("untrusted CA")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		certCA   *CA    // signs the upstream's certificate
		certName string // the name in it
	}{
		{name: "certificate from a CA not in RootCAs", certCA: other, certName: testHost},
		{name: "trusted certificate for another name", certCA: trusted, certName: "other.example.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstreamCert(t, tt.certCA, tt.certName)
			f := newFixture(t, true, up.srv.Listener.Addr().String(), trustPool(trusted), nil)
			g, err := f.connect(t.Context(), testHost)
			if err != nil {
				t.Fatal(err)
			}
			resp, body, err := g.do(get("/a", testHost))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadGateway {
				t.Errorf("status %d, want 502", resp.StatusCode)
			}
			if strings.Contains(string(body), "sk-test") {
				t.Error("secret in the reply")
			}
			if n := len(up.requests()); n != 0 {
				t.Errorf("upstream got %d requests", n)
			}
			if !g.closedByProxy() {
				t.Error("connection still open")
			}
			g.conn.Close()
			if r := g.result(t); r.err == nil || !strings.Contains(r.err.Error(), "x509") {
				t.Errorf("Serve error = %v, want an x509 error", r.err)
			}
		})
	}
}

func trustPool(ca *CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(ca.CertPEM())
	return p
}

func TestUpgrade(t *testing.T) {
	for _, mode := range []struct {
		name string
		tls  bool
	}{{"tls", true}, {"plain", false}} {
		t.Run(mode.name, func(t *testing.T) {
			var up *upstreamServer
			if mode.tls {
				upCA, err := NewCA("upstream CA")
				if err != nil {
					t.Fatal(err)
				}
				up = newUpstream(t, upCA)
			} else {
				up = newUpstream(t, nil)
			}
			f := newFixture(t, mode.tls, up.srv.Listener.Addr().String(), up.roots, nil)
			g, err := f.connect(t.Context(), testHost)
			if err != nil {
				t.Fatal(err)
			}
			resp, _, err := g.do(get("/ws", testHost, "Connection: Upgrade\r\n", "Upgrade: websocket\r\n", "Authorization: Bearer guest\r\n"))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
				t.Fatalf("status %d Upgrade %q, want 101 websocket", resp.StatusCode, resp.Header.Get("Upgrade"))
			}
			g.conn.SetDeadline(time.Now().Add(10 * time.Second))
			if line, err := g.br.ReadString('\n'); err != nil || line != "hello\n" {
				t.Fatalf("greeting %q, %v", line, err)
			}
			for _, msg := range []string{"ping\n", "second\n"} {
				io.WriteString(g.conn, msg)
				if line, err := g.br.ReadString('\n'); err != nil || line != "echo: "+msg {
					t.Fatalf("echo %q, %v; want %q", line, err, "echo: "+msg)
				}
			}
			reqs := up.requests()
			if len(reqs) != 1 || strings.Join(reqs[0].Header.Values("Authorization"), "|") != testSecret {
				t.Errorf("upgrade request at upstream: %+v", reqs)
			}
			g.conn.Close()
			if r := g.result(t); r.err != nil || r.out == 0 || r.in == 0 {
				t.Errorf("Serve = %+v, want nil error and bytes counted", r)
			}
		})
	}
}

// TestStreaming checks that bodies are streamed both ways, not collected first.
func TestStreaming(t *testing.T) {
	upCA, err := NewCA("upstream CA")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		head  string // request head, then "hello" is sent, then the upstream must have read it
		rest  string
		wantB string
	}{
		{name: "content-length body", head: "POST /stream-in HTTP/1.1\r\nHost: " + testHost + "\r\nContent-Length: 11\r\n\r\n",
			rest: " world", wantB: "hello world"},
		{name: "chunked body", head: "POST /stream-in HTTP/1.1\r\nHost: " + testHost + "\r\nTransfer-Encoding: chunked\r\n\r\n",
			rest: "6\r\n world\r\n0\r\n\r\n", wantB: "hello world"},
	}
	for _, tt := range tests {
		t.Run("request/"+tt.name, func(t *testing.T) {
			up := newUpstream(t, upCA)
			f := newFixture(t, true, up.srv.Listener.Addr().String(), up.roots, nil)
			g, err := f.connect(t.Context(), testHost)
			if err != nil {
				t.Fatal(err)
			}
			first := "hello"
			if strings.Contains(tt.head, "chunked") {
				first = "5\r\nhello\r\n"
			}
			io.WriteString(g.conn, tt.head+first)
			select {
			case got := <-up.bodyRead:
				if got != "hello" {
					t.Fatalf("upstream read %q", got)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("upstream did not get the first part of the body before the rest was sent")
			}
			io.WriteString(g.conn, tt.rest)
			resp, body, err := g.read("POST")
			if err != nil || resp.StatusCode != 200 || string(body) != "done" {
				t.Fatalf("response %v %q %v", resp, body, err)
			}
			if got := up.requests()[0]; got.Body != tt.wantB || got.Header.Get("Authorization") != testSecret {
				t.Errorf("upstream got body %q auth %q", got.Body, got.Header.Get("Authorization"))
			}
		})
	}
	t.Run("response", func(t *testing.T) {
		up := newUpstream(t, upCA)
		f := newFixture(t, true, up.srv.Listener.Addr().String(), up.roots, nil)
		g, err := f.connect(t.Context(), testHost)
		if err != nil {
			t.Fatal(err)
		}
		g.conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(g.conn, get("/stream-out", testHost))
		resp, err := http.ReadResponse(g.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len("first;"))
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first;" {
			t.Fatalf("first part %q, %v (the upstream holds the rest until it is read)", buf, err)
		}
		close(up.release)
		rest, err := io.ReadAll(resp.Body)
		if err != nil || string(rest) != "second" {
			t.Fatalf("rest %q, %v", rest, err)
		}
	})
}

// rawMode is how a rawUpstream treats its connections.
type rawMode int

const (
	keepAlive   rawMode = iota // answer every request, keep the connection
	silentClose                // close after each response without saying so
	connClose                  // answer with "Connection: close", then close
	eofBody                    // answer with a body that ends when the connection closes
	dropSecond                 // answer the first request, read the second and close unanswered
)

// rawUpstream is a plain-HTTP upstream on raw TCP that answers every request with "ok", counting
// bytes exactly.
type rawUpstream struct {
	ln   net.Listener
	mode rawMode

	mu            sync.Mutex // guards read, written, conns
	read, written int64
	conns         int
	wg            sync.WaitGroup
}

func newRawUpstream(t *testing.T, mode rawMode) *rawUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, mode: mode}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.wg.Add(1)
			go u.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); u.wg.Wait() })
	return u
}

func (u *rawUpstream) serve(c net.Conn) {
	defer u.wg.Done()
	defer c.Close()
	u.mu.Lock()
	u.conns++
	u.mu.Unlock()
	var in, out atomic.Int64
	cc := &countingConn{Conn: c, in: &in, out: &out}
	defer func() {
		u.mu.Lock()
		u.read += in.Load()
		u.written += out.Load()
		u.mu.Unlock()
	}()
	br := bufio.NewReader(cc)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if u.mode == dropSecond && n == 1 {
			return
		}
		resp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		switch u.mode {
		case connClose:
			resp = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
		case eofBody:
			resp = "HTTP/1.1 200 OK\r\n\r\nok"
		}
		if _, err := io.WriteString(cc, resp); err != nil {
			return
		}
		if u.mode == silentClose || u.mode == connClose || u.mode == eofBody {
			return
		}
	}
}

func TestUpstreamReconnect(t *testing.T) {
	tests := []struct {
		name      string
		mode      rawMode
		pause     bool   // wait between requests, as on an idle keep-alive, so a close arrives first
		method    string // "" is GET
		wantTE    string // Transfer-Encoding the guest sees
		wantConns int
		wantCodes []int // per request; nil: three 200s
	}{
		{name: "keep-alive: one connection", mode: keepAlive, wantConns: 1},
		{name: "upstream closes silently after each response", mode: silentClose, pause: true, wantConns: 3},
		{name: "upstream closes silently, no pause", mode: silentClose, wantConns: 3},
		{name: "upstream says Connection: close", mode: connClose, wantConns: 3},
		{name: "body until close: chunked for the guest", mode: eofBody, wantTE: "chunked", wantConns: 3},
		{name: "closed while the request was sent: GET retried", mode: dropSecond, wantConns: 3},
		{name: "closed while the request was sent: POST not retried", mode: dropSecond, method: "POST",
			wantConns: 1, wantCodes: []int{200, http.StatusBadGateway}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newRawUpstream(t, tt.mode)
			f := newFixture(t, false, up.ln.Addr().String(), nil, nil)
			g, err := f.connect(t.Context(), testHost)
			if err != nil {
				t.Fatal(err)
			}
			codes := tt.wantCodes
			if codes == nil {
				codes = []int{200, 200, 200}
			}
			for i, want := range codes {
				if tt.pause {
					time.Sleep(50 * time.Millisecond)
				}
				req := get(fmt.Sprintf("/%d", i), testHost)
				if tt.method == "POST" {
					req = fmt.Sprintf("POST /%d HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\n\r\nhi", i, testHost)
				}
				resp, body, err := g.do(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if resp.StatusCode != want {
					t.Fatalf("request %d: status %d, want %d", i, resp.StatusCode, want)
				}
				if want != 200 {
					break
				}
				if string(body) != "ok" || resp.Close {
					t.Fatalf("request %d: body %q, close %v", i, body, resp.Close)
				}
				if te := strings.Join(resp.TransferEncoding, ","); te != tt.wantTE {
					t.Errorf("request %d: Transfer-Encoding %q, want %q", i, te, tt.wantTE)
				}
			}
			g.conn.Close()
			r := g.result(t)
			if r.err != nil && tt.wantCodes == nil {
				t.Fatalf("Serve: %v", r.err)
			}
			up.ln.Close()
			up.wg.Wait()
			if up.conns != tt.wantConns || int(f.dials.Load()) != tt.wantConns {
				t.Errorf("upstream connections %d, dials %d, want %d", up.conns, f.dials.Load(), tt.wantConns)
			}
			if !tt.pause && tt.mode == silentClose {
				return // a request may have gone to a closed connection before the retry
			}
			if r.out != up.read || r.in != up.written {
				t.Errorf("counted out %d in %d, upstream read %d wrote %d", r.out, r.in, up.read, up.written)
			}
		})
	}
}

// TestRefusalWithUnreadBody checks that a refusal reaches a guest still sending a large body: the
// gateway must not reset the connection under it, which would fail the guest's write.
func TestRefusalWithUnreadBody(t *testing.T) {
	tests := []struct {
		name string
		tls  bool
	}{{"tls", true}, {"plain", false}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.tls, "127.0.0.1:1", nil, nil)
			g, err := f.connect(t.Context(), testHost)
			if err != nil {
				t.Fatal(err)
			}
			body := strings.Repeat("x", 512<<10)
			wrote := make(chan error, 1)
			go func() {
				_, err := io.WriteString(g.conn, "POST /upload HTTP/1.1\r\nHost: evil.example.test\r\nContent-Length: "+
					fmt.Sprint(len(body))+"\r\n\r\n"+body)
				wrote <- err
			}()
			time.Sleep(100 * time.Millisecond) // let the body pile up unread
			g.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, _, err := g.read("POST")
			if err != nil {
				t.Fatalf("guest lost the reply: %v", err)
			}
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("status %d, want 421", resp.StatusCode)
			}
			// A client that checks its write sees no reset either.
			if err := <-wrote; err != nil {
				t.Errorf("guest's write failed: %v", err)
			}
			g.conn.Close()
			g.result(t)
		})
	}
}

func TestIdleTimeout(t *testing.T) {
	up := newUpstream(t, nil)
	f := newFixture(t, false, up.srv.Listener.Addr().String(), nil, nil)
	f.proxy.idleTimeout = 200 * time.Millisecond
	g, err := f.connect(t.Context(), testHost)
	if err != nil {
		t.Fatal(err)
	}
	if resp, _, err := g.do(get("/a", testHost)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	start := time.Now()
	if !g.closedByProxy() {
		t.Fatal("idle connection not closed")
	}
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Errorf("closed after %v, before the idle timeout", el)
	}
	if r := g.result(t); r.err != nil {
		t.Errorf("Serve: %v", r.err)
	}
}

func TestContextEnds(t *testing.T) {
	up := newUpstream(t, nil)
	f := newFixture(t, false, up.srv.Listener.Addr().String(), nil, nil)
	ctx, cancel := context.WithCancel(t.Context())
	g, err := f.connect(ctx, testHost)
	if err != nil {
		t.Fatal(err)
	}
	if resp, _, err := g.do(get("/a", testHost)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	cancel()
	if r := g.result(t); !errors.Is(r.err, context.Canceled) {
		t.Errorf("Serve error = %v, want context.Canceled", r.err)
	}
}

func TestNewValidates(t *testing.T) {
	dial := func(context.Context, string, uint16) (net.Conn, error) { return nil, errors.New("no") }
	judge := func(string) Verdict { return Verdict{Allowed: true} }
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{name: "complete", cfg: Config{Dial: dial, Judge: judge}, ok: true},
		{name: "no Dial", cfg: Config{Judge: judge}},
		{name: "no Judge", cfg: Config{Dial: dial}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg)
			if (err == nil) != tt.ok {
				t.Errorf("New error = %v, want ok %v", err, tt.ok)
			}
			if p != nil && (p.idleTimeout != 2*time.Minute || p.log == nil) {
				t.Errorf("defaults: idle %v, log %v", p.idleTimeout, p.log)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}
