package agentclient

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// A guest that never reads nor answers must not hold the handshake past its
// deadline, even while a hello write is blocked.
func TestHandshakeGivesUp(t *testing.T) {
	host, guest := net.Pipe() // writes block until the other side reads
	defer guest.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Handshake(ctx, host)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want deadline exceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handshake did not give up")
	}
}
