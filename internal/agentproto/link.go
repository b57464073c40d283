// Package agentproto is the protocol between airlock on the host and the
// agent inside a sandbox's VM. Both ends import it; it holds no logic that
// belongs to only one side.
//
// The two ends share one byte stream: a virtio-serial port in the guest, a
// unix socket on the host. On it runs a session:
//
//  1. The host sends a hello (HelloMagic, protocol version, a fresh session
//     ID), repeating it until answered, because the guest may still be booting
//     or may hold stale bytes of an earlier session in its buffers.
//  2. The guest scans for the hello, drops any earlier session, and answers
//     with an ack (AckMagic, its version, the same session ID).
//  3. Both sides then run yamux over the stream. Host-to-guest bytes are
//     wrapped in link frames (a type byte and a length), so the guest always
//     knows where a frame starts and can recognise a new hello between frames
//     without ever mistaking payload bytes for one. Guest-to-host bytes are
//     plain yamux: the host scans for the ack on every new connection.
//
// Every yamux stream carries one request: a Request message, then messages
// of the kinds listed with MsgType.
package agentproto

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// Version is the protocol version. Host and guest must speak the same one.
const Version uint32 = 1

// PortName is the name of the virtio-serial port the agent listens on.
const PortName = "airlock.agent"

var (
	// HelloMagic opens a hello. Its first byte can never start a link frame.
	HelloMagic = [8]byte{0xff, 'A', 'L', 'H', 'E', 'L', 'L', 'O'}
	// AckMagic opens the guest's answer to a hello.
	AckMagic = [8]byte{0xfe, 'A', 'L', 'A', 'C', 'K', 'O', 'K'}
)

// SessionID names one host connection.
type SessionID [16]byte

// NewSessionID returns a random session ID.
func NewSessionID() SessionID {
	var id SessionID
	if _, err := rand.Read(id[:]); err != nil {
		panic(fmt.Sprintf("agentproto: read random: %v", err))
	}
	return id
}

// Hello is the host's greeting, and Ack the guest's answer.
type Hello struct {
	Version uint32
	Session SessionID
}

// Ack status values.
const (
	AckOK              uint32 = 0
	AckVersionMismatch uint32 = 1
)

// Ack answers a Hello.
type Ack struct {
	Version uint32
	Session SessionID
	Status  uint32
}

const (
	helloLen = 8 + 4 + 16 + 4     // magic, version, session, crc
	ackLen   = 8 + 4 + 16 + 4 + 4 // magic, version, session, status, crc

	frameData byte = 0xd7
	// MaxFrame bounds the payload of one host-to-guest link frame.
	MaxFrame = 64 << 10
)

// Marshal encodes the hello.
func (h Hello) Marshal() []byte {
	b := make([]byte, 0, helloLen)
	b = append(b, HelloMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, h.Version)
	b = append(b, h.Session[:]...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// Marshal encodes the ack.
func (a Ack) Marshal() []byte {
	b := make([]byte, 0, ackLen)
	b = append(b, AckMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, a.Version)
	b = append(b, a.Session[:]...)
	b = binary.BigEndian.AppendUint32(b, a.Status)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func parseHello(b []byte) (Hello, bool) {
	if len(b) != helloLen || !bytes.Equal(b[:8], HelloMagic[:]) ||
		binary.BigEndian.Uint32(b[helloLen-4:]) != crc32.ChecksumIEEE(b[:helloLen-4]) {
		return Hello{}, false
	}
	var h Hello
	h.Version = binary.BigEndian.Uint32(b[8:12])
	copy(h.Session[:], b[12:28])
	return h, true
}

func parseAck(b []byte) (Ack, bool) {
	if len(b) != ackLen || !bytes.Equal(b[:8], AckMagic[:]) ||
		binary.BigEndian.Uint32(b[ackLen-4:]) != crc32.ChecksumIEEE(b[:ackLen-4]) {
		return Ack{}, false
	}
	var a Ack
	a.Version = binary.BigEndian.Uint32(b[8:12])
	copy(a.Session[:], b[12:28])
	a.Status = binary.BigEndian.Uint32(b[28:32])
	return a, true
}

// FrameWriter wraps host-to-guest bytes in link frames. It is not safe for
// concurrent use; yamux serialises its writes.
type FrameWriter struct {
	w   io.Writer
	hdr [5]byte
}

// NewFrameWriter returns a FrameWriter writing to w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

// Write sends p as one or more data frames.
func (f *FrameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > MaxFrame {
			chunk = chunk[:MaxFrame]
		}
		f.hdr[0] = frameData
		binary.BigEndian.PutUint32(f.hdr[1:], uint32(len(chunk)))
		if _, err := f.w.Write(f.hdr[:]); err != nil {
			return n, err
		}
		m, err := f.w.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		p = p[len(chunk):]
	}
	return n, nil
}

// Event is what a Demux found next on the host-to-guest stream: either a
// hello or a data payload.
type Event struct {
	Hello *Hello
	Data  []byte
}

// Demux reads the host-to-guest stream on the guest side. It yields data
// payloads of link frames and hellos; any bytes that are neither (the tail
// of a frame from an older session) are skipped while it scans for the next
// hello.
type Demux struct {
	r        *bufio.Reader
	scanning bool
	buf      []byte
}

// NewDemux returns a Demux reading from r. It starts out scanning for a
// hello, as after boot nothing else is meaningful.
func NewDemux(r io.Reader) *Demux {
	return &Demux{r: bufio.NewReaderSize(r, 2*MaxFrame), scanning: true, buf: make([]byte, MaxFrame)}
}

// Resync makes the Demux drop everything until the next hello, for when the
// host is known to have gone away.
func (d *Demux) Resync() { d.scanning = true }

// Next returns the next hello or data payload. A data payload is valid until
// the following call. Errors come from the underlying reader.
func (d *Demux) Next() (Event, error) {
	for {
		if d.scanning {
			h, err := d.scanHello()
			if err != nil {
				return Event{}, err
			}
			d.scanning = false
			return Event{Hello: &h}, nil
		}
		first, err := d.r.Peek(1)
		if err != nil {
			return Event{}, err
		}
		switch first[0] {
		case HelloMagic[0]:
			b, err := d.r.Peek(helloLen)
			if err != nil {
				return Event{}, err
			}
			if h, ok := parseHello(b); ok {
				d.r.Discard(helloLen)
				return Event{Hello: &h}, nil
			}
			d.scanning = true
		case frameData:
			hdr, err := d.r.Peek(5)
			if err != nil {
				return Event{}, err
			}
			n := int(binary.BigEndian.Uint32(hdr[1:]))
			if n == 0 || n > MaxFrame {
				d.scanning = true
				continue
			}
			d.r.Discard(5)
			if _, err := io.ReadFull(d.r, d.buf[:n]); err != nil {
				return Event{}, err
			}
			return Event{Data: d.buf[:n]}, nil
		default:
			d.scanning = true
		}
	}
}

// scanHello drops bytes until a valid hello has been read.
func (d *Demux) scanHello() (Hello, error) {
	for {
		if _, err := d.r.ReadSlice(HelloMagic[0]); err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return Hello{}, err
		} else if err != nil {
			continue
		}
		b, err := d.r.Peek(helloLen - 1)
		if err != nil {
			return Hello{}, err
		}
		full := append([]byte{HelloMagic[0]}, b...)
		if h, ok := parseHello(full); ok {
			d.r.Discard(helloLen - 1)
			return h, nil
		}
	}
}

// ReadAck drops bytes from r until it has read an ack for session, and
// returns it. Acks of other sessions are skipped.
func ReadAck(r *bufio.Reader, session SessionID) (Ack, error) {
	for {
		if _, err := r.ReadSlice(AckMagic[0]); err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			return Ack{}, err
		}
		b, err := r.Peek(ackLen - 1)
		if err != nil {
			return Ack{}, err
		}
		full := append([]byte{AckMagic[0]}, b...)
		if a, ok := parseAck(full); ok {
			r.Discard(ackLen - 1)
			if a.Session == session {
				return a, nil
			}
		}
	}
}

// MuxConfig is the yamux configuration both ends use. Keepalives are off:
// a paused VM answers nothing, and the host learns of a dead VM from QEMU.
func MuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.ConnectionWriteTimeout = 5 * time.Minute
	c.MaxStreamWindowSize = 1 << 20
	c.LogOutput = io.Discard
	return c
}
