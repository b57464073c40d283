package jail

import (
	"os"
	"testing"
)

// TestParentAlive: the life pipe says the parent is alive while its write
// end is open, and gone once it is closed.
func TestParentAlive(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := 0; i < 1000; i++ { // many polls, so that signals land in some
		if !parentAlive(int(r.Fd())) {
			t.Fatalf("poll %d: the parent looks gone while the pipe is open", i)
		}
	}
	w.Close()
	if parentAlive(int(r.Fd())) {
		t.Fatal("the parent looks alive after the pipe's write end closed")
	}
}
