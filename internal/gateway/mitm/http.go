package mitm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 section 7.6.1 and their older relatives; they
// never cross the gateway (an upgrade's Connection and Upgrade are set again on purpose).
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// reservedHeaders may not be injected: they frame the message or steer the connection, and
// req.Write would drop or rewrite them.
var reservedHeaders = map[string]bool{
	"Host":              true,
	"Content-Length":    true,
	"Transfer-Encoding": true,
	"Trailer":           true,
	"Connection":        true,
	"Proxy-Connection":  true,
	"Keep-Alive":        true,
	"Te":                true,
	"Upgrade":           true,
	"Expect":            true,
}

// normalizeHost lower-cases an ASCII host name and drops one trailing dot.
func normalizeHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// hostname returns the host part of a Host value ("name", "name:port", "[v6]:port"), or "" when the
// port is not a number.
func hostname(hostport string) string {
	h, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return ""
		}
	}
	return h
}

// checkInjections refuses injections the gateway could not send as one well-formed header.
func checkInjections(inj []Injection) error {
	for _, in := range inj {
		if !validHeaderName(in.Header) {
			return fmt.Errorf("injection header %q: invalid name: %w", in.Header, errdefs.ErrInvalid)
		}
		if reservedHeaders[http.CanonicalHeaderKey(in.Header)] {
			return fmt.Errorf("injection header %s: reserved: %w", in.Header, errdefs.ErrInvalid)
		}
		if !validHeaderValue(in.Value) {
			// The value is a secret: name the header only.
			return fmt.Errorf("injection header %s: value has control characters: %w", in.Header, errdefs.ErrInvalid)
		}
	}
	return nil
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s holds no control characters other than tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// deleteFold deletes every key of h equal to name ignoring case, canonical or not.
func deleteFold(h http.Header, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// removeHopByHop deletes the hop-by-hop headers and every header the Connection header names.
func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				deleteFold(h, f)
			}
		}
	}
	for _, k := range hopHeaders {
		deleteFold(h, k)
	}
}

// hasToken reports whether the comma-separated list v holds token, ignoring case.
func hasToken(v, token string) bool {
	for _, f := range strings.Split(v, ",") {
		if strings.EqualFold(textproto.TrimString(f), token) {
			return true
		}
	}
	return false
}

// upgradeType returns the protocol h asks to upgrade to, or "".
func upgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		if hasToken(v, "upgrade") {
			return h.Get("Upgrade")
		}
	}
	return ""
}

// errLimit is returned by a limitedReader past its limit.
var errLimit = errors.New("read limit reached")

// limitedReader reads from r, counting, optionally capped and with an idle deadline per Read. The
// reader that owns it (one goroutine at a time) sets limit around a header block.
type limitedReader struct {
	r        io.Reader
	conn     net.Conn      // if set and idle > 0, each Read first moves conn's read deadline to idle from now
	idle     time.Duration // how long one Read may wait; 0: no deadline
	limit    int64         // bytes Read may still return; negative: no limit
	hitLimit bool          // a Read found the limit exhausted
	total    int64         // bytes read so far
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.limit == 0 {
		l.hitLimit = true
		return 0, errLimit
	}
	if l.limit > 0 && int64(len(p)) > l.limit {
		p = p[:l.limit]
	}
	if l.conn != nil && l.idle > 0 {
		if err := l.conn.SetReadDeadline(time.Now().Add(l.idle)); err != nil {
			return 0, err
		}
	}
	n, err := l.r.Read(p)
	l.total += int64(n)
	if l.limit > 0 {
		l.limit -= int64(n)
	}
	return n, err
}

// countingConn counts the bytes that cross an upstream connection.
type countingConn struct {
	net.Conn
	out, in *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.Add(int64(n))
	return n, err
}

// guestBody is a request body read from the guest. It sends the guest 100 Continue before the
// first read when the guest asked for it, and keeps the first read or write error, so that a
// failure on the guest's side can be told from one on the upstream's.
type guestBody struct {
	rc           io.ReadCloser
	gw           *bufio.Writer // the guest's writer, for 100 Continue
	up           *bufio.Writer // the upstream's writer, flushed before each read
	sendContinue bool
	err          error // the first error reading from or writing to the guest
}

func (b *guestBody) Read(p []byte) (int, error) {
	if b.sendContinue {
		b.sendContinue = false
		if _, err := b.gw.WriteString("HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			b.err = err
			return 0, err
		}
		if err := b.gw.Flush(); err != nil {
			b.err = err
			return 0, err
		}
	}
	if b.up != nil && b.up.Buffered() > 0 {
		if err := b.up.Flush(); err != nil {
			return 0, err
		}
	}
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}

func (b *guestBody) Close() error { return b.rc.Close() }

// guestError marks a failure on the guest's side of a request, which gets no error response.
type guestError struct{ err error }

func (e guestError) Error() string { return e.err.Error() }
func (e guestError) Unwrap() error { return e.err }

// flushingBody is a response body that flushes what was written to the guest before each read, so
// that a streamed response (server-sent events, say) reaches the guest as it arrives.
type flushingBody struct {
	rc io.ReadCloser
	w  *bufio.Writer
}

func (b *flushingBody) Read(p []byte) (int, error) {
	if b.w.Buffered() > 0 {
		if err := b.w.Flush(); err != nil {
			return 0, err
		}
	}
	return b.rc.Read(p)
}

func (b *flushingBody) Close() error { return b.rc.Close() }

// byteWriter passes on Write and WriteByte only: see send.
type byteWriter struct{ bw *bufio.Writer }

func (w byteWriter) Write(p []byte) (int, error) { return w.bw.Write(p) }
func (w byteWriter) WriteByte(c byte) error      { return w.bw.WriteByte(c) }

// writerOnly hides every method but Write, so that io.Copy into it never uses a bufio.Writer's
// ReadFrom (whose buffer flushingBody flushes while it reads).
type writerOnly struct{ w io.Writer }

func (w writerOnly) Write(p []byte) (int, error) { return w.w.Write(p) }
