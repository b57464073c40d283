package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/airlockhq/airlock/internal/agentproto"
)

func TestMaxInFlightCoversTheWindow(t *testing.T) {
	if w := agentproto.MuxConfig().MaxStreamWindowSize; streamWindow < int64(w) {
		t.Fatalf("streamWindow is %d, the yamux window %d", streamWindow, w)
	}
	if RingSize-maxInFlight < 4*agentproto.ChunkSize {
		t.Fatalf("a ring of %d leaves too little room for output beyond %d in flight", RingSize, maxInFlight)
	}
}

// exitedRecord describes one exited process for TestEvict.
type exitedRecord struct {
	exitedAgo    time.Duration
	deliveredAgo time.Duration // negative: not delivered
	output       int           // bytes of output in the ring
	attached     bool
}

func TestEvict(t *testing.T) {
	now := time.Now()
	many := func(n int, r exitedRecord) []exitedRecord {
		rs := make([]exitedRecord, n)
		for i := range rs {
			rs[i] = r
			rs[i].exitedAgo += time.Duration(n-i) * time.Second // earlier ones exited first
		}
		return rs
	}
	tests := []struct {
		name     string
		records  []exitedRecord
		running  int
		wantKept []int // indexes of records still there
		// wantReleased are indexes of kept records whose output was released.
		wantReleased []int
	}{
		{
			name: "delivered records age out, undelivered stay",
			records: []exitedRecord{
				{exitedAgo: time.Hour, deliveredAgo: exitedTTL + time.Second},
				{exitedAgo: time.Hour, deliveredAgo: exitedTTL - time.Second},
				{exitedAgo: time.Hour, deliveredAgo: -1},
			},
			running:  3,
			wantKept: []int{1, 2},
		},
		{
			name:     "the most recent exits are kept",
			records:  many(maxExited+4, exitedRecord{deliveredAgo: -1}),
			wantKept: seq(4, maxExited+4),
		},
		{
			name: "delivered records go first",
			records: append(many(10, exitedRecord{exitedAgo: time.Hour, deliveredAgo: -1}),
				many(maxExited, exitedRecord{deliveredAgo: 0})...),
			// The 10 undelivered stay, and the most recent delivered ones.
			wantKept: append(seq(0, 10), seq(20, maxExited+10)...),
		},
		{
			name: "attached records are not counted",
			records: append([]exitedRecord{{exitedAgo: time.Hour, deliveredAgo: exitedTTL * 2, attached: true}},
				many(maxExited, exitedRecord{deliveredAgo: -1})...),
			wantKept: seq(0, maxExited+1),
		},
		{
			name:         "output beyond the budget is released, oldest first",
			records:      many(exitedOutputBudget/RingSize+2, exitedRecord{deliveredAgo: -1, output: RingSize}),
			wantKept:     seq(0, exitedOutputBudget/RingSize+2),
			wantReleased: []int{0, 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Config{})
			for i := range tc.running {
				a.procs[fmt.Sprintf("r%d", i)] = newProcess("r", 1, nil, nil)
			}
			procs := make([]*process, len(tc.records))
			for i, r := range tc.records {
				p := newProcess(fmt.Sprintf("e%d", i), 1, nil, nil)
				p.running = false
				p.exit = &agentproto.Exit{ExitCode: i}
				p.exitedAt = now.Add(-r.exitedAgo)
				if r.deliveredAgo >= 0 {
					p.delivered, p.deliveredAt = true, now.Add(-r.deliveredAgo)
				}
				p.out.append(agentproto.MsgStdout, make([]byte, r.output))
				if r.attached {
					c1, c2 := net.Pipe()
					defer c1.Close()
					defer c2.Close()
					p.att = &attachment{st: c1}
				}
				procs[i] = p
				a.procs[p.id] = p
			}
			a.evict(now)
			var kept []int
			for i, p := range procs {
				if a.procs[p.id] == p {
					kept = append(kept, i)
				}
			}
			if fmt.Sprint(kept) != fmt.Sprint(tc.wantKept) {
				t.Fatalf("kept %v, want %v", kept, tc.wantKept)
			}
			if len(a.procs) != len(kept)+tc.running {
				t.Fatalf("%d records left, want %d", len(a.procs), len(kept)+tc.running)
			}
			var released []int
			for _, i := range kept {
				if p := procs[i]; p.out.start() == p.out.end && p.out.end > 0 {
					released = append(released, i)
				}
				if procs[i].exit.ExitCode != i {
					t.Fatalf("record %d lost its exit", i)
				}
			}
			if fmt.Sprint(released) != fmt.Sprint(tc.wantReleased) {
				t.Fatalf("released the output of %v, want %v", released, tc.wantReleased)
			}
		})
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// A pump that only gets to run after its drain deadline passed still reads
// what the process wrote before it exited: output already in the pipe or
// terminal is never dropped, and only an idle one reports the deadline.
func TestReadOutputAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	for _, c := range []struct {
		name string
		r, w *os.File
	}{{"pipe", r, w}, {"terminal", ptmx, tty}} {
		if _, err := c.w.Write([]byte("written before the exit\n")); err != nil {
			t.Fatal(err)
		}
		c.r.SetReadDeadline(time.Now().Add(-time.Second))
		buf := make([]byte, 256)
		n, err := readOutput(c.r, buf)
		if err != nil || !strings.Contains(string(buf[:n]), "written before the exit") {
			t.Errorf("%s: read %q, %v after the deadline, want the output", c.name, buf[:n], err)
		}
		if n, err := readOutput(c.r, buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: an idle read after the deadline got %q, %v", c.name, buf[:n], err)
		}
	}
	w.Close()
	if _, err := readOutput(r, make([]byte, 16)); err != io.EOF {
		t.Errorf("a closed pipe after the deadline: %v, want EOF", err)
	}
}
