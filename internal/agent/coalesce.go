package agent

import (
	"io"
	"net"
	"sync"
)

// maxPending bounds the bytes a coalescer holds before writers wait.
const maxPending = 256 << 10

// coalescer merges the small writes yamux makes (a 12-byte header, then the
// body, for every frame) into as few port writes as the port's pace allows:
// while one write is in flight, whatever arrives is gathered into the next.
// Every port write is a VM exit, so fewer of them leave more of the guest's
// CPU for the work; when the link is idle it adds no delay.
type coalescer struct {
	w io.Writer

	mu     sync.Mutex // guards the fields below
	cond   *sync.Cond // signalled when buf, err or closed change
	buf    []byte     // bytes waiting for the next port write
	err    error      // the first port write error; later writes fail with it
	closed bool
}

// newCoalescer starts a coalescer writing to w. Its goroutine ends on close
// or on the first write error.
func newCoalescer(w io.Writer) *coalescer {
	c := &coalescer{w: w}
	c.cond = sync.NewCond(&c.mu)
	go c.run()
	return c
}

func (c *coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) >= maxPending && c.err == nil && !c.closed {
		c.cond.Wait()
	}
	switch {
	case c.err != nil:
		return 0, c.err
	case c.closed:
		return 0, net.ErrClosed
	}
	c.buf = append(c.buf, p...)
	c.cond.Broadcast()
	return len(p), nil
}

func (c *coalescer) run() {
	var spare []byte
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for len(c.buf) == 0 && !c.closed {
			c.cond.Wait()
		}
		if c.closed {
			return
		}
		out := c.buf
		c.buf = spare[:0]
		c.mu.Unlock()
		_, err := c.w.Write(out)
		c.mu.Lock()
		spare = out
		if err != nil {
			c.err = err
			c.cond.Broadcast()
			return
		}
		c.cond.Broadcast()
	}
}

// close drops what is pending and stops the goroutine.
func (c *coalescer) close() {
	c.mu.Lock()
	c.closed = true
	c.buf = nil
	c.cond.Broadcast()
	c.mu.Unlock()
}
