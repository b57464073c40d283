package eventlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func openLog(t *testing.T, segment int64) (*Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cmd.log")
	l, err := Open(path, segment)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func readAll(t *testing.T, r *Reader) []Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []Event
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, e)
	}
}

func TestAppendAndReplay(t *testing.T) {
	l, _ := openLog(t, 0)
	for i := 1; i <= 5; i++ {
		seq, err := l.Append(2, int64(i*10), []byte(fmt.Sprint("event ", i)))
		if err != nil || seq != int64(i) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	l.Finish()
	tests := []struct {
		name  string
		after int64
		want  []int64
	}{
		{"from the start", 0, []int64{1, 2, 3, 4, 5}},
		{"after the second", 2, []int64{3, 4, 5}},
		{"after the last", 5, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := l.NewReader(tt.after)
			defer r.Close()
			var got []int64
			for _, e := range readAll(t, r) {
				got = append(got, e.Seq)
				if want := fmt.Sprint("event ", e.Seq); string(e.Data) != want || e.Cursor != e.Seq*10 {
					t.Errorf("event %d: data %q cursor %d", e.Seq, e.Data, e.Cursor)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFollowLive(t *testing.T) {
	l, _ := openLog(t, 0)
	r := l.NewReader(0)
	defer r.Close()
	var got []Event
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		got = readAll(t, r)
	}()
	for i := 0; i < 100; i++ {
		if _, err := l.Append(2, 0, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	l.Finish()
	wg.Wait()
	if len(got) != 100 {
		t.Fatalf("reader got %d events, want 100", len(got))
	}
	for i, e := range got {
		if e.Seq != int64(i+1) || e.Data[0] != byte(i) {
			t.Fatalf("event %d is %d with %v", i, e.Seq, e.Data)
		}
	}
}

func TestNextWaitsUntilContextEnds(t *testing.T) {
	l, _ := openLog(t, 0)
	r := l.NewReader(0)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := r.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next on an empty open log: %v, want deadline exceeded", err)
	}
}

// Rotation keeps at least one segment of the newest events, and a reader
// that fell behind gets a gap and then everything still kept, in order.
func TestRotationAndGap(t *testing.T) {
	l, path := openLog(t, 1000)
	data := bytes.Repeat([]byte("x"), 100)
	for i := 0; i < 100; i++ {
		if _, err := l.Append(2, int64(i), data); err != nil {
			t.Fatal(err)
		}
	}
	l.Finish()
	var size int64
	for _, p := range []string{path, path + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if size > 2*(1000+headerSize+100) {
		t.Errorf("the log holds %d bytes on disk for a 1000-byte segment", size)
	}
	events := readAll(t, l.NewReader(0))
	if len(events) == 0 || events[0].Type != Gap || events[0].Seq != 1 {
		t.Fatalf("first event %+v, want a gap from 1", events[0])
	}
	kept := events[1:]
	if events[0].Cursor != kept[0].Seq-1 {
		t.Errorf("gap says %d dropped, but the first kept is %d", events[0].Cursor, kept[0].Seq)
	}
	if last := kept[len(kept)-1].Seq; last != 100 {
		t.Errorf("last event %d, want 100", last)
	}
	for i := 1; i < len(kept); i++ {
		if kept[i].Seq != kept[i-1].Seq+1 {
			t.Fatalf("hole between %d and %d", kept[i-1].Seq, kept[i].Seq)
		}
	}
	if n := int64(len(kept)) * (headerSize + 100); n < 1000 {
		t.Errorf("kept only %d bytes of events, less than a segment", n)
	}
}

// A reader following along while segments rotate under it misses nothing.
func TestReaderAcrossRotations(t *testing.T) {
	l, _ := openLog(t, 500)
	r := l.NewReader(0)
	defer r.Close()
	done := make(chan []Event)
	go func() { done <- readAll(t, r) }()
	for i := 0; i < 300; i++ {
		if _, err := l.Append(3, 0, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	l.Finish()
	got := <-done
	// The reader may fall behind by more than a segment; then it sees a
	// gap. Either way what it saw is in order and ends at the last event.
	var last int64
	for _, e := range got {
		if e.Type == Gap {
			last = e.Seq + e.Cursor - 1
			continue
		}
		if e.Seq != last+1 {
			t.Fatalf("event %d after %d", e.Seq, last)
		}
		last = e.Seq
	}
	if last != 300 {
		t.Fatalf("reader ended at %d, want 300", last)
	}
}

// A reopened log goes on numbering where it stopped, keeps the cursor, and
// drops a record cut short by a crash.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cmd.log")
	l, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	l.Append(1, 7, []byte("start"))
	l.Append(2, 42, []byte("out"))
	l.Close()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0, 0, 0, 0, 0, 0, 0, 3, 0}) // a torn header
	f.Close()

	l, err = Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if last := l.Last(); last.Seq != 2 || last.Cursor != 42 || last.Type != 2 {
		t.Fatalf("reopened log's last event %+v, want seq 2 cursor 42", last)
	}
	if seq, err := l.Append(4, 42, []byte("exit")); err != nil || seq != 3 {
		t.Fatalf("append after reopen: seq %d, %v", seq, err)
	}
	l.Finish()
	events := readAll(t, l.NewReader(0))
	if len(events) != 3 || string(events[2].Data) != "exit" {
		t.Fatalf("events after reopen: %+v", events)
	}
}

func TestAppendRefusesOversizedEvent(t *testing.T) {
	l, _ := openLog(t, 0)
	if _, err := l.Append(2, 0, make([]byte, MaxData+1)); err == nil {
		t.Fatal("an event over MaxData was accepted")
	}
	if l.Last().Seq != 0 {
		t.Fatal("a refused event took a sequence number")
	}
}
