package envd

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func envelope(flags byte, payload string) []byte {
	return appendEnvelope(nil, flags, []byte(payload))
}

func TestReadEnvelope(t *testing.T) {
	over := make([]byte, 5)
	binary.BigEndian.PutUint32(over[1:], 1025)
	huge := []byte{0, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name     string
		in       []byte
		flags    byte
		payload  string
		wantEOF  bool
		wantCode string
	}{
		{name: "message", in: envelope(0, `{"a":1}`), payload: `{"a":1}`},
		{name: "empty payload", in: envelope(0, ""), payload: ""},
		{name: "flags kept", in: envelope(flagEndStream, "{}"), flags: flagEndStream, payload: "{}"},
		{name: "nothing", in: nil, wantEOF: true},
		{name: "short prefix", in: []byte{0, 0, 0}, wantCode: codeInvalidArgument},
		{name: "short payload", in: envelope(0, "{}")[:6], wantCode: codeInvalidArgument},
		{name: "prefix without payload", in: envelope(0, "{}")[:5], wantCode: codeInvalidArgument},
		{name: "over the limit", in: over, wantCode: codeResourceExhausted},
		{name: "4 GiB length", in: huge, wantCode: codeResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags, payload, err := readEnvelope(bytes.NewReader(tt.in), 1024)
			switch {
			case tt.wantEOF:
				if err != io.EOF {
					t.Fatalf("err %v, want io.EOF", err)
				}
			case tt.wantCode != "":
				var re *rpcError
				if !errors.As(err, &re) || re.Code != tt.wantCode {
					t.Fatalf("err %v, want code %s", err, tt.wantCode)
				}
			default:
				if err != nil || flags != tt.flags || string(payload) != tt.payload {
					t.Fatalf("got %#x %q %v, want %#x %q", flags, payload, err, tt.flags, tt.payload)
				}
			}
		})
	}
}

func TestEnvelopesInSequence(t *testing.T) {
	var b []byte
	b = appendEnvelope(b, 0, []byte(`{"x":1}`))
	b = appendEnvelope(b, flagEndStream, []byte(`{}`))
	r := bytes.NewReader(b)
	for _, want := range []string{`{"x":1}`, `{}`} {
		_, p, err := readEnvelope(r, 100)
		if err != nil || string(p) != want {
			t.Fatalf("got %q %v, want %q", p, err, want)
		}
	}
	if _, _, err := readEnvelope(r, 100); err != io.EOF {
		t.Fatalf("after the last envelope: %v", err)
	}
}

// FuzzReadEnvelope checks that no input panics the reader, that it never
// returns more than the limit, and that what it returns is what was sent.
func FuzzReadEnvelope(f *testing.F) {
	f.Add(envelope(0, `{"process":{"cmd":"ls"}}`))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 'x'})
	f.Add(envelope(2, "{}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		const max = 64
		flags, payload, err := readEnvelope(bytes.NewReader(in), max)
		if err != nil {
			if err != io.EOF && !errors.As(err, new(*rpcError)) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if len(payload) > max {
			t.Fatalf("payload of %d bytes past the limit %d", len(payload), max)
		}
		if len(in) < 5+len(payload) || in[0] != flags || !bytes.Equal(in[5:5+len(payload)], payload) ||
			binary.BigEndian.Uint32(in[1:5]) != uint32(len(payload)) {
			t.Fatalf("read %#x %q from % x", flags, payload, in)
		}
	})
}

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.Bytes()
}

func TestReadCall(t *testing.T) {
	stream := func(body []byte, h ...string) *http.Request {
		r := httptest.NewRequest("POST", "/process.Process/Start", bytes.NewReader(body))
		r.Header.Set("Content-Type", typeConnectJSON)
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Set(h[i], h[i+1])
		}
		return r
	}
	unary := func(body []byte, h ...string) *http.Request {
		return stream(body, append([]string{"Content-Type", typeJSON}, h...)...)
	}
	tests := []struct {
		name     string
		r        *http.Request
		stream   bool
		want     string // the message read
		timeout  time.Duration
		wantCode string
		wrong    bool // HTTP 415
	}{
		{name: "stream", r: stream(envelope(0, `{}`)), stream: true, want: `{}`},
		{name: "stream, identity as Python sends it", r: stream(envelope(0, "{\n  \"a\": 1\n}"), "Connect-Content-Encoding", "identity",
			"Connect-Protocol-Version", "1", "Connect-Timeout-Ms", "60000"), stream: true, want: "{\n  \"a\": 1\n}", timeout: time.Minute},
		{name: "stream, gzip message", r: stream(appendEnvelope(nil, flagCompressed, gzipped(t, `{"b":2}`)), "Connect-Content-Encoding", "gzip"),
			stream: true, want: `{"b":2}`},
		{name: "stream, compressed without encoding", r: stream(appendEnvelope(nil, flagCompressed, gzipped(t, `{}`))), stream: true, wantCode: codeInvalidArgument},
		{name: "stream, bad gzip", r: stream(appendEnvelope(nil, flagCompressed, []byte("nope")), "Connect-Content-Encoding", "gzip"), stream: true, wantCode: codeInvalidArgument},
		{name: "stream, end-stream flag", r: stream(envelope(flagEndStream, `{}`)), stream: true, wantCode: codeInvalidArgument},
		{name: "stream, unknown flag", r: stream(envelope(0x80, `{}`)), stream: true, wantCode: codeInvalidArgument},
		{name: "stream, two messages", r: stream(append(envelope(0, `{}`), envelope(0, `{}`)...)), stream: true, wantCode: codeInvalidArgument},
		{name: "stream, no message", r: stream(nil), stream: true, wantCode: codeInvalidArgument},
		{name: "stream, bad length prefix", r: stream([]byte{0, 0x7f, 0, 0, 0, '{'}), stream: true, wantCode: codeResourceExhausted},
		{name: "stream, brotli", r: stream(envelope(0, `{}`), "Connect-Content-Encoding", "br"), stream: true, wantCode: codeUnimplemented},
		{name: "stream sent as unary", r: unary([]byte(`{}`)), stream: true, wrong: true},
		{name: "unary", r: unary([]byte(`{"path":"/"}`)), want: `{"path":"/"}`},
		{name: "unary with charset", r: unary([]byte(`{}`), "Content-Type", "application/json; charset=utf-8"), want: `{}`},
		{name: "unary gzip", r: unary(gzipped(t, `{"c":3}`), "Content-Encoding", "gzip"), want: `{"c":3}`},
		{name: "unary too big", r: unary(bytes.Repeat([]byte(" "), MaxMessage+100)), wantCode: codeResourceExhausted},
		{name: "unary gzip bomb", r: unary(gzipped(t, strings.Repeat(" ", MaxMessage+1)), "Content-Encoding", "gzip"), wantCode: codeResourceExhausted},
		{name: "unary as proto", r: unary([]byte(`{}`), "Content-Type", "application/proto"), wrong: true},
		{name: "unary sent as stream", r: stream(envelope(0, `{}`)), wrong: true},
		{name: "bad timeout", r: unary([]byte(`{}`), "Connect-Timeout-Ms", "soon"), wantCode: codeInvalidArgument},
		{name: "zero timeout is none", r: unary([]byte(`{}`), "Connect-Timeout-Ms", "0"), want: `{}`},
		{name: "negative timeout", r: unary([]byte(`{}`), "Connect-Timeout-Ms", "-1"), wantCode: codeInvalidArgument},
		{name: "11-digit timeout", r: unary([]byte(`{}`), "Connect-Timeout-Ms", "12345678901"), wantCode: codeInvalidArgument},
		{name: "protocol version 2", r: unary([]byte(`{}`), "Connect-Protocol-Version", "2"), wantCode: codeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := readCall(httptest.NewRecorder(), tt.r, tt.stream)
			var wt *errWrongType
			var re *rpcError
			switch {
			case tt.wrong:
				if !errors.As(err, &wt) {
					t.Fatalf("err %v, want a content type refusal", err)
				}
			case tt.wantCode != "":
				if !errors.As(err, &re) || re.Code != tt.wantCode {
					t.Fatalf("err %v, want code %s", err, tt.wantCode)
				}
			default:
				if err != nil || string(c.msg) != tt.want || c.timeout != tt.timeout {
					t.Fatalf("got %q timeout %v err %v, want %q timeout %v", c.msg, c.timeout, err, tt.want, tt.timeout)
				}
			}
		})
	}
}

func TestStreamWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	out := newStreamWriter(rec)
	if err := out.send(eventResponse{Event: processEvent{Start: &startEvent{PID: 42}}}); err != nil {
		t.Fatal(err)
	}
	out.end(errorf(codeNotFound, "gone"))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != typeConnectJSON {
		t.Fatalf("status %d, type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	r := bytes.NewReader(rec.Body.Bytes())
	for _, want := range []struct {
		flags   byte
		payload string
	}{{0, `{"event":{"start":{"pid":42}}}`}, {flagEndStream, `{"error":{"code":"not_found","message":"gone"}}`}} {
		flags, p, err := readEnvelope(r, MaxMessage)
		if err != nil || flags != want.flags || string(p) != want.payload {
			t.Fatalf("got %#x %s %v, want %#x %s", flags, p, err, want.flags, want.payload)
		}
	}
}

func TestUnaryErrorStatus(t *testing.T) {
	for code, status := range map[string]int{codeNotFound: 404, codeInvalidArgument: 400, codeUnauthenticated: 401,
		codeAlreadyExists: 409, codeUnimplemented: 501, codeResourceExhausted: 429, codeDeadlineExceeded: 504} {
		rec := httptest.NewRecorder()
		writeUnaryError(rec, errorf(code, "m"))
		if rec.Code != status || rec.Body.String() != `{"code":"`+code+`","message":"m"}` {
			t.Errorf("%s: %d %s, want %d", code, rec.Code, rec.Body, status)
		}
	}
}

// TestUnaryErrorOfClass pins what a unary call answers for an error of each
// class from the service, and for a context's end: the class's name is cut
// from the message, other text is kept.
func TestUnaryErrorOfClass(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   string
		status int
		msg    string
	}{
		{"invalid", errdefs.ErrInvalid, codeInvalidArgument, 400, "start process"},
		{"not found", errdefs.ErrNotFound, codeNotFound, 404, "start process"},
		{"conflict", errdefs.ErrConflict, codeFailedPrecondition, 400, "start process"},
		{"exhausted", errdefs.ErrExhausted, codeResourceExhausted, 429, "start process"},
		{"precondition", errdefs.ErrPrecondition, codeFailedPrecondition, 400, "start process"},
		{"unavailable", errdefs.ErrUnavailable, codeUnavailable, 503, "start process"},
		{"unauthenticated", errdefs.ErrUnauthenticated, codeUnauthenticated, 401, "start process"},
		{"permission", errdefs.ErrPermission, codePermissionDenied, 403, "start process"},
		{"too large", errdefs.ErrTooLarge, codeResourceExhausted, 429, "start process"},
		{"deadline", context.DeadlineExceeded, codeDeadlineExceeded, 504, "start process: context deadline exceeded"},
		{"canceled", context.Canceled, codeCanceled, 499, "start process: context canceled"},
		{"no class", errors.New("boom"), codeInternal, 500, "start process: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeUnaryError(rec, fmt.Errorf("start process: %w", tc.err))
			want := `{"code":"` + tc.code + `","message":"` + tc.msg + `"}`
			if rec.Code != tc.status || rec.Body.String() != want {
				t.Errorf("%d %s, want %d %s", rec.Code, rec.Body, tc.status, want)
			}
		})
	}
}
