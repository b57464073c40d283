package envd

// The Connect protocol (connectrpc.com/docs/protocol) with JSON payloads,
// the part of it that E2B's SDKs speak: unary calls (a JSON body each way)
// and server streams (5-byte envelopes each way, the last one of the
// response flagged end-of-stream and carrying the error, if any), and
// the one client stream of envd, Process.StreamInput (any number of
// request envelopes, answered like a server stream with one message).

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// MaxMessage bounds one request message, after decompression.
const MaxMessage = 4 << 20

// Envelope flags.
const (
	flagCompressed = 0x01
	flagEndStream  = 0x02
)

// Connect error codes.
const (
	codeCanceled           = "canceled"
	codeUnknown            = "unknown"
	codeInvalidArgument    = "invalid_argument"
	codeDeadlineExceeded   = "deadline_exceeded"
	codeNotFound           = "not_found"
	codeAlreadyExists      = "already_exists"
	codePermissionDenied   = "permission_denied"
	codeResourceExhausted  = "resource_exhausted"
	codeFailedPrecondition = "failed_precondition"
	codeUnimplemented      = "unimplemented"
	codeInternal           = "internal"
	codeUnavailable        = "unavailable"
	codeUnauthenticated    = "unauthenticated"
)

// httpStatus is the HTTP status of a unary error with each code, as the
// Connect protocol maps them (so a class's status here follows its Connect
// code, not the native API's status).
var httpStatus = map[string]int{
	codeCanceled:           499,
	codeUnknown:            http.StatusInternalServerError,
	codeInvalidArgument:    http.StatusBadRequest,
	codeDeadlineExceeded:   http.StatusGatewayTimeout,
	codeNotFound:           http.StatusNotFound,
	codeAlreadyExists:      http.StatusConflict,
	codePermissionDenied:   http.StatusForbidden,
	codeResourceExhausted:  http.StatusTooManyRequests,
	codeFailedPrecondition: http.StatusBadRequest,
	codeUnimplemented:      http.StatusNotImplemented,
	codeInternal:           http.StatusInternalServerError,
	codeUnavailable:        http.StatusServiceUnavailable,
	codeUnauthenticated:    http.StatusUnauthorized,
}

// rpcError is a Connect error: its code and a message for the caller.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func errorf(code, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// toRPCError maps an error from the service (an errdefs class, whose
// Connect code is errdefs' table's) or from this package to a Connect error.
func toRPCError(err error) *rpcError {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	class := errdefs.ClassOf(err)
	code := class.ConnectCode
	if class.Err == nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			code = codeDeadlineExceeded
		case errors.Is(err, context.Canceled):
			code = codeCanceled
		}
	}
	return &rpcError{Code: code, Message: errdefs.Message(err)}
}

// writeUnaryError answers a unary call (or a call refused before its
// stream began) with err.
func writeUnaryError(w http.ResponseWriter, err error) {
	re := toRPCError(err)
	status, ok := httpStatus[re.Code]
	if !ok {
		status = http.StatusInternalServerError
	}
	b, _ := json.Marshal(re)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// writeUnary answers a unary call with the message v.
func writeUnary(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeUnaryError(w, errorf(codeInternal, "encode response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// readEnvelope reads one envelope: its flags and its payload, at most max
// bytes. A stream that ends before the first byte gives io.EOF; one that
// ends inside the envelope, or a length over max, gives an *rpcError.
func readEnvelope(r io.Reader, max int) (byte, []byte, error) {
	var hdr [5]byte
	n, err := io.ReadFull(r, hdr[:])
	switch {
	case err == io.EOF:
		return 0, nil, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return 0, nil, errorf(codeInvalidArgument, "the request ends inside an envelope prefix (%d of 5 bytes)", n)
	case err != nil:
		return 0, nil, readError(err)
	}
	size := binary.BigEndian.Uint32(hdr[1:])
	if uint64(size) > uint64(max) {
		return 0, nil, errorf(codeResourceExhausted, "the message is %d bytes, over the limit of %d", size, max)
	}
	payload := make([]byte, size)
	if n, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, errorf(codeInvalidArgument, "the request ends inside a message: %d of its %d bytes arrived", n, size)
		}
		return 0, nil, readError(err)
	}
	return hdr[0], payload, nil
}

// appendEnvelope appends an envelope holding payload to b.
func appendEnvelope(b []byte, flags byte, payload []byte) []byte {
	b = append(b, flags, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[len(b)-4:], uint32(len(payload)))
	return append(b, payload...)
}

// readError classifies a failure to read the request body.
func readError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errorf(codeResourceExhausted, "the request is over %d bytes", mbe.Limit)
	}
	return errorf(codeCanceled, "read the request: %v", err)
}

// decompress returns the gzip-decompressed payload, at most max bytes.
func decompress(payload []byte, max int) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(payload))
	if err != nil {
		return nil, errorf(codeInvalidArgument, "the message is not valid gzip: %v", err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, int64(max)+1))
	if err != nil {
		return nil, errorf(codeInvalidArgument, "the message is not valid gzip: %v", err)
	}
	if len(out) > max {
		return nil, errorf(codeResourceExhausted, "the decompressed message is over the limit of %d bytes", max)
	}
	return out, nil
}

// checkEncoding accepts the encodings this server reads: identity and
// gzip. The protocol answers others with unimplemented.
func checkEncoding(enc string) (gz bool, err error) {
	switch strings.ToLower(strings.TrimSpace(enc)) {
	case "", "identity":
		return false, nil
	case "gzip":
		return true, nil
	}
	return false, errorf(codeUnimplemented, "the encoding %q is not supported: use identity or gzip", truncate(enc, 40))
}

// call is a Connect request checked at the protocol level.
type call struct {
	stream  bool          // a server stream, not a unary call
	timeout time.Duration // from Connect-Timeout-Ms; 0 without one
	msg     []byte        // the request message, JSON
}

// Content types.
const (
	typeJSON        = "application/json"
	typeConnectJSON = "application/connect+json"
)

// errWrongType marks a request whose content type this RPC does not read;
// it is answered with HTTP 415, outside the Connect error model.
type errWrongType struct{ got, want string }

func (e *errWrongType) Error() string {
	return fmt.Sprintf("content type %q is not served here: send %s", e.got, e.want)
}

// readHeaders checks the request's headers against the protocol: its
// content type (streaming or not), protocol version and timeout.
func readHeaders(r *http.Request, stream bool) (call, error) {
	c := call{stream: stream}
	want := typeJSON
	if stream {
		want = typeConnectJSON
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != want || params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8") {
		return c, &errWrongType{got: truncate(r.Header.Get("Content-Type"), 80), want: want}
	}
	if v := r.Header.Get("Connect-Protocol-Version"); v != "" && v != "1" {
		return c, errorf(codeInvalidArgument, "Connect-Protocol-Version %q is not supported: send 1", truncate(v, 20))
	}
	if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
		// 0 is no timeout, as envd reads it for a process's lifetime.
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || len(v) > 10 {
			return c, errorf(codeInvalidArgument, "Connect-Timeout-Ms %q is not a number of milliseconds of at most 10 digits", truncate(v, 20))
		}
		c.timeout = time.Duration(ms) * time.Millisecond
	}
	return c, nil
}

// readCall checks the request's method, headers and body against the
// protocol and returns its message. stream tells whether the RPC is a
// server stream.
func readCall(w http.ResponseWriter, r *http.Request, stream bool) (call, error) {
	c, err := readHeaders(r, stream)
	if err != nil {
		return c, err
	}
	body := http.MaxBytesReader(w, r.Body, MaxMessage+16)
	if !stream {
		gz, err := checkEncoding(r.Header.Get("Content-Encoding"))
		if err != nil {
			return c, err
		}
		b, err := io.ReadAll(body)
		if err != nil {
			return c, readError(err)
		}
		if len(b) > MaxMessage {
			return c, errorf(codeResourceExhausted, "the message is %d bytes, over the limit of %d", len(b), MaxMessage)
		}
		if gz {
			if b, err = decompress(b, MaxMessage); err != nil {
				return c, err
			}
		}
		c.msg = b
		return c, nil
	}
	gz, err := checkEncoding(r.Header.Get("Connect-Content-Encoding"))
	if err != nil {
		return c, err
	}
	payload, err := readMessage(body, gz)
	if err == io.EOF {
		return c, errorf(codeInvalidArgument, "the request has no message: send one envelope")
	}
	if err != nil {
		return c, err
	}
	var extra [1]byte
	if n, _ := io.ReadFull(body, extra[:]); n > 0 {
		return c, errorf(codeInvalidArgument, "the request has more than one message: a server stream takes one")
	}
	c.msg = payload
	return c, nil
}

// readMessage reads one enveloped request message, decompressed when it
// is flagged so (gz: the stream's Connect-Content-Encoding is gzip). A
// stream that ends between messages gives io.EOF.
func readMessage(body io.Reader, gz bool) ([]byte, error) {
	flags, payload, err := readEnvelope(body, MaxMessage)
	if err != nil {
		return nil, err
	}
	switch {
	case flags&^flagCompressed != 0:
		return nil, errorf(codeInvalidArgument, "the request envelope has flags %#02x: only 0x01 (compressed) is allowed", flags)
	case flags&flagCompressed != 0 && !gz:
		return nil, errorf(codeInvalidArgument, "the message is flagged compressed but Connect-Content-Encoding is identity")
	case flags&flagCompressed != 0:
		return decompress(payload, MaxMessage)
	}
	return payload, nil
}

// streamWriter writes a server stream's response: envelopes, each
// flushed, and the end-of-stream envelope. The first write error is kept
// and ends every later write.
type streamWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error
}

func newStreamWriter(w http.ResponseWriter) *streamWriter {
	return &streamWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *streamWriter) start() {
	if s.started {
		return
	}
	s.started = true
	// A stream lasts as long as its process: no write deadline applies.
	s.rc.SetWriteDeadline(time.Time{})
	s.w.Header().Set("Content-Type", typeConnectJSON)
	s.w.WriteHeader(http.StatusOK)
}

func (s *streamWriter) write(flags byte, payload []byte) error {
	if s.err != nil {
		return s.err
	}
	s.start()
	if _, err := s.w.Write(appendEnvelope(nil, flags, payload)); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.err = err
	}
	return s.err
}

// send writes one message.
func (s *streamWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	return s.write(0, b)
}

// end writes the end-of-stream envelope: {} when err is nil, else the
// error.
func (s *streamWriter) end(err error) {
	payload := []byte("{}")
	if err != nil {
		payload, _ = json.Marshal(struct {
			Error *rpcError `json:"error"`
		}{toRPCError(err)})
	}
	s.write(flagEndStream, payload)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
