package sandboxtest

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// port stands in for a VM's virtio-serial port between the host and the
// in-process agent: reads report EOF while no host is connected, writes
// are dropped, and a host can connect again later (after a release or a
// suspend), as over the real port.
type port struct {
	mu   sync.Mutex // guards conn
	conn net.Conn   // the guest's end of the current host's pipe
}

func (p *port) current() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

func (p *port) Read(b []byte) (int, error) {
	c := p.current()
	if c == nil {
		return 0, io.EOF
	}
	n, err := c.Read(b)
	if err != nil {
		p.mu.Lock()
		if p.conn == c {
			p.conn = nil
		}
		p.mu.Unlock()
		if n == 0 {
			return 0, io.EOF
		}
	}
	return n, nil
}

func (p *port) Write(b []byte) (int, error) {
	c := p.current()
	if c == nil {
		return len(b), nil
	}
	n, err := c.Write(b)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return len(b), nil
	}
	return n, err
}

func (p *port) SetWriteDeadline(t time.Time) error {
	if c := p.current(); c != nil {
		return c.SetWriteDeadline(t)
	}
	return nil
}

// connect attaches a new host, cutting off the one before, and returns
// the host's end.
func (p *port) connect() net.Conn {
	host, guest := net.Pipe()
	p.mu.Lock()
	old := p.conn
	p.conn = guest
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return host
}

// disconnect cuts off the current host, if any.
func (p *port) disconnect() {
	p.mu.Lock()
	old := p.conn
	p.conn = nil
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
}
