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
		if len(all) < 5 || len(all) >= 40 {
			t.Fatalf("%s: %d events kept of 40, want the last two segments' worth", what, len(all))
		}
		for i, e := range all { // newest first, the newest the last added, across both segments
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
