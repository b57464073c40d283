package builds

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// Run is a build, or a save, in progress on this server.
type Run struct {
	Rec    store.Build
	Op     store.Operation
	Log    *Log
	Cancel context.CancelFunc
	Done   chan struct{} // closed once the build's end is stored

	// Base is the template ref the build starts from, if it is one: a
	// delete of that tag waits for the build or is refused.
	Base string
	// Contexts are the build contexts it reads, kept from pruning.
	Contexts []string

	// pins are the images the build reads or has made so far: Reclaim
	// leaves them alone. Guarded by Set.mu.
	pins map[string]bool
	// storing is when the image store in progress began (Set.Store);
	// zero when none is. Guarded by Set.mu.
	storing time.Time
}

// Set is the builds in progress on one server and the slots they run
// in. Its lock is its own: the sandbox side's never covers it.
type Set struct {
	slots chan struct{} // build slots, MaxBuilds of them
	max   int           // builds running or waiting, at most

	mu   sync.Mutex      // guards runs, and each Run's pins and storing
	runs map[string]*Run // by build ID
}

// NewSet returns an empty set whose builds run slots at a time, up to
// max running or waiting.
func NewSet(slots, max int) *Set {
	return &Set{slots: make(chan struct{}, slots), max: max, runs: map[string]*Run{}}
}

// Add records run as in progress, or refuses it (errdefs.ErrExhausted)
// when max builds already are.
func (s *Set) Add(run *Run) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.runs); n >= s.max {
		return fmt.Errorf("%d builds are running or waiting, the limit: retry later: %w", n, errdefs.ErrExhausted)
	}
	s.runs[run.Rec.ID] = run
	return nil
}

// Remove forgets the build id.
func (s *Set) Remove(id string) {
	s.mu.Lock()
	delete(s.runs, id)
	s.mu.Unlock()
}

// Get returns the build id in progress, or nil.
func (s *Set) Get(id string) *Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// Slot waits for a build slot; release gives it back.
func (s *Set) Slot(ctx context.Context) (release func(), err error) {
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Each calls f with every build in progress, under the set's lock, until
// f returns an error, and returns that error; then, if none, it returns
// what then returns (also under the lock, so that no build starts in
// between).
func (s *Set) Each(f func(*Run) error, then func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, run := range s.runs {
		if err := f(run); err != nil {
			return err
		}
	}
	if then != nil {
		return then()
	}
	return nil
}

// Pin marks an image as used by a build in progress.
func (s *Set) Pin(run *Run, dgst string) {
	s.mu.Lock()
	if run.pins == nil {
		run.pins = map[string]bool{}
	}
	run.pins[dgst] = true
	s.mu.Unlock()
}

// Store runs put, which stores a new image, and pins what it stored.
// While it runs, Kept says when it began, so that Reclaim spares every
// image stored since: the new one is in the store before it is pinned.
func (s *Set) Store(run *Run, put func() (template.Template, error)) (template.Template, error) {
	s.mu.Lock()
	run.storing = time.Now()
	s.mu.Unlock()
	t, err := put()
	s.mu.Lock()
	if err == nil {
		if run.pins == nil {
			run.pins = map[string]bool{}
		}
		run.pins[t.Digest] = true
	}
	run.storing = time.Time{}
	s.mu.Unlock()
	return t, err
}

// Kept adds to keep the images the builds in progress pin, and returns
// when the earliest image store in progress began (zero if none is).
func (s *Set) Kept(keep map[string]bool) (storingSince time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, run := range s.runs {
		for d := range run.pins {
			keep[d] = true
		}
		if !run.storing.IsZero() && (storingSince.IsZero() || run.storing.Before(storingSince)) {
			storingSince = run.storing
		}
	}
	return storingSince
}

// Contexts returns the build contexts the builds in progress read.
func (s *Set) Contexts() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	inUse := map[string]bool{}
	for _, run := range s.runs {
		for _, id := range run.Contexts {
			inUse[id] = true
		}
	}
	return inUse
}
