package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// dialLink connects to QEMU's netdev socket, retrying while QEMU creates it.
func dialLink(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to netdev socket %s: %w", path, errors.Join(ctx.Err(), err))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errFrame ends the link when QEMU sends a frame no NIC could have sent.
var errFrame = errors.New("netdev frame size out of range")

// qemuLink is the connection to QEMU as the tap switch uses it, made safe
// against two flaws of tap.Switch (gvisor-tap-vsock v0.8.9):
//
//   - It reads frames of a 4-byte big-endian length and an Ethernet frame,
//     allocating what the length says and parsing an Ethernet header
//     without checking either. qemuLink follows the framing and fails the
//     read of a length shorter than an Ethernet header or longer than
//     maxFrameBytes, so that a broken QEMU can neither exhaust the server's
//     memory nor crash it.
//   - On a write error it forgets the connection while its reader goes on:
//     the next frame read (QEMU exited with frames still unread) makes it
//     learn the sender's MAC again and write the reply to a connection it
//     no longer has, a nil dereference that kills the server. So qemuLink
//     never reports a write error: it closes the connection instead, which
//     ends the reader and with it the gateway.
type qemuLink struct {
	net.Conn
	hdr  [4]byte
	nhdr int // bytes of hdr read
	left int // bytes of the current frame still to come
}

func (c *qemuLink) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	for i := 0; i < n; {
		if c.left > 0 {
			k := min(c.left, n-i)
			c.left -= k
			i += k
			continue
		}
		c.hdr[c.nhdr] = p[i]
		c.nhdr++
		i++
		if c.nhdr == len(c.hdr) {
			c.nhdr = 0
			size := binary.BigEndian.Uint32(c.hdr[:])
			if size < header.EthernetMinimumSize || size > maxFrameBytes {
				return 0, fmt.Errorf("%w: %d bytes", errFrame, size)
			}
			c.left = int(size)
		}
	}
	return n, err
}

func (c *qemuLink) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if errors.Is(err, syscall.ENOBUFS) { // the switch retries these, and keeps the connection
		return n, err
	}
	if err != nil {
		c.Conn.Close()
	}
	return len(p), nil
}
