package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// MsgType says what a message on a stream carries.
//
// A stream starts with MsgRequest from the host. Then, by operation:
//   - exec: guest sends MsgStarted (or MsgResult with an error), then
//     MsgStdout and MsgStderr as output arrives, then MsgExit. The host may
//     send MsgStdin and one MsgEOF meanwhile.
//   - read, tar_out: guest sends MsgResult (with a Stat for read), then
//     MsgData chunks, then MsgEOF, or a MsgResult carrying an error
//     instead of MsgEOF when the transfer fails midway.
//   - write, tar_in: host sends MsgData chunks and MsgEOF; guest answers with
//     one MsgResult.
//   - everything else: guest answers with one MsgResult.
type MsgType byte

// Message types.
const (
	MsgRequest MsgType = 1 + iota
	MsgResult
	MsgData
	MsgEOF
	MsgStdin
	MsgStdout
	MsgStderr
	MsgStarted
	MsgExit
)

// MaxMessage bounds one message's payload.
const MaxMessage = 1 << 20

// WriteMsg writes one message. Callers that share a stream between
// goroutines serialise calls themselves.
func WriteMsg(w io.Writer, t MsgType, payload []byte) error {
	if len(payload) > MaxMessage {
		return fmt.Errorf("message of %d bytes exceeds the limit of %d", len(payload), MaxMessage)
	}
	var hdr [5]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One write, so that a message is never interleaved on the wire.
	buf := make([]byte, 0, len(hdr)+len(payload))
	buf = append(append(buf, hdr[:]...), payload...)
	_, err := w.Write(buf)
	return err
}

// WriteJSON writes one message whose payload is v as JSON.
func WriteJSON(w io.Writer, t MsgType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %T: %w", v, err)
	}
	return WriteMsg(w, t, b)
}

// ReadMsg reads one message. buf is reused for the payload when it is large
// enough; the payload is valid until buf is reused.
func ReadMsg(r io.Reader, buf []byte) (MsgType, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxMessage {
		return 0, nil, fmt.Errorf("message of %d bytes exceeds the limit of %d", n, MaxMessage)
	}
	if int(n) > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, fmt.Errorf("read message body: %w", noEOF(err))
	}
	return MsgType(hdr[0]), buf, nil
}

// ReadJSON reads one message, checks its type and decodes it into v.
func ReadJSON(r io.Reader, want MsgType, v any) error {
	t, b, err := ReadMsg(r, nil)
	if err != nil {
		return err
	}
	if t != want {
		return fmt.Errorf("got message type %d, want %d", t, want)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %T: %w", v, err)
	}
	return nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ChunkSize is the size of the data chunks that file transfers and output
// streams send.
const ChunkSize = 32<<10 - 5

// DataWriter turns writes into messages of one type, at most ChunkSize each.
type DataWriter struct {
	W    io.Writer
	Type MsgType
}

// Write sends p as one or more messages.
func (d DataWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := p
		if len(c) > ChunkSize {
			c = c[:ChunkSize]
		}
		if err := WriteMsg(d.W, d.Type, c); err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}
