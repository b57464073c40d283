// Package store keeps the desired state of airlock serve: API keys,
// sandboxes, operations, commands, secrets, builds and idempotent replies.
// It runs on one of two engines behind the same methods: a SQLite file in
// the data directory (Open, the default), or a PostgreSQL database
// (OpenPostgres), which several processes can share. The schema grows
// through numbered migrations, written for each engine, that opening
// applies; the conformance suite (conformance_test.go) runs the same tests
// on both.
//
// Lookups of a missing record return an error wrapping errdefs.ErrNotFound;
// inserting a record whose identity is taken returns one wrapping
// errdefs.ErrConflict; malformed input (an empty ID, invalid JSON, a bad page
// cursor) returns one wrapping errdefs.ErrInvalid.
//
// Times are stored as unix nanoseconds, so they must lie between the years
// 1678 and 2262; the zero time.Time is stored as 0 and read back as the zero
// time. Times are returned in UTC.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Store is the database of airlock serve. It is safe for concurrent use.
//
// On SQLite it holds a single connection: every statement and transaction of this
// process runs one after another. SQLite admits one writer at a time anyway,
// the statements here take microseconds, and one connection means no
// transaction of this process ever waits on a lock another of its own holds,
// so "database is locked" cannot arise from within the process. busy_timeout
// (5 s) covers another process that opens the same file, such as a CLI
// command reading it. Transactions begin IMMEDIATE, taking the write lock at
// once, so they never fail half-way on a lock upgrade.
//
// On PostgreSQL it holds a pool of connections (postgres.go).
type Store struct {
	db *conn
	// exclusive is the connection that holds the session lock of Exclusive,
	// nil until it is taken (PostgreSQL only).
	exclusive *exclusiveLock

	evMu sync.Mutex
	evCh chan struct{} // closed when events commit (EventsWritten); nil if no one waits
}

// Open opens the database at path, creating it with mode 0600 (and its
// directory with mode 0700) if missing, and applies the migrations it lacks.
// A database written by a newer airlock is refused with an error wrapping
// errdefs.ErrPrecondition.
func Open(path string) (*Store, error) {
	ctx := context.Background()
	db, err := openDB(path)
	if err != nil {
		return nil, err
	}
	c := &conn{db: db, eng: sqliteEngine}
	if err := migrate(ctx, c, len(migrations)); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return &Store{db: c}, nil
}

// openDB opens the database file with the connection settings of the store
// but applies no migration.
func openDB(path string) (*sql.DB, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("open store %q: the path must be non-empty and contain no '?': %w", path, errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// SQLite would create the file with mode 0644; create it first so that it
	// is 0600. SQLite gives the -wal and -shm files the mode of the database.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	f.Close()

	// The pragmas go in the DSN so that they hold on every connection the
	// pool opens, including one that replaces a broken connection.
	dsn := path + "?_txlock=immediate" +
		"&_pragma=busy_timeout(5000)" +
		"&_pragma=journal_mode(WAL)" +
		"&_pragma=foreign_keys(1)" +
		"&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return db, nil
}

// Close closes the database, and releases Exclusive's lock. Calls that are
// under way finish first.
func (s *Store) Close() error {
	if s.exclusive != nil {
		s.exclusive.release()
	}
	return s.db.db.Close()
}

// Engine names the database the store runs on: "sqlite" or "postgres".
func (s *Store) Engine() string {
	return s.db.eng.String()
}

// SchemaVersion returns the number of the last migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	return schemaVersion(ctx, s.db, s.db.eng)
}

// scanner is what both *sql.Row and *sql.Rows offer for reading a row.
type scanner interface {
	Scan(dest ...any) error
}

// getByID reads the row of table whose id is id with scan; kind names the
// thing in errors, and a missing row is errdefs.ErrNotFound.
func getByID[T any](ctx context.Context, db queryer, kind, table, columns, id string, scan func(scanner) (T, error)) (T, error) {
	v, err := scan(db.QueryRowContext(ctx, "SELECT "+columns+" FROM "+table+" WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%s %s: %w", kind, id, errdefs.ErrNotFound)
	}
	if err != nil {
		return v, fmt.Errorf("get %s %s: %w", kind, id, classify(err))
	}
	return v, nil
}

// inTx runs fn in a transaction and commits it if fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(t *tx) error) error {
	t, err := s.db.begin(ctx)
	if err != nil {
		return classify(err)
	}
	if err := fn(t); err != nil {
		t.tx.Rollback()
		return err
	}
	if err := t.tx.Commit(); err != nil {
		return classify(err)
	}
	if t.events > 0 {
		s.eventsCommitted()
	}
	return nil
}

// sqliteCode returns the extended SQLite result code of err, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()
	}
	return 0
}

// isUniqueViolation reports whether err is a primary key or unique
// constraint failure.
func isUniqueViolation(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || c == sqlite3.SQLITE_CONSTRAINT_UNIQUE ||
		pgCode(err) == pgUniqueViolation
}

// isUniqueViolationOf reports whether err is a unique constraint failure
// on column of table (whose unique index is named table_column).
func isUniqueViolationOf(err error, table, column string) bool {
	if !isUniqueViolation(err) {
		return false
	}
	if pe := pgError(err); pe != nil {
		return pe.ConstraintName == table+"_"+column
	}
	return strings.Contains(err.Error(), table+"."+column)
}

// isForeignKeyViolation reports whether err is a foreign key constraint failure.
func isForeignKeyViolation(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY || pgCode(err) == pgForeignKeyViolation
}

// classify marks an error of the engine that may go away on retry as
// errdefs.ErrUnavailable (SQLite: the database locked by another process
// beyond busy_timeout; PostgreSQL: a connection that failed or closed, a
// server shutting down, a serialization failure), a value PostgreSQL
// cannot hold (a NUL byte or invalid UTF-8 in text) as errdefs.ErrInvalid,
// and returns other errors unchanged.
func classify(err error) error {
	if err == nil || errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrInvalid) {
		return err
	}
	if c := sqliteCode(err); c&0xff == sqlite3.SQLITE_BUSY || c&0xff == sqlite3.SQLITE_LOCKED {
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	switch {
	case pgTransient(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	case pgBadValue(err):
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalid)
	}
	return err
}

// mustAffect turns an update or delete that touched no row into a not-found
// error for the record of the given kind and ID.
func mustAffect(res sql.Result, kind, id string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, id, err)
	}
	if n == 0 {
		return fmt.Errorf("%s %s: %w", kind, id, errdefs.ErrNotFound)
	}
	return nil
}

// nanos converts t to the stored form: unix nanoseconds, 0 for the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromNanos converts the stored form back to a UTC time.
func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// nullNanos converts an optional time to the stored form, NULL for nil.
func nullNanos(t *time.Time) any {
	if t == nil {
		return nil
	}
	return nanos(*t)
}

// fromNullNanos converts a stored optional time back, nil for NULL.
func fromNullNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNanos(n.Int64)
	return &t
}

// now returns the current time as the store records it.
func now() time.Time {
	return time.Now().UTC()
}

// rawJSON converts a JSON field to its stored form: NULL when empty,
// else the text after checking that it is valid JSON.
func rawJSON(field string, v json.RawMessage) (any, error) {
	if len(v) == 0 {
		return nil, nil
	}
	if !json.Valid(v) {
		return nil, fmt.Errorf("%s is not valid JSON: %w", field, errdefs.ErrInvalid)
	}
	return string(v), nil
}

// fromRawJSON converts a stored JSON field back, nil for NULL.
func fromRawJSON(v sql.NullString) json.RawMessage {
	if !v.Valid {
		return nil
	}
	return json.RawMessage(v.String)
}

// stringMap converts a map to its stored form, a JSON object ("{}" for nil).
func stringMap(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// fromStringMap converts a stored JSON object back to a non-nil map.
func fromStringMap(field, v string) (map[string]string, error) {
	m := map[string]string{}
	if err := json.Unmarshal([]byte(v), &m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", field, err)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// errorJSON converts an optional Error to its stored form, NULL for nil.
func errorJSON(e *Error) (any, error) {
	if e == nil {
		return nil, nil
	}
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	return string(b), nil
}

// fromErrorJSON converts a stored Error back, nil for NULL.
func fromErrorJSON(field string, v sql.NullString) (*Error, error) {
	if !v.Valid {
		return nil, nil
	}
	var e Error
	if err := json.Unmarshal([]byte(v.String), &e); err != nil {
		return nil, fmt.Errorf("decode %s: %w", field, err)
	}
	return &e, nil
}

// requireID returns an ErrInvalid error when id is empty.
func requireID(what, id string) error {
	if id == "" {
		return fmt.Errorf("%s: empty ID: %w", what, errdefs.ErrInvalid)
	}
	return nil
}

// nonNil returns b, or an empty slice for nil: SQLite reads an empty BLOB
// back as nil, and a NOT NULL column needs a non-nil value to bind.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// boolInt is b as stored: 1 or 0 in an integer column.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// placeholders returns "?, ?, ?" for n parameters.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// Error is a failure recorded on an operation or a sandbox, as the API shows it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorOf is how err is recorded: the API code of its class and its
// full text.
func ErrorOf(err error) Error {
	return Error{Code: errdefs.ClassOf(err).Code, Message: err.Error()}
}
