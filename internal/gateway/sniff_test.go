package gateway

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// clientHello returns the first TLS record crypto/tls sends as a client
// with server name sni (none when "").
func clientHello(t *testing.T, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		defer a.Close()
		tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
	}()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(hdr[3:])))
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// splitRecords re-frames one TLS handshake record as several records of
// at most size bytes of handshake data each.
func splitRecords(rec []byte, size int) []byte {
	var out []byte
	body := rec[5:]
	for len(body) > 0 {
		k := min(size, len(body))
		out = append(out, rec[0], rec[1], rec[2], byte(k>>8), byte(k))
		out = append(out, body[:k]...)
		body = body[k:]
	}
	return out
}

func TestSniff(t *testing.T) {
	hello := clientHello(t, "Example.COM")
	// crypto/tls offers X25519MLKEM768 by default: a key share of over a
	// kilobyte, which parsers that read one small buffer miss.
	if len(hello) < 1200 {
		t.Fatalf("ClientHello of %d bytes: not a post-quantum one", len(hello))
	}
	tests := []struct {
		name              string
		data              []byte
		chunk             int  // write in chunks of this many bytes (TCP segments); 0: at once
		close             bool // the guest closes after writing
		want              string
		tls, http, opaque bool
	}{
		{"ClientHello", hello, 0, false, "example.com", true, false, false},
		{"ClientHello in small segments", hello, 7, false, "example.com", true, false, false},
		{"ClientHello over many records", splitRecords(hello, 100), 0, false, "example.com", true, false, false},
		{"ClientHello over many records and segments", splitRecords(hello, 33), 10, false, "example.com", true, false, false},
		{"ClientHello without SNI", clientHello(t, ""), 0, false, "", true, false, false},
		{"truncated ClientHello", hello[:len(hello)/2], 0, true, "", false, false, true},
		{"HTTP Host", []byte("GET /x HTTP/1.1\r\nHost: Web.Test.:8080\r\nUser-Agent: t\r\n\r\nbody"), 0, false, "web.test", false, true, false},
		{"HTTP in segments", []byte("POST / HTTP/1.1\r\nHost: web.test\r\nContent-Length: 4\r\n\r\nbody"), 3, false, "web.test", false, true, false},
		{"HTTP absolute target agreeing", []byte("GET http://web.test/ HTTP/1.1\r\nHost: web.test\r\n\r\n"), 0, false, "web.test", false, true, false},
		{"HTTP absolute target disagreeing", []byte("GET http://web.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"), 0, false, "", false, true, true},
		{"HTTP two Host headers", []byte("GET / HTTP/1.1\r\nHost: web.test\r\nHost: evil.test\r\n\r\n"), 0, false, "", false, false, true},
		{"HTTP/1.0 without Host", []byte("GET / HTTP/1.0\r\n\r\n"), 0, false, "", false, true, false},
		{"HTTP to an IP address", []byte("GET / HTTP/1.1\r\nHost: 203.0.113.5\r\n\r\n"), 0, false, "", false, true, false},
		{"HTTP head over the limit", []byte("GET / HTTP/1.1\r\nHost: web.test\r\nX: " + strings.Repeat("a", sniffLimit) + "\r\n\r\n"), 0, false, "", false, false, true},
		{"client-first protocol", []byte("SSH-2.0-OpenSSH_9.2\r\n"), 0, true, "", false, false, false},
		{"client-first protocol with a space", []byte("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"), 0, true, "", false, false, false},
		{"HTTP behind empty lines", []byte("\r\n\nGET / HTTP/1.1\r\nHost: Web.test\r\n\r\n"), 0, false, "web.test", false, true, false},
		{"HTTP with a lower-case method", []byte("get / HTTP/1.1\r\nHost: web.test\r\n\r\n"), 0, false, "web.test", false, true, false},
		{"slow request line", []byte("GET / HT"), 0, false, "", false, false, true},
		{"slow request line behind an empty line", []byte("\r\nGET /"), 0, false, "", false, false, true},
		{"request head cut short", []byte("GET / HTTP/1.1\r\nHost: web"), 0, true, "", false, false, true},
		{"binary", []byte{0, 1, 2, 3}, 0, true, "", false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			guest, gw := net.Pipe()
			defer gw.Close()
			go func() {
				data := tt.data
				for len(data) > 0 {
					k := len(data)
					if tt.chunk > 0 {
						k = min(k, tt.chunk)
					}
					if _, err := guest.Write(data[:k]); err != nil {
						return
					}
					data = data[k:]
				}
				if tt.close {
					guest.Close()
				}
			}()
			defer guest.Close()
			s := sniff(gw, sniffLimit, time.Second)
			if s.name != tt.want || s.tls != tt.tls || s.http != tt.http || s.opaque != tt.opaque {
				t.Errorf("name %q tls %v http %v opaque %v, want %q %v %v %v", s.name, s.tls, s.http, s.opaque, tt.want, tt.tls, tt.http, tt.opaque)
			}
			if !bytes.HasPrefix(tt.data, s.peeked) {
				t.Fatalf("peeked %d bytes that are not what the guest sent", len(s.peeked))
			}
			// The flow replays whole: the peeked bytes, then the rest.
			got := make([]byte, len(tt.data))
			r := replay(gw, s.peeked)
			r.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, tt.data) {
				t.Errorf("replayed %d bytes, %v", len(got), err)
			}
		})
	}
}

// Nothing the sniffers do reaches the guest: a failed TLS handshake sends
// no alert.
func TestSniffWritesNothing(t *testing.T) {
	guest, gw := net.Pipe()
	defer gw.Close()
	defer guest.Close()
	go guest.Write(splitRecords(clientHello(t, "example.com"), 64))
	if s := sniff(gw, sniffLimit, time.Second); s.name != "example.com" {
		t.Fatalf("name %q", s.name)
	}
	guest.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if k, err := guest.Read(make([]byte, 1)); err == nil {
		t.Errorf("the guest read %d bytes from the sniffer", k)
	}
}
