package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Webhook is where a key's events are POSTed, and how far it has got.
type Webhook struct {
	ID    string
	Owner string
	// AllOwners delivers the events of every key's sandboxes and builds,
	// not only Owner's (a webhook of an admin key).
	AllOwners bool
	URL       string
	// Types keeps only these event types ("kind.*" for a kind); empty for
	// all.
	Types []string
	// Secret is the signing secret as internal/secrets sealed it.
	Secret    []byte
	CreatedAt time.Time
	// AfterSeq is the seq of the last event settled: delivered, or given
	// up. The owner's next event after it is the one to deliver.
	AfterSeq int64
	// Attempts is how many times that next event has failed.
	Attempts int
	// FailingSince is when its first attempt failed; zero while none has.
	FailingSince time.Time
	// NextAt is when to try it next; zero for at once.
	NextAt time.Time
}

const webhookColumns = "id, owner, all_owners, url, types, secret, created_at, after_seq, attempts, failing_since, next_at"

// InsertWebhook stores w. A webhook whose ID is taken is a conflict.
func (s *Store) InsertWebhook(ctx context.Context, w Webhook) error {
	if err := requireID("insert webhook", w.ID); err != nil {
		return err
	}
	if w.CreatedAt.IsZero() {
		w.CreatedAt = now()
	}
	types, err := json.Marshal(nonNilStrings(w.Types))
	if err != nil {
		return fmt.Errorf("insert webhook %s: %w", w.ID, err)
	}
	_, err = s.db.ExecContext(ctx, "INSERT INTO webhooks ("+webhookColumns+") VALUES ("+placeholders(11)+")",
		w.ID, w.Owner, boolInt(w.AllOwners), w.URL, string(types), nonNil(w.Secret), nanos(w.CreatedAt), w.AfterSeq, w.Attempts, nanos(w.FailingSince), nanos(w.NextAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("insert webhook %s: the ID is taken: %w", w.ID, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert webhook %s: %w", w.ID, classify(err))
	}
	return nil
}

// GetWebhook returns the webhook with the given ID.
func (s *Store) GetWebhook(ctx context.Context, id string) (Webhook, error) {
	return getByID(ctx, s.db, "webhook", "webhooks", webhookColumns, id, scanWebhook)
}

// ListWebhooks returns the webhooks of owner ("" for every owner's) in
// the order they were made, at most limit.
func (s *Store) ListWebhooks(ctx context.Context, owner string, limit int) ([]Webhook, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list webhooks: limit %d is not positive: %w", limit, errdefs.ErrInvalid)
	}
	q, args := "SELECT "+webhookColumns+" FROM webhooks", []any{}
	if owner != "" {
		q, args = q+" WHERE owner = ?", append(args, owner)
	}
	return s.queryWebhooks(ctx, q+" ORDER BY seq LIMIT ?", append(args, limit)...)
}

// DueWebhooks returns the webhooks whose next attempt is due at now and
// that no server holds (LeaseWebhook), at most limit.
func (s *Store) DueWebhooks(ctx context.Context, now time.Time, limit int) ([]Webhook, error) {
	return s.queryWebhooks(ctx, "SELECT "+webhookColumns+" FROM webhooks WHERE next_at <= ? AND lease_until < ? ORDER BY next_at, seq LIMIT ?",
		nanos(now), nanos(now), limit)
}

func (s *Store) queryWebhooks(ctx context.Context, q string, args ...any) ([]Webhook, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", classify(err))
	}
	defer rows.Close()
	out := []Webhook{}
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, fmt.Errorf("list webhooks: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list webhooks: %w", classify(err))
	}
	return out, nil
}

func scanWebhook(r scanner) (Webhook, error) {
	var w Webhook
	var types string
	var created, failing, next, all int64
	if err := r.Scan(&w.ID, &w.Owner, &all, &w.URL, &types, &w.Secret, &created, &w.AfterSeq, &w.Attempts, &failing, &next); err != nil {
		return Webhook{}, classify(err)
	}
	if err := json.Unmarshal([]byte(types), &w.Types); err != nil {
		return Webhook{}, fmt.Errorf("webhook %s: types: %w", w.ID, err)
	}
	w.CreatedAt, w.FailingSince, w.NextAt, w.AllOwners = fromNanos(created), fromNanos(failing), fromNanos(next), all == 1
	return w, nil
}

// DeleteWebhook removes a webhook and the record of its deliveries.
func (s *Store) DeleteWebhook(ctx context.Context, id string) error {
	return s.inTx(ctx, func(t *tx) error {
		res, err := t.ExecContext(ctx, "DELETE FROM webhooks WHERE id = ?", id)
		if err != nil {
			return fmt.Errorf("delete webhook %s: %w", id, classify(err))
		}
		if err := mustAffect(res, "webhook", id); err != nil {
			return err
		}
		if _, err := t.ExecContext(ctx, "DELETE FROM webhook_deliveries WHERE webhook_id = ?", id); err != nil {
			return fmt.Errorf("delete webhook %s's deliveries: %w", id, classify(err))
		}
		return nil
	})
}

// LeaseWebhook takes webhook id for this server until until, if no other
// server holds it at now: of the servers that try at once, one gets it.
// It reports whether this one did.
func (s *Store) LeaseWebhook(ctx context.Context, id string, now, until time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, "UPDATE webhooks SET lease_until = ? WHERE id = ? AND lease_until < ?", nanos(until), id, nanos(now))
	if err != nil {
		return false, fmt.Errorf("lease webhook %s: %w", id, classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("lease webhook %s: %w", id, err)
	}
	return n == 1, nil
}

// SettleWebhook records the outcome of a leased webhook's attempt and
// lets the lease go: AfterSeq, Attempts, FailingSince and NextAt as w
// has them, the attempt d (if its ID is set) beside them.
func (s *Store) SettleWebhook(ctx context.Context, w Webhook, d Delivery) error {
	return s.inTx(ctx, func(t *tx) error {
		res, err := t.ExecContext(ctx, "UPDATE webhooks SET after_seq = ?, attempts = ?, failing_since = ?, next_at = ?, lease_until = 0 WHERE id = ?",
			w.AfterSeq, w.Attempts, nanos(w.FailingSince), nanos(w.NextAt), w.ID)
		if err != nil {
			return fmt.Errorf("settle webhook %s: %w", w.ID, classify(err))
		}
		if err := mustAffect(res, "webhook", w.ID); err != nil {
			return err // deleted meanwhile: its attempt is not recorded either
		}
		if d.ID == "" {
			return nil
		}
		if d.CreatedAt.IsZero() {
			d.CreatedAt = now()
		}
		_, err = t.ExecContext(ctx, "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event_type, attempt, status, error, duration_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
			d.ID, w.ID, d.EventID, d.EventType, d.Attempt, d.Status, d.Error, d.DurationMS, nanos(d.CreatedAt))
		if err != nil {
			return fmt.Errorf("record a delivery of webhook %s: %w", w.ID, classify(err))
		}
		return nil
	})
}

// Delivery is one attempt to deliver an event to a webhook.
type Delivery struct {
	ID        string
	EventID   string
	EventType string
	// Attempt counts the attempts at this event, from 1.
	Attempt int
	// Status is the receiver's HTTP status; 0 when it gave none.
	Status int
	// Error says why the attempt failed; "" when it succeeded.
	Error      string
	DurationMS int64
	CreatedAt  time.Time
}

// ListDeliveries returns the newest attempts at deliveries to webhook id,
// newest first, at most limit.
func (s *Store) ListDeliveries(ctx context.Context, webhookID string, limit int) ([]Delivery, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list deliveries: limit %d is not positive: %w", limit, errdefs.ErrInvalid)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT id, event_id, event_type, attempt, status, error, duration_ms, created_at FROM webhook_deliveries"+
		" WHERE webhook_id = ? ORDER BY seq DESC LIMIT ?", webhookID, limit)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", classify(err))
	}
	defer rows.Close()
	out := []Delivery{}
	for rows.Next() {
		var d Delivery
		var created int64
		if err := rows.Scan(&d.ID, &d.EventID, &d.EventType, &d.Attempt, &d.Status, &d.Error, &d.DurationMS, &created); err != nil {
			return nil, fmt.Errorf("list deliveries: %w", classify(err))
		}
		d.CreatedAt = fromNanos(created)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list deliveries: %w", classify(err))
	}
	return out, nil
}

// PruneDeliveries deletes the records of attempts made before before.
func (s *Store) PruneDeliveries(ctx context.Context, before time.Time) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM webhook_deliveries WHERE created_at < ?", nanos(before)); err != nil {
		return fmt.Errorf("prune deliveries: %w", classify(err))
	}
	return nil
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
