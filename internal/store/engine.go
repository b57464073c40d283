package store

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// engine is the database a Store runs on. The store's statements are
// written once, in the SQL both engines share, with ? placeholders; what
// differs between the engines is here and in the migrations.
type engine int

const (
	sqliteEngine engine = iota
	postgresEngine
)

func (e engine) String() string {
	if e == postgresEngine {
		return "postgres"
	}
	return "sqlite"
}

// bind rewrites the ? placeholders of query for the engine: PostgreSQL
// numbers them ($1, $2, …). A ? inside a quoted literal or identifier is
// left alone.
func (e engine) bind(query string) string {
	if e != postgresEngine || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	var quote byte // the quote character of the literal being copied, or 0
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// metadataHas is the condition that a sandbox's metadata (a JSON object of
// strings) has the pair of the next two parameters, key then value. Both
// match any key, including ones with dots or quotes that a JSON path would
// have to escape.
func (e engine) metadataHas() string {
	if e == postgresEngine {
		return "sandboxes.metadata::jsonb @> jsonb_build_object(?::text, ?::text)"
	}
	return "EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m WHERE m.key = ? AND m.type = 'text' AND m.value = ?)"
}

// conn runs the store's statements on its engine's database.
//
// A statement outside a transaction that fails on a PostgreSQL connection
// the server had already closed (it restarted, failed over or ended idle
// sessions) runs once more, on another connection: the failure shows that
// it never ran. Without this each pooled connection would fail one call
// after a restart.
type conn struct {
	db  *sql.DB
	eng engine
}

func (c *conn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := checkText(args); err != nil {
		return nil, err
	}
	query = c.eng.bind(query)
	res, err := c.db.ExecContext(ctx, query, args...)
	if err != nil && neverRan(err) && ctx.Err() == nil {
		res, err = c.db.ExecContext(ctx, query, args...)
	}
	return res, err
}

func (c *conn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := checkText(args); err != nil {
		return nil, err
	}
	query = c.eng.bind(query)
	rows, err := c.db.QueryContext(ctx, query, args...)
	if err != nil && neverRan(err) && ctx.Err() == nil {
		rows, err = c.db.QueryContext(ctx, query, args...)
	}
	return rows, err
}

func (c *conn) QueryRowContext(ctx context.Context, query string, args ...any) scanner {
	if err := checkText(args); err != nil {
		return errRow{err}
	}
	query = c.eng.bind(query)
	return retryRow{first: c.db.QueryRowContext(ctx, query, args...), again: func() *sql.Row {
		if ctx.Err() != nil {
			return nil
		}
		return c.db.QueryRowContext(ctx, query, args...)
	}}
}

// checkText refuses a text argument that PostgreSQL cannot hold (a NUL
// byte, invalid UTF-8), on both engines, so that they answer alike: such a
// name or ID is invalid input, never found and never stored.
func checkText(args []any) error {
	for _, a := range args {
		if s, ok := a.(string); ok && (strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s)) {
			return fmt.Errorf("%q holds a NUL byte or invalid UTF-8: %w", truncate(s, 40), errdefs.ErrInvalid)
		}
	}
	return nil
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// errRow is a row whose query was refused before it ran.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// retryRow is a row whose query runs again if its first run never ran.
type retryRow struct {
	first *sql.Row
	again func() *sql.Row
}

func (r retryRow) Scan(dest ...any) error {
	err := r.first.Scan(dest...)
	if err != nil && neverRan(err) {
		if again := r.again(); again != nil {
			return again.Scan(dest...)
		}
	}
	return err
}

// begin starts a transaction. On SQLite it takes the write lock at once
// (the DSN's _txlock=immediate); on PostgreSQL it is READ COMMITTED, and
// statements that must see one another's order take a lock (lockSeq).
func (c *conn) begin(ctx context.Context) (*tx, error) {
	t, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &tx{tx: t, eng: c.eng}, nil
}

// tx is a transaction of a conn.
type tx struct {
	tx     *sql.Tx
	eng    engine
	events int // events written (appendEvent): the Store is told on commit
}

func (t *tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := checkText(args); err != nil {
		return nil, err
	}
	return t.tx.ExecContext(ctx, t.eng.bind(query), args...)
}

func (t *tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := checkText(args); err != nil {
		return nil, err
	}
	return t.tx.QueryContext(ctx, t.eng.bind(query), args...)
}

func (t *tx) QueryRowContext(ctx context.Context, query string, args ...any) scanner {
	if err := checkText(args); err != nil {
		return errRow{err}
	}
	return t.tx.QueryRowContext(ctx, t.eng.bind(query), args...)
}

// lockSeq makes the inserts into table that this transaction makes commit
// in the order of their seq, so that a page cursor (seq > the last seen)
// never skips a row committed later with a smaller seq. SQLite runs one
// writer at a time, so there it holds already; on PostgreSQL two
// transactions may take seqs in one order and commit in the other, so an
// insert first takes a transaction-scoped advisory lock per table, which
// is released only after the commit.
func (t *tx) lockSeq(ctx context.Context, table string) error {
	if t.eng != postgresEngine {
		return nil
	}
	_, err := t.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext(?))", "airlock.seq."+table)
	return err
}

// inSeqOrder runs insert, a single insert into the paged table, so that
// rows commit in the order of their seq (lockSeq): on SQLite as a
// statement of its own, since there is one writer at a time; on PostgreSQL
// in a transaction that takes the lock first. A create of a command is on
// every exec's path, so SQLite does not pay for a transaction it needs not.
func (s *Store) inSeqOrder(ctx context.Context, table string, insert func(q queryer) error) error {
	if s.db.eng != postgresEngine {
		return insert(s.db)
	}
	return s.inTx(ctx, func(t *tx) error {
		if err := t.lockSeq(ctx, table); err != nil {
			return err
		}
		return insert(t)
	})
}

// queryer is what both conn and tx offer for statements.
type queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) scanner
}
