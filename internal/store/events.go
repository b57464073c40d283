package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
)

// Event is one change of state of a sandbox or a build, written in the
// transaction that makes the change (the outbox): a change is never
// recorded without its event, nor an event without its change.
type Event struct {
	// Seq orders the events of a store: each event commits after every
	// event with a lower Seq.
	Seq int64
	// ID names the event ("evt…"), for receivers that drop repeats.
	ID string
	// Owner is the key ID of the sandbox or build the event is about.
	Owner string
	// Type is one of apiv1's Event* types.
	Type string
	// SandboxID is the sandbox the event is about; "" for a build's.
	SandboxID string
	// Time is when the change was recorded.
	Time time.Time
	// Data is a JSON object with the details of the type.
	Data json.RawMessage
}

const eventColumns = "seq, id, owner, type, sandbox_id, data, created_at"

// sandboxEvent is the event type of a sandbox going from state from to
// state to; "" when the step is not one callers are told of (the states
// in between: suspending, waking, deleting).
func sandboxEvent(from, to string) string {
	if from == to {
		return ""
	}
	switch to {
	case apiv1.StateCreating:
		return apiv1.EventSandboxCreated
	case apiv1.StateRunning:
		if from == apiv1.StateWaking || from == apiv1.StateSuspended {
			return apiv1.EventSandboxWoken
		}
		return apiv1.EventSandboxRunning
	case apiv1.StatePaused:
		return apiv1.EventSandboxPaused
	case apiv1.StateSuspended:
		return apiv1.EventSandboxSuspended
	case apiv1.StateDeleted:
		return apiv1.EventSandboxDeleted
	case apiv1.StateFailed:
		return apiv1.EventSandboxFailed
	}
	return ""
}

// appendEvent writes ev in t. On PostgreSQL it first takes the events'
// sequence lock, so that events commit in the order of their seq and a
// reader that has seen seq N never later finds one below it.
func appendEvent(ctx context.Context, t *tx, ev Event) error {
	if ev.ID == "" {
		ev.ID = ids.New("evt")
	}
	if ev.Time.IsZero() {
		ev.Time = now()
	}
	if len(ev.Data) == 0 {
		ev.Data = json.RawMessage("{}")
	}
	if err := t.lockSeq(ctx, "events"); err != nil {
		return fmt.Errorf("record event %s: %w", ev.Type, classify(err))
	}
	_, err := t.ExecContext(ctx, "INSERT INTO events (id, owner, type, sandbox_id, data, created_at) VALUES (?, ?, ?, ?, ?, ?)",
		ev.ID, ev.Owner, ev.Type, ev.SandboxID, string(ev.Data), nanos(ev.Time))
	if err != nil {
		return fmt.Errorf("record event %s: %w", ev.Type, classify(err))
	}
	t.events++
	return nil
}

// sandboxEventData is the data of a sandbox's event: the states it went
// between, and why it failed.
func sandboxEventData(from string, sb Sandbox) json.RawMessage {
	d := struct {
		From  string `json:"from,omitempty"`
		State string `json:"state"`
		Error *Error `json:"error,omitempty"`
	}{From: from, State: sb.State}
	if sb.State == apiv1.StateFailed {
		d.Error = sb.LastError
	}
	b, _ := json.Marshal(d) // strings and a struct of strings: cannot fail
	return b
}

// EventFilter selects events in ListEvents.
type EventFilter struct {
	// Owner, if set, keeps only the events of that key ID.
	Owner string
	// AfterSeq keeps the events after that seq.
	AfterSeq int64
	// Types, if set, keeps only events whose type is one of these, or,
	// for an entry that ends in ".*", starts with what comes before it.
	Types []string
	// Limit bounds the number of events; it must be positive.
	Limit int
}

// ListEvents returns the events f selects, in seq order.
func (s *Store) ListEvents(ctx context.Context, f EventFilter) ([]Event, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("list events: limit %d is not positive: %w", f.Limit, errdefs.ErrInvalid)
	}
	where := []string{"seq > ?"}
	args := []any{f.AfterSeq}
	if f.Owner != "" {
		where = append(where, "owner = ?")
		args = append(args, f.Owner)
	}
	if len(f.Types) > 0 {
		var or []string
		for _, ty := range f.Types {
			if prefix, ok := strings.CutSuffix(ty, ".*"); ok {
				// A type is letters, digits and dots (apiv1.ValidEventType):
				// no LIKE wildcard to escape.
				or = append(or, "type LIKE ?")
				args = append(args, prefix+".%")
			} else {
				or = append(or, "type = ?")
				args = append(args, ty)
			}
		}
		where = append(where, "("+strings.Join(or, " OR ")+")")
	}
	args = append(args, f.Limit)
	rows, err := s.db.QueryContext(ctx, "SELECT "+eventColumns+" FROM events WHERE "+strings.Join(where, " AND ")+" ORDER BY seq LIMIT ?", args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", classify(err))
	}
	defer rows.Close()
	list := []Event{}
	for rows.Next() {
		var ev Event
		var data string
		var created int64
		if err := rows.Scan(&ev.Seq, &ev.ID, &ev.Owner, &ev.Type, &ev.SandboxID, &data, &created); err != nil {
			return nil, fmt.Errorf("list events: %w", classify(err))
		}
		ev.Data, ev.Time = json.RawMessage(data), fromNanos(created)
		list = append(list, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list events: %w", classify(err))
	}
	return list, nil
}

// LastEventSeq is the seq of the newest event (0 when there is none): a
// reader that starts now asks for the events after it.
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var seq int64
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM events").Scan(&seq); err != nil {
		return 0, fmt.Errorf("last event: %w", classify(err))
	}
	return seq, nil
}

// AnnounceExpiring writes a sandbox.expiring event for each sandbox in
// one of states whose lease ends after now and within the next within,
// once per lease end, and returns how many it wrote. Of several servers
// that announce at once, one writes each event.
func (s *Store) AnnounceExpiring(ctx context.Context, now time.Time, within time.Duration, states []string) (int, error) {
	if len(states) == 0 || within <= 0 {
		return 0, fmt.Errorf("announce expiring leases: need states and a positive window: %w", errdefs.ErrInvalid)
	}
	args := []any{nanos(now), nanos(now.Add(within))}
	for _, st := range states {
		args = append(args, st)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT id, owner, state, expires_at FROM sandboxes"+
		" WHERE expires_at IS NOT NULL AND expires_at > ? AND expires_at <= ? AND expiry_told <> expires_at"+
		" AND state IN ("+placeholders(len(states))+") ORDER BY expires_at LIMIT 100", args...)
	if err != nil {
		return 0, fmt.Errorf("announce expiring leases: %w", classify(err))
	}
	type due struct {
		id, owner, state string
		expires          int64
	}
	var all []due
	for rows.Next() {
		var d due
		if err := rows.Scan(&d.id, &d.owner, &d.state, &d.expires); err != nil {
			rows.Close()
			return 0, fmt.Errorf("announce expiring leases: %w", classify(err))
		}
		all = append(all, d)
	}
	if err := rows.Close(); err != nil {
		return 0, fmt.Errorf("announce expiring leases: %w", classify(err))
	}
	n := 0
	for _, d := range all {
		err := s.inTx(ctx, func(t *tx) error {
			// The row, not the read above, decides: another server may
			// have told this lease end, or a keep moved it, meanwhile.
			res, err := t.ExecContext(ctx, "UPDATE sandboxes SET expiry_told = expires_at WHERE id = ? AND expires_at = ? AND expiry_told <> expires_at", d.id, d.expires)
			if err != nil {
				return classify(err)
			}
			if k, err := res.RowsAffected(); err != nil || k == 0 {
				return err
			}
			data, _ := json.Marshal(struct { // a string and a time: cannot fail
				State     string    `json:"state"`
				ExpiresAt time.Time `json:"expires_at"`
			}{d.state, fromNanos(d.expires)})
			if err := appendEvent(ctx, t, Event{Owner: d.owner, Type: apiv1.EventSandboxExpiring, SandboxID: d.id, Data: data}); err != nil {
				return err
			}
			n++
			return nil
		})
		if err != nil {
			return n, fmt.Errorf("announce the lease end of sandbox %s: %w", d.id, err)
		}
	}
	return n, nil
}

// PruneEvents deletes the events recorded before before and returns how
// many there were.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM events WHERE created_at < ?", nanos(before))
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return n, nil
}

// EventsWritten returns a channel closed once a transaction of this Store
// that wrote events has committed: a reader waiting for new events
// (GET /v1/events with wait_s) wakes at once for the changes made by this
// process. Those of other processes sharing a PostgreSQL store are seen
// when the reader polls.
func (s *Store) EventsWritten() <-chan struct{} {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	if s.evCh == nil {
		s.evCh = make(chan struct{})
	}
	return s.evCh
}

// eventsCommitted wakes the readers waiting in EventsWritten.
func (s *Store) eventsCommitted() {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	if s.evCh != nil {
		close(s.evCh)
		s.evCh = nil
	}
}
