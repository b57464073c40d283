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

// IdempotencyPendingTTL is how long a claim (ClaimIdempotent) whose answer
// was never recorded holds its key: after that its server is taken to have
// died with the call, and another may claim the key.
const IdempotencyPendingTTL = 10 * time.Minute

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
	// Status is the HTTP status of the answer; 0 while the call is under
	// way (a claim) and its answer not recorded yet.
	Status int
	// Body is the body of the answer.
	Body []byte
	// CreatedAt is when the answer was given; the zero time means now.
	CreatedAt time.Time
}

// Pending reports that r is a claim: its call is under way and has no answer yet.
func (r Idempotent) Pending() bool { return r.Status == 0 }

// ClaimIdempotent reserves (keyID, key) for the call whose fingerprint is
// hash, before it runs, so that of the processes that get the same call at
// once exactly one runs it. claimed tells that this caller got the key: it
// runs the call, then records the answer with PutIdempotent or gives the
// key up with ReleaseIdempotent. Otherwise the record returned is the
// answer to replay or, if Pending, a call under way elsewhere. A record
// older than IdempotencyTTL, or a claim older than IdempotencyPendingTTL,
// is replaced.
func (s *Store) ClaimIdempotent(ctx context.Context, keyID, key string, hash []byte) (rec Idempotent, claimed bool, err error) {
	// A record found by the insert may be released before it is read; then
	// claim again. Two rounds settle it unless the key churns.
	for range 3 {
		t := now()
		res, err := s.db.ExecContext(ctx,
			"INSERT INTO idempotency (key_id, key, request_hash, status, body, created_at) VALUES (?, ?, ?, 0, ?, ?)"+
				" ON CONFLICT (key_id, key) DO UPDATE SET request_hash = excluded.request_hash, status = 0,"+
				" body = excluded.body, created_at = excluded.created_at"+
				" WHERE idempotency.created_at < ? OR (idempotency.status = 0 AND idempotency.created_at < ?)",
			keyID, key, nonNil(hash), []byte{}, nanos(t), nanos(t.Add(-IdempotencyTTL)), nanos(t.Add(-IdempotencyPendingTTL)))
		if err != nil {
			return Idempotent{}, false, fmt.Errorf("claim idempotency key %q: %w", key, classify(err))
		}
		if n, err := res.RowsAffected(); err != nil {
			return Idempotent{}, false, fmt.Errorf("claim idempotency key %q: %w", key, err)
		} else if n == 1 {
			return Idempotent{KeyID: keyID, Key: key, RequestHash: nonNil(hash), CreatedAt: t}, true, nil
		}
		rec, err = s.GetIdempotent(ctx, keyID, key)
		if !errors.Is(err, errdefs.ErrNotFound) {
			return rec, false, err
		}
	}
	return Idempotent{}, false, fmt.Errorf("claim idempotency key %q: it keeps being claimed and released: %w", key, errdefs.ErrUnavailable)
}

// ReleaseIdempotent gives up the claim on (keyID, key) made for the call
// whose fingerprint is hash, so that a retry runs the call again. It does
// nothing if the key holds a recorded answer or another call's claim.
func (s *Store) ReleaseIdempotent(ctx context.Context, keyID, key string, hash []byte) error {
	_, err := s.db.ExecContext(ctx, "DELETE FROM idempotency WHERE key_id = ? AND key = ? AND status = 0 AND request_hash = ?",
		keyID, key, nonNil(hash))
	if err != nil {
		return fmt.Errorf("release idempotency key %q: %w", key, classify(err))
	}
	return nil
}

// ReleaseAllClaims gives up every claim (ClaimIdempotent) and returns how
// many there were. Only a server that knows no other uses the store may
// call it, at start: its claims are those of requests that died with the
// server before, whose retries would otherwise wait for
// IdempotencyPendingTTL.
func (s *Store) ReleaseAllClaims(ctx context.Context) (int, error) {
	res, err := s.db.ExecContext(ctx, "DELETE FROM idempotency WHERE status = 0")
	if err != nil {
		return 0, fmt.Errorf("release idempotency claims: %w", classify(err))
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// GetIdempotent returns the answer recorded for (keyID, key), or the claim
// of a call under way (Pending). One older than IdempotencyTTL is treated
// as absent.
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

// PutIdempotent records r, the answer to a call. If the key holds the
// claim of this call (the same RequestHash), the claim becomes the answer.
// Otherwise the first answer wins: if one is recorded for (r.KeyID, r.Key)
// and is not older than IdempotencyTTL, or another call claims the key, the
// error wraps errdefs.ErrConflict; an older one is replaced. r.Status must
// not be 0.
func (s *Store) PutIdempotent(ctx context.Context, r Idempotent) error {
	if r.Status == 0 {
		return fmt.Errorf("put idempotency key %q: status 0 is a claim, not an answer: %w", r.Key, errdefs.ErrInvalid)
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now()
	}
	res, err := s.db.ExecContext(ctx, "UPDATE idempotency SET status = ?, body = ?, created_at = ?"+
		" WHERE key_id = ? AND key = ? AND status = 0 AND request_hash = ?",
		r.Status, nonNil(r.Body), nanos(r.CreatedAt), r.KeyID, r.Key, nonNil(r.RequestHash))
	if err != nil {
		return fmt.Errorf("put idempotency key %q: %w", r.Key, classify(err))
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("put idempotency key %q: %w", r.Key, err)
	} else if n == 1 {
		return nil
	}
	res, err = s.db.ExecContext(ctx,
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
