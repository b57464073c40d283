package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// PostgreSQL error codes the store tells apart
// (https://www.postgresql.org/docs/current/errcodes-appendix.html).
const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
)

// IsPostgresURL reports whether a store address names a PostgreSQL database
// (postgres:// or postgresql://) rather than a SQLite file.
func IsPostgresURL(addr string) bool {
	return strings.HasPrefix(addr, "postgres://") || strings.HasPrefix(addr, "postgresql://")
}

// RedactURL returns addr with any password replaced by "xxxxx", for errors
// and logs.
func RedactURL(addr string) string {
	u, err := url.Parse(addr)
	if err != nil {
		return "(an address that does not parse)"
	}
	return u.Redacted()
}

// OpenPostgres opens the PostgreSQL database at addr (a postgres:// URL;
// libpq's PG* environment variables and password file fill in what it
// leaves out) and applies the migrations it lacks. Several processes may
// open the same database at once: each migration runs under an advisory
// lock, so it is applied once. It makes one attempt to reach the server:
// an error that wraps errdefs.ErrUnavailable says the server could not be
// reached, and a retry may succeed. Errors never show the password.
func OpenPostgres(ctx context.Context, addr string) (*Store, error) {
	name := RedactURL(addr)
	if !IsPostgresURL(addr) {
		return nil, fmt.Errorf("open store %s: want a postgres:// or postgresql:// URL: %w", name, errdefs.ErrInvalid)
	}
	cfg, err := pgx.ParseConfig(addr)
	if err != nil {
		// pgx's parse errors quote the address with the password masked.
		return nil, fmt.Errorf("open store %s: %v: %w", name, err, errdefs.ErrInvalid)
	}
	// A connection idle for a while is pinged before reuse (pgx's default
	// waits a second), so that after PostgreSQL restarts or fails over the
	// pool drops its dead connections instead of failing a call on each.
	db := stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(_ context.Context, p stdlib.ShouldPingParams) bool {
		return p.IdleDuration > 250*time.Millisecond
	}))
	// A replica's API calls run a few statements each; more connections
	// than this only queue inside PostgreSQL.
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", name, classifyConnect(err))
	}
	c := &conn{db: db, eng: postgresEngine}
	if err := migrate(ctx, c, len(migrations)); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", name, err)
	}
	return &Store{db: c}, nil
}

// classifyConnect is classify for the first contact with the server: a
// refused or timed-out connection is unavailable; a refused password or an
// unknown database is not, since retrying will not mend it.
func classifyConnect(err error) error {
	if pe := pgError(err); pe != nil {
		// 28xxx: authentication; 3D000: no such database.
		return fmt.Errorf("%s (%s): %w", pe.Message, pe.Code, classify(err))
	}
	return classify(err)
}

// pgError returns the PostgreSQL server error in err's chain, or nil.
func pgError(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// pgCode returns the SQLSTATE of the PostgreSQL error in err, or "".
func pgCode(err error) string {
	if pe := pgError(err); pe != nil {
		return pe.Code
	}
	return ""
}

// pgTransient reports whether err may go away on retry: no connection to
// the server, a connection lost, the server shutting down or out of
// connections, or a serialization failure or deadlock.
func pgTransient(err error) bool {
	if code := pgCode(err); code != "" {
		switch {
		case strings.HasPrefix(code, "08"), // connection exception
			strings.HasPrefix(code, "53"),    // insufficient resources
			code == "40001", code == "40P01", // serialization failure, deadlock
			code == "57P01", code == "57P02", code == "57P03": // shutting down, cannot connect now
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}

// neverRan reports whether err shows that a statement was not run by the
// server: pgx did not send it, or the server had ended the session (shut
// down, restarted, terminated it) before it. SQLite errors never match.
func neverRan(err error) bool {
	switch pgCode(err) {
	case "57P01", "57P02", "57P03": // admin shutdown, crash shutdown, cannot connect now
		return true
	}
	return pgconn.SafeToRetry(err)
}

// pgBadValue reports whether err is PostgreSQL refusing a value that SQLite
// would store: a NUL byte or invalid UTF-8 in text.
func pgBadValue(err error) bool {
	switch pgCode(err) {
	case "22021", "22P05": // character_not_in_repertoire, untranslatable_character
		return true
	}
	return false
}

// exclusiveKey is the advisory lock Exclusive takes.
const exclusiveKey = "airlock.serve"

// exclusiveLock is the connection that holds Exclusive's session lock.
// Only keepExclusive touches conn until done closes; then release does.
type exclusiveLock struct {
	conn *sql.Conn // nil while the lock is lost to a broken connection
	// every is ExclusiveCheckInterval when the lock was taken, read once
	// so that a later change (a test's) does not race the checks.
	every time.Duration
	stop  chan struct{}
	done  chan struct{}
}

// release lets go of the lock at once (the server would only notice a
// closed connection a moment later) and ends its session.
func (l *exclusiveLock) release() {
	close(l.stop)
	<-l.done
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.conn.ExecContext(ctx, "SELECT pg_advisory_unlock(hashtext($1))", exclusiveKey)
		cancel()
		discard(l.conn)
		l.conn = nil
	}
}

// discard closes c's connection instead of giving it back to the pool, so
// that its session, and any session lock it holds, ends.
func discard(c *sql.Conn) {
	c.Raw(func(any) error { return driver.ErrBadConn })
	c.Close()
}

// ExclusiveCheckInterval is how often Exclusive checks that its lock is held.
var ExclusiveCheckInterval = 5 * time.Second

// Exclusive makes this process the only airlock serve on the store, for
// as long as the store is open. One server on one host runs the sandboxes
// its store records: a second one on the same database would take them for
// its own and fail them. On SQLite the database lives in the data
// directory, which belongs to one server, and Exclusive does nothing.
//
// On PostgreSQL it takes a session advisory lock, which the server drops
// when the holder's connection ends, so a killed server does not hold it.
// If another holds it, the error wraps errdefs.ErrConflict. While the
// store is open it checks the lock every ExclusiveCheckInterval: a
// connection that broke is replaced and the lock taken again, and if
// another process took it meanwhile, lost is called once with the reason
// (the caller should stop serving).
func (s *Store) Exclusive(ctx context.Context, lost func(error)) error {
	if s.db.eng != postgresEngine {
		return nil
	}
	if s.exclusive != nil {
		return fmt.Errorf("store: Exclusive called twice: %w", errdefs.ErrPrecondition)
	}
	c, err := s.takeExclusive(ctx)
	if err != nil {
		return err
	}
	l := &exclusiveLock{conn: c, every: ExclusiveCheckInterval, stop: make(chan struct{}), done: make(chan struct{})}
	s.exclusive = l
	go s.keepExclusive(l, lost)
	return nil
}

// takeExclusive takes the lock on a connection of its own and returns it.
func (s *Store) takeExclusive(ctx context.Context) (*sql.Conn, error) {
	c, err := s.db.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock store: %w", classify(err))
	}
	var got bool
	if err := c.QueryRowContext(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", exclusiveKey).Scan(&got); err != nil {
		c.Close()
		return nil, fmt.Errorf("lock store: %w", classify(err))
	}
	if !got {
		c.Close()
		return nil, fmt.Errorf("the store is in use by another airlock serve (it holds PostgreSQL advisory lock %q): "+
			"stop that server first, or give this one a database of its own: %w", exclusiveKey, errdefs.ErrConflict)
	}
	return c, nil
}

// keepExclusive checks l's connection until the store closes. When it
// broke, the lock is taken again on a new connection; while the server
// cannot be reached, on each tick until it can.
func (s *Store) keepExclusive(l *exclusiveLock, lost func(error)) {
	defer close(l.done)
	t := time.NewTicker(l.every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.every)
		err := l.check(ctx, s)
		cancel()
		if err != nil {
			lost(err)
			return
		}
	}
}

// check pings l's connection, and if it broke takes the lock again. It
// returns an error only when another process holds the lock now.
func (l *exclusiveLock) check(ctx context.Context, s *Store) error {
	if l.conn != nil && l.conn.PingContext(ctx) == nil {
		return nil
	}
	if l.conn != nil {
		discard(l.conn)
		l.conn = nil
	}
	c, err := s.takeExclusive(ctx)
	switch {
	case err == nil:
		l.conn = c
	case errors.Is(err, errdefs.ErrConflict):
		return fmt.Errorf("lost the store's lock while its connection was down: %w", err)
	}
	return nil // the server cannot be reached: try again on the next tick
}
