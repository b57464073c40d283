package agent

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"testing"
	"time"
)

// slowWriter records writes and takes a while over each, as a port does.
type slowWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	fail   error
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(2 * time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail != nil {
		return 0, w.fail
	}
	w.writes++
	return w.buf.Write(p)
}

func TestCoalescerKeepsOrderAndMerges(t *testing.T) {
	w := &slowWriter{}
	c := newCoalescer(w)
	defer c.close()
	var want bytes.Buffer
	for i := 0; i < 2000; i++ {
		p := []byte{byte(i), byte(i >> 8), 'x'}
		want.Write(p)
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		n, writes := w.buf.Len(), w.writes
		w.mu.Unlock()
		if n == want.Len() {
			if !bytes.Equal(w.buf.Bytes(), want.Bytes()) {
				t.Fatal("bytes arrived out of order")
			}
			if writes >= 2000 {
				t.Fatalf("%d port writes for 2000 small writes: nothing was merged", writes)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d bytes arrived", n, want.Len())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCoalescerReportsErrorsAndClose(t *testing.T) {
	boom := errors.New("port gone")
	w := &slowWriter{fail: boom}
	c := newCoalescer(w)
	c.Write([]byte("a"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.Write([]byte("b")); errors.Is(err, boom) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the port's error never reached writers")
		}
		time.Sleep(time.Millisecond)
	}
	c2 := newCoalescer(io.Discard)
	c2.close()
	if _, err := c2.Write([]byte("x")); err == nil {
		t.Fatal("write after close succeeded")
	}
}
