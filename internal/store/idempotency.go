package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// IdempotencyTTL is how long the first answer to a mutating call is replayed
// to a retry with the same Idempotency-Key.
const IdempotencyTTL = 24 * time.Hour

// Idempotent is the first answer to a mutating call, kept so that a retry
// with the same Idempotency-Key gets it again instead of doing the work twice.
type Idempotent struct {
	// KeyID is the ID of the API key that made the call.
	KeyID string
	// Key is the value of the Idempotency-Key header.
	Key string
	// RequestHash is the sha256 of the method, path and body of the call, so
	// that a retry with different content can be told apart.
	RequestHash []byte
	// Status is the HTTP status of the answer.
	Status int
	// Body is the body of the answer.
	Body []byte
	// CreatedAt is when the answer was given; the zero time means now.
	CreatedAt time.Time
}

// GetIdempotent returns the answer recorded for (keyID, key). One older than
// IdempotencyTTL is treated as absent.
func (s *Store) GetIdempotent(ctx context.Context, keyID, key string) (Idempotent, error) {
	r := Idempotent{KeyID: keyID, Key: key}
	var created int64
	err := s.db.QueryRowContext(ctx,
		"SELECT request_hash, status, body, created_at FROM idempotency WHERE key_id = ? AND key = ? AND created_at >= ?",
		keyID, key, nanos(now().Add(-IdempotencyTTL))).Scan(&r.RequestHash, &r.Status, &r.Body, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Idempotent{}, fmt.Errorf("idempotency key %q: %w", key, errdefs.ErrNotFound)
	}
	if err != nil {
		return Idempotent{}, fmt.Errorf("get idempotency key %q: %w", key, classify(err))
	}
	r.RequestHash, r.Body = nonNil(r.RequestHash), nonNil(r.Body)
	r.CreatedAt = fromNanos(created)
	return r, nil
}

// PutIdempotent records r. The first answer wins: if one is recorded for
// (r.KeyID, r.Key) and is not older than IdempotencyTTL, the error wraps
// errdefs.ErrConflict; an older one is replaced.
func (s *Store) PutIdempotent(ctx context.Context, r Idempotent) error {
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now()
	}
	res, err := s.db.ExecContext(ctx,
		"INSERT INTO idempotency (key_id, key, request_hash, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)"+
			" ON CONFLICT (key_id, key) DO UPDATE SET request_hash = excluded.request_hash, status = excluded.status,"+
			" body = excluded.body, created_at = excluded.created_at WHERE idempotency.created_at < ?",
		r.KeyID, r.Key, nonNil(r.RequestHash), r.Status, nonNil(r.Body), nanos(r.CreatedAt), nanos(now().Add(-IdempotencyTTL)))
	if err != nil {
		return fmt.Errorf("put idempotency key %q: %w", r.Key, classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("put idempotency key %q: %w", r.Key, err)
	}
	if n == 0 {
		return fmt.Errorf("idempotency key %q: an answer is already recorded: %w", r.Key, errdefs.ErrConflict)
	}
	return nil
}

// PurgeIdempotent deletes the answers recorded before the given time and
// returns how many it deleted.
func (s *Store) PurgeIdempotent(ctx context.Context, before time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM idempotency WHERE created_at < ?", nanos(before))
	if err != nil {
		return 0, fmt.Errorf("purge idempotency keys: %w", classify(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge idempotency keys: %w", err)
	}
	return int(n), nil
}
