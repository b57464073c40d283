package gateway

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"time"
)

// What the gateway reads of a flow before it decides, when the policy needs
// the name.
const (
	sniffLimit   = 16 << 10 // bytes
	sniffTimeout = time.Second
)

// errSniffed ends the TLS handshake once the ClientHello has been read.
var errSniffed = errors.New("client hello read")

// sniffed is what the first bytes of a flow said.
type sniffed struct {
	peeked []byte // every byte read from the guest, to be replayed
	name   string // the SNI or Host, lower case, no port, no trailing dot; "" if none
	tls    bool   // the flow starts with a TLS ClientHello that was read whole
	http   bool   // the flow starts with an HTTP/1.x request head that was read whole
	// opaque: the flow claims to be TLS or HTTP/1.x, but its name cannot be
	// trusted: a ClientHello that does not parse (crypto/tls refuses, among
	// others, a server name with a trailing dot) or is cut short, a request
	// head that does not parse (two Host headers) or names two hosts. The
	// server at the other end may well see a name in it, so such a flow
	// gets no benefit of the names the gateway knows for its address.
	opaque bool
}

// sniff reads the first bytes the guest sends on c, up to limit bytes and
// for at most timeout, and finds the name they carry: the server name of a
// TLS ClientHello, or the Host of an HTTP/1.x request. Nothing is written
// to c. The bytes read are returned to be replayed, whatever was found.
func sniff(c net.Conn, limit int, timeout time.Duration) sniffed {
	rec := &recorder{Conn: c, limit: limit}
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	// Servers skip empty lines before a request line (RFC 9112 2.2), so
	// the sniffer does too: a request behind them is judged all the same.
	var first [1]byte
	skip := 0
	for {
		if _, err := io.ReadFull(rec, first[:]); err != nil {
			return sniffed{peeked: rec.buf}
		}
		if first[0] != '\r' && first[0] != '\n' || skip == maxEmptyLines {
			break
		}
		skip++
	}
	rec.rewind()
	var s sniffed
	switch {
	case first[0] == 0x16 && skip == 0: // a TLS handshake record
		s.name, s.tls = clientHelloName(rec)
		s.opaque = !s.tls
	case isLetter(first[0]): // an HTTP method, perhaps
		s.name, s.http, s.opaque = requestHost(rec, skip)
	}
	s.peeked = rec.buf
	return s
}

// maxEmptyLines bounds the CR and LF bytes skipped before a request line.
const maxEmptyLines = 16

func isLetter(c byte) bool { return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' }

// clientHelloName has crypto/tls read a ClientHello from r (which may span
// TCP segments and TLS records) and returns its server name.
func clientHelloName(r *recorder) (name string, ok bool) {
	cfg := &tls.Config{
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			name, ok = hello.ServerName, true
			return nil, errSniffed
		},
	}
	tls.Server(r, cfg).Handshake()
	return normalizeName(name), ok
}

// requestHost parses an HTTP/1.x request head from r, after skip bytes of
// empty lines, and returns its host. ok is false when the head does not
// parse; opaque is true when it names two hosts (its target another than
// its Host header), or does not parse although its first line is an
// HTTP/1.x request line, or is cut short (by the time or size limit) in a
// first line that starts as one does: a method and a space.
func requestHost(r *recorder, skip int) (name string, ok, opaque bool) {
	br := bufio.NewReader(r)
	br.Discard(skip)
	req, err := http.ReadRequest(br)
	if err != nil {
		line, _, complete := bytes.Cut(r.buf[skip:], []byte("\n"))
		if !complete {
			method, _, spaced := bytes.Cut(line, []byte(" "))
			return "", false, spaced && len(method) > 0 && bytes.IndexFunc(method, func(c rune) bool { return c > 0x7f || !isLetter(byte(c)) }) < 0
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		return "", false, bytes.HasSuffix(line, []byte(" HTTP/1.1")) || bytes.HasSuffix(line, []byte(" HTTP/1.0"))
	}
	host := req.Host // the absolute target's host if there is one, else the Host header
	if req.URL.Host != "" {
		// ReadRequest drops the Host header; read it again from the head.
		tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(r.buf[skip:])))
		tp.ReadLine()
		hdr, _ := tp.ReadMIMEHeader()
		if h := hdr.Get("Host"); h != "" && !strings.EqualFold(h, req.URL.Host) {
			return "", true, true
		}
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return normalizeName(host), true, false
}

// normalizeName lower-cases a name and drops its trailing dots. An IP
// address is no name: "".
func normalizeName(s string) string {
	s = strings.TrimRight(strings.ToLower(s), ".")
	if _, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return ""
	}
	return s
}

// recorder is the read side of a guest connection as the sniffers see it:
// it keeps every byte read so that the flow can be replayed, can hand the
// same bytes out again (rewind), stops at a limit, and swallows writes and
// closes so that a sniffer never touches the guest.
type recorder struct {
	net.Conn
	limit int
	buf   []byte // every byte read from Conn
	pos   int    // how much of buf the current reader has had
}

var errSniffLimit = errors.New("sniff limit reached")

func (r *recorder) Read(p []byte) (int, error) {
	if r.pos < len(r.buf) {
		n := copy(p, r.buf[r.pos:])
		r.pos += n
		return n, nil
	}
	room := r.limit - len(r.buf)
	if room <= 0 {
		return 0, errSniffLimit
	}
	if len(p) > room {
		p = p[:room]
	}
	n, err := r.Conn.Read(p)
	r.buf = append(r.buf, p[:n]...)
	r.pos = len(r.buf)
	return n, err
}

func (r *recorder) rewind() { r.pos = 0 }

func (r *recorder) Write(p []byte) (int, error)      { return len(p), nil }
func (r *recorder) Close() error                     { return nil }
func (r *recorder) SetDeadline(time.Time) error      { return nil }
func (r *recorder) SetReadDeadline(time.Time) error  { return nil }
func (r *recorder) SetWriteDeadline(time.Time) error { return nil }

// replayConn is a guest connection whose first bytes were read by sniff:
// reads return them first.
type replayConn struct {
	net.Conn
	r io.Reader
}

func replay(c net.Conn, peeked []byte) net.Conn {
	if len(peeked) == 0 {
		return c
	}
	return &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(peeked), c)}
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the underlying connection, as a splice wants.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
