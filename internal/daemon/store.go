package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// OpenStore opens a server's store: the SQLite file of the data
// directory, path, when addr is "", else the PostgreSQL database addr
// names. A PostgreSQL server that cannot be reached is tried again,
// backing off, for up to wait, each failure logged; what retrying cannot
// mend (a wrong password, no such database, a bad URL) fails at once.
func OpenStore(ctx context.Context, path, addr string, wait time.Duration, log *slog.Logger) (*store.Store, error) {
	if addr == "" {
		return store.Open(path)
	}
	if !store.IsPostgresURL(addr) {
		return nil, fmt.Errorf("--store %s: want a postgres:// or postgresql:// URL, or none for the SQLite file in the data directory: %w",
			store.RedactURL(addr), errdefs.ErrInvalid)
	}
	deadline := time.Now().Add(wait)
	for backoff := 250 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := store.OpenPostgres(actx, addr)
		cancel()
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, errdefs.ErrUnavailable) || ctx.Err() != nil {
			return nil, err
		}
		if time.Now().Add(backoff).After(deadline) {
			return nil, fmt.Errorf("%w: gave up after %s (--store-wait): check --store or AIRLOCK_STORE, and that PostgreSQL is running and reachable",
				err, wait)
		}
		log.Warn("store unreachable; trying again", "store", store.RedactURL(addr), "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// purgeIdempotent drops remembered answers older than a day, hourly,
// until ctx ends.
func purgeIdempotent(ctx context.Context, st *store.Store, log *slog.Logger) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if _, err := st.PurgeIdempotent(ctx, time.Now().Add(-24*time.Hour)); err != nil && ctx.Err() == nil {
			log.Warn("purge idempotency keys", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
