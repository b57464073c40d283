package idle

import (
	"sync"
	"testing"
	"time"
)

// clock is a hand-moved clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestDue(t *testing.T) {
	type step struct {
		do      string // "touch", "hold", "release", "wait", "forget"
		d       time.Duration
		wantDue bool
	}
	for _, tc := range []struct {
		name  string
		idleS int
		steps []step
	}{
		{"never used is not due", 10, []step{{do: "wait", d: time.Hour}}},
		{"due idle_s after the last touch", 10, []step{
			{do: "touch"}, {do: "wait", d: 9 * time.Second}, {do: "wait", d: time.Second, wantDue: true},
		}},
		{"a touch starts the count again", 10, []step{
			{do: "touch"}, {do: "wait", d: 9 * time.Second}, {do: "touch"},
			{do: "wait", d: 9 * time.Second}, {do: "wait", d: time.Second, wantDue: true},
		}},
		{"never due while held", 10, []step{
			{do: "touch"}, {do: "hold"}, {do: "wait", d: time.Hour}, {do: "wait", d: 24 * time.Hour},
		}},
		{"due idle_s after the release", 10, []step{
			{do: "touch"}, {do: "hold"}, {do: "wait", d: time.Hour}, {do: "release"},
			{do: "wait", d: 9 * time.Second}, {do: "wait", d: time.Second, wantDue: true},
		}},
		{"idle_s 0 is never due", 0, []step{{do: "touch"}, {do: "wait", d: 24 * time.Hour}}},
		{"forgotten is not due", 10, []step{{do: "touch"}, {do: "wait", d: time.Minute, wantDue: true}, {do: "forget"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
			tr := New(c.now)
			var release func()
			for i, s := range tc.steps {
				switch s.do {
				case "touch":
					tr.Touch("sbx1")
				case "hold":
					release = tr.Hold("sbx1")
				case "release":
					release()
				case "wait":
					c.advance(s.d)
				case "forget":
					tr.Forget("sbx1")
				}
				if got := tr.Due("sbx1", tc.idleS); got != s.wantDue {
					t.Fatalf("step %d (%s %v): due %v, want %v", i, s.do, s.d, got, s.wantDue)
				}
			}
		})
	}
}

// Two holds keep a sandbox in use until both are released, and a second
// call of a release does not end the other hold.
func TestHoldsCount(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	tr := New(c.now)
	a, b := tr.Hold("sbx1"), tr.Hold("sbx1")
	a()
	a()
	c.advance(time.Hour)
	if tr.Due("sbx1", 1) {
		t.Fatal("due while a second hold is open")
	}
	b()
	c.advance(time.Second)
	if !tr.Due("sbx1", 1) {
		t.Fatal("not due a second after the last release")
	}
	// A release after Forget does not reach the new count.
	tr.Forget("sbx1")
	old := tr.Hold("sbx1")
	tr.Forget("sbx1")
	held := tr.Hold("sbx1")
	old()
	c.advance(time.Hour)
	if tr.Due("sbx1", 1) {
		t.Fatal("a release from before Forget ended a hold taken after it")
	}
	held()
}
