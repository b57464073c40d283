// Package events serves the state changes the store records with each
// change (its outbox, store.Event): the tenant's events in order, after a
// seq, held until one comes (GET /v1/events with wait_s). It also writes
// sandbox.expiring before a lease ends and prunes events past their
// retention. Every server of a store runs it; the store settles which one
// writes each event, so several servers write none twice.
package events

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// MaxWait bounds how long a reader is held waiting for an event.
const MaxWait = 60 * time.Second

// MaxTypes bounds the type filters of one query.
const MaxTypes = 20

// Config configures a Service.
type Config struct {
	// Store holds the events.
	Store *store.Store
	// Log receives the failures of the background work.
	Log *slog.Logger
	// Retention is how long events are kept. Default 7 days.
	Retention time.Duration
	// ExpiringBefore is how long before a lease ends its
	// sandbox.expiring event is written. Default 60 s.
	ExpiringBefore time.Duration
	// Every is how often Run looks for leases nearing their end. Default
	// 5 s: an expiring event comes between ExpiringBefore and
	// ExpiringBefore-Every before the end.
	Every time.Duration
	// Poll is how often a waiting reader looks for events written by
	// other servers of a shared store (those of this one wake it at
	// once). Default 1 s.
	Poll time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Retention <= 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.ExpiringBefore <= 0 {
		c.ExpiringBefore = 60 * time.Second
	}
	if c.Every <= 0 {
		c.Every = 5 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Service reads the events of a store and keeps them.
type Service struct {
	cfg Config
	st  *store.Store
}

// New returns the events service of cfg.Store.
func New(cfg Config) *Service {
	cfg.setDefaults()
	return &Service{cfg: cfg, st: cfg.Store}
}

// Query selects events (GET /v1/events).
type Query struct {
	// AfterSeq asks for the events after that seq; 0 from the oldest kept.
	AfterSeq int64
	// Limit bounds the events returned: 0 is fields.DefaultLimit, at most
	// fields.MaxLimit.
	Limit int
	// Wait holds the call up to that long until an event comes; at most
	// MaxWait.
	Wait time.Duration
	// Types keeps only these types; "kind.*" stands for all of a kind.
	Types []string
}

// check refuses a query the API should not run.
func (q *Query) check() error {
	if q.AfterSeq < 0 {
		return fmt.Errorf("after_seq %d is negative: use 0 for the oldest event kept: %w", q.AfterSeq, errdefs.ErrInvalid)
	}
	if q.Wait < 0 || q.Wait > MaxWait {
		return fmt.Errorf("wait_s %d is out of bounds: use 0 to %d: %w", int(q.Wait/time.Second), int(MaxWait/time.Second), errdefs.ErrInvalid)
	}
	if len(q.Types) > MaxTypes {
		return fmt.Errorf("%d types: use at most %d: %w", len(q.Types), MaxTypes, errdefs.ErrInvalid)
	}
	for _, t := range q.Types {
		if !apiv1.ValidEventType(t) {
			return fmt.Errorf("unknown event type %q: use one of %s, or a kind followed by .* (sandbox.*): %w",
				fields.Truncate(t, 40), strings.Join(apiv1.EventTypes, ", "), errdefs.ErrInvalid)
		}
	}
	n, err := fields.Limit(q.Limit)
	q.Limit = n
	return err
}

// List returns the events of p's tenant that q selects, in order: an
// admin key sees every key's, any other key those of its own sandboxes
// and builds. With q.Wait and none yet, it waits up to that long for one.
// LastSeq is the seq to ask after next: the last event's, or q.AfterSeq
// when there is none.
func (s *Service) List(ctx context.Context, p tenancy.Principal, q Query) (apiv1.Events, error) {
	if err := q.check(); err != nil {
		return apiv1.Events{}, err
	}
	f := store.EventFilter{AfterSeq: q.AfterSeq, Types: q.Types, Limit: q.Limit}
	if !p.Admin() {
		f.Owner = p.KeyID
	}
	wait := time.NewTimer(q.Wait)
	defer wait.Stop()
	poll := time.NewTicker(s.cfg.Poll)
	defer poll.Stop()
	for {
		// Asked before the read: an event committed after the read wakes
		// the wait below.
		written := s.st.EventsWritten()
		evs, err := s.st.ListEvents(ctx, f)
		if err != nil {
			return apiv1.Events{}, err
		}
		if len(evs) > 0 || q.Wait == 0 {
			return view(evs, q.AfterSeq), nil
		}
		select {
		case <-written:
		case <-poll.C:
		case <-wait.C:
			return view(nil, q.AfterSeq), nil
		case <-ctx.Done():
			return apiv1.Events{}, ctx.Err()
		}
	}
}

func view(evs []store.Event, after int64) apiv1.Events {
	out := apiv1.Events{Items: make([]apiv1.Event, len(evs)), LastSeq: after}
	for i, ev := range evs {
		out.Items[i] = apiv1.Event{ID: ev.ID, Seq: ev.Seq, Time: ev.Time, Type: ev.Type, SandboxID: ev.SandboxID, Data: ev.Data}
		out.LastSeq = ev.Seq
	}
	return out
}

// leaseStates are the states in which a lease's end is told: those where
// it deletes or suspends a sandbox someone may still want.
var leaseStates = []string{apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended}

// Run writes sandbox.expiring for leases nearing their end every
// Config.Every and prunes old events every hour, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Every)
	defer tick.Stop()
	var pruned time.Time
	for {
		prune := time.Since(pruned) >= time.Hour
		if prune {
			pruned = time.Now()
		}
		s.Tick(ctx, prune)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Tick does Run's work once: the expiring leases, and with prune the
// events past their retention.
func (s *Service) Tick(ctx context.Context, prune bool) {
	now := s.cfg.Now()
	if _, err := s.st.AnnounceExpiring(ctx, now, s.cfg.ExpiringBefore, leaseStates); err != nil && ctx.Err() == nil {
		s.cfg.Log.Warn("announce expiring leases", "err", err)
	}
	if !prune {
		return
	}
	if n, err := s.st.PruneEvents(ctx, now.Add(-s.cfg.Retention)); err != nil && ctx.Err() == nil {
		s.cfg.Log.Warn("prune events", "err", err)
	} else if n > 0 {
		s.cfg.Log.Info("pruned events past their retention", "events", n, "retention", s.cfg.Retention)
	}
}
