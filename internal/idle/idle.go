// Package idle tracks what uses each sandbox, so that the service can
// suspend or pause one nothing has used for its idle_s (docs/api.md,
// "Idle sandboxes").
//
// A Tracker knows two kinds of use: a call that touches a sandbox once
// (Touch: a keep, a file stat, a command's creation) and a use that is
// open for a while (Hold, until its release: a command that runs, a
// command stream, a file transfer, a port connection, an E2B envd
// request). A sandbox is quiet while nothing holds it; it has been quiet
// since the last touch or release. Reads of a sandbox's state (its view,
// metrics, egress log, events) are no use and are not told here.
//
// The Tracker keeps no goroutine; the service asks it, once a second,
// which sandboxes are due (Due) and forgets a sandbox when it lets go of
// it (Forget).
package idle

import (
	"sync"
	"time"
)

// Tracker is the use of the sandboxes of one server.
type Tracker struct {
	now func() time.Time

	mu   sync.Mutex           // guards uses
	uses map[string]*activity // by sandbox ID; absent for one never used
}

// activity is one sandbox's use.
type activity struct {
	open int       // holds not yet released
	last time.Time // the last touch, hold or release
}

// New returns a Tracker that reads the time from now.
func New(now func() time.Time) *Tracker {
	return &Tracker{now: now, uses: map[string]*activity{}}
}

// entry returns id's activity, made if missing. t.mu is held.
func (t *Tracker) entry(id string) *activity {
	a := t.uses[id]
	if a == nil {
		a = &activity{}
		t.uses[id] = a
	}
	return a
}

// Touch records a use of sandbox id that ends at once.
func (t *Tracker) Touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entry(id).last = t.now()
}

// Hold records a use of sandbox id that lasts until release is called;
// calls of release after the first do nothing.
func (t *Tracker) Hold(id string) (release func()) {
	t.mu.Lock()
	a := t.entry(id)
	a.open++
	a.last = t.now()
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			// Forget may have dropped the entry: the sandbox is gone, or a
			// new entry counts uses from after it.
			if t.uses[id] == a && a.open > 0 {
				a.open--
				a.last = t.now()
			}
		})
	}
}

// Quiet reports whether nothing holds sandbox id, and since when it has
// been used last (the zero time if never).
func (t *Tracker) Quiet(id string) (since time.Time, quiet bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.uses[id]
	if a == nil {
		return time.Time{}, true
	}
	return a.last, a.open == 0
}

// Due reports whether sandbox id, which lets go after idleS seconds of
// quiet, is due now: nothing holds it, and its last use is idleS or more
// ago. A sandbox never used counts from its first Touch; with none it is
// not due, so that the caller touches each sandbox when it starts to
// look after it. idleS 0 is never due.
func (t *Tracker) Due(id string, idleS int) bool {
	if idleS <= 0 {
		return false
	}
	since, quiet := t.Quiet(id)
	if !quiet || since.IsZero() {
		return false
	}
	return !t.now().Before(since.Add(time.Duration(idleS) * time.Second))
}

// Forget drops what the Tracker knows of sandbox id: the server let go of
// it. Releases of holds taken before do nothing.
func (t *Tracker) Forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.uses, id)
}
