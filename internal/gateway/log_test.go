package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestLogRotatesAndLists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.log")
	const segment = 1000
	l, err := OpenLog(path, segment)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := func(i int) Event {
		return Event{Time: t0.Add(time.Duration(i) * time.Second), Proto: "tcp", Host: fmt.Sprintf("h%d.test", i),
			IP: "203.0.113.1", Port: 443, Verdict: "allow", Reason: "allow-rule", BytesOut: int64(i)}
	}
	for i := range 40 {
		l.Add(ev(i))
		l.List(1) // writes what is being summed: each event on its own
	}
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > segment {
			t.Errorf("%s has %d bytes, over the segment size", p, st.Size())
		}
	}
	check := func(l *Log, what string) {
		t.Helper()
		all, err := l.List(0)
		if err != nil {
			t.Fatal(err)
		}
		// The log's own entries count what the rotations discarded: with
		// the events kept, all 40 are accounted for.
		var kept []Event
		var dropped int64
		for _, e := range all {
			if e.Proto == "log" && e.Reason == "rotated" {
				dropped = max(dropped, e.Count) // each counts those before it too
				continue
			}
			kept = append(kept, e)
		}
		if len(kept) < 5 || len(kept) >= 40 {
			t.Fatalf("%s: %d events kept of 40, want the last two segments' worth", what, len(kept))
		}
		if int64(len(kept))+dropped < 40 {
			t.Errorf("%s: %d kept and %d counted as dropped, of 40: some went silently", what, len(kept), dropped)
		}
		for i, e := range kept { // newest first, the newest the last added, across both segments
			if want := ev(39 - i); e != want {
				t.Fatalf("%s: event %d = %+v, want %+v", what, i, e, want)
			}
		}
		some, err := l.List(3)
		if err != nil || len(some) != 3 || some[0] != ev(39) {
			t.Fatalf("%s: List(3) = %+v, %v", what, some, err)
		}
	}
	check(l, "open")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Add(ev(99)) // ignored after Close
	l, err = OpenLog(path, segment)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check(l, "reopened")
}

// A line cut short (a crash mid-write) is skipped, and the next event
// starts a line of its own.
func TestLogTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.log")
	if err := os.WriteFile(path, []byte(`{"time":"2026-01-02T03:04:05Z","proto":"dns","host":"a.test"}`+"\n"+`{"time":"2026-01-02T03:0`), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLog(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Add(Event{Time: time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC), Proto: "dns", Host: "b.test"})
	all, err := l.List(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].Host != "b.test" || all[1].Host != "a.test" {
		t.Fatalf("events %+v", all)
	}
}

// Flows are written when they end but listed by when they started.
func TestLogOrdersByTime(t *testing.T) {
	l, err := OpenLog(filepath.Join(t.TempDir(), "egress.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l.Add(Event{Time: t0.Add(2 * time.Second), Host: "short"})
	l.Add(Event{Time: t0, Host: "long"})
	l.Add(Event{Time: t0.Add(time.Second), Host: "later"})
	all, _ := l.List(0)
	if len(all) != 3 || all[0].Host != "short" || all[1].Host != "later" || all[2].Host != "long" {
		t.Fatalf("events %+v", all)
	}
}

func TestLogConcurrentAdds(t *testing.T) {
	l, err := OpenLog(filepath.Join(t.TempDir(), "egress.log"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				l.Add(Event{Time: time.Now(), Proto: "tcp", Host: fmt.Sprintf("w%d-%d", w, i)})
			}
		}()
	}
	wg.Wait()
	all, err := l.List(0)
	if err != nil || len(all) != 400 {
		t.Fatalf("%d events, %v", len(all), err)
	}
}

// Allowed events of one kind to one destination within a second are one
// entry with their count and bytes; refused ones the gateway did not write
// are counted in one entry a second.
func TestLogSummarizes(t *testing.T) {
	l, err := OpenLog(filepath.Join(t.TempDir(), "egress.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 1000 {
		l.Add(Event{Time: t0.Add(time.Duration(i) * time.Millisecond / 2), Proto: "tcp", Phase: "end", Host: "a.test", IP: "203.0.113.1",
			Port: 443, Verdict: "allow", Reason: "allow-rule", BytesOut: 2, BytesIn: 3})
		l.Add(Event{Time: t0, Proto: "dns", Host: "a.test", Port: 53, Verdict: "allow", Reason: "allow-rule"})
		l.Suppressed(Event{Time: t0, Proto: "tcp", Verdict: "deny", Reason: "default-deny"})
	}
	l.Add(Event{Time: t0, Proto: "tcp", IP: "203.0.113.9", Port: 22, Verdict: "deny", Reason: "default-deny"})
	all, err := l.List(0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Event{
		"tcp end":     {Time: t0, Proto: "tcp", Phase: "end", Count: 1000, Host: "a.test", IP: "203.0.113.1", Port: 443, Verdict: "allow", Reason: "allow-rule", BytesOut: 2000, BytesIn: 3000},
		"dns ":        {Time: t0, Proto: "dns", Count: 1000, Host: "a.test", Port: 53, Verdict: "allow", Reason: "allow-rule"},
		"log sampled": {Time: t0, Proto: "log", Count: 1000, Verdict: "deny", Reason: "sampled"},
		"tcp ":        {Time: t0, Proto: "tcp", IP: "203.0.113.9", Port: 22, Verdict: "deny", Reason: "default-deny"},
	}
	if len(all) != len(want) {
		t.Fatalf("%d entries, want %d: %+v", len(all), len(want), all)
	}
	for _, e := range all {
		k := e.Proto + " " + e.Phase
		if e.Proto == "log" {
			k = "log " + e.Reason
		}
		if e != want[k] {
			t.Errorf("entry %+v, want %+v", e, want[k])
		}
	}
}

// A guest that floods the log cannot wash an early entry out silently: it
// goes, and the log says how many went.
func TestLogFloodIsCounted(t *testing.T) {
	l, err := OpenLog(filepath.Join(t.TempDir(), "egress.log"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l.Add(Event{Time: t0, Proto: "tcp", IP: "203.0.113.1", Port: 22, Verdict: "deny", Reason: "deny-rule"})
	const flood = 500
	for i := range flood {
		l.Add(Event{Time: t0.Add(time.Second), Proto: "dns", Host: fmt.Sprintf("x%d.test", i), Port: 53, Verdict: "deny", Reason: "default-deny"})
	}
	all, err := l.List(0)
	if err != nil {
		t.Fatal(err)
	}
	var kept, counted int64
	for _, e := range all {
		if e.Proto == "log" {
			counted = max(counted, e.Count)
		} else {
			kept++
		}
	}
	if kept >= flood+1 || kept+counted != flood+1 {
		t.Fatalf("%d entries kept and %d counted as dropped, want all %d accounted for", kept, counted, flood+1)
	}
}
