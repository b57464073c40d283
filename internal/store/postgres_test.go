package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestBind(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"SELECT 1", "SELECT 1"},
		{"a = ? AND b IN (?, ?)", "a = $1 AND b IN ($2, $3)"},
		{"x = '?' AND y = ?", "x = '?' AND y = $1"},
		{`"odd?name" = ? AND z = 'it''s ?'`, `"odd?name" = $1 AND z = 'it''s ?'`},
		{"?::text", "$1::text"},
	} {
		if got := postgresEngine.bind(tc.in); got != tc.want {
			t.Errorf("bind(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := sqliteEngine.bind(tc.in); got != tc.in {
			t.Errorf("SQLite bind(%q) = %q, want it unchanged", tc.in, got)
		}
	}
}

// Every migration has SQL for both engines, and the schemas they make have
// the same tables, columns (and whether each may be NULL) and indexes.
func TestPostgresSchemaMatchesSQLite(t *testing.T) {
	for _, m := range migrations {
		if m.sql == "" || m.postgres == "" {
			t.Errorf("migration %d lacks SQL for an engine", m.version)
		}
	}
	ctx := context.Background()
	lite, err := Open(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	pg := postgresBackend.newStore(t)

	describe := func(s *Store, columns, indexes string) []string {
		t.Helper()
		var out []string
		for _, q := range []string{columns, indexes} {
			rows, err := s.db.QueryContext(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var a, b, c string
				if err := rows.Scan(&a, &b, &c); err != nil {
					t.Fatal(err)
				}
				out = append(out, a+" "+b+" "+c)
			}
			rows.Close()
		}
		slices.Sort(out)
		return out
	}
	got := describe(pg,
		"SELECT table_name, column_name, CASE WHEN is_nullable = 'YES' THEN 'null' ELSE 'not null' END"+
			" FROM information_schema.columns WHERE table_schema = 'public' AND table_name != 'airlock_schema'",
		"SELECT tablename, indexname, 'index' FROM pg_indexes WHERE schemaname = 'public'"+
			" AND tablename != 'airlock_schema' AND indexname NOT LIKE '%_pkey' AND indexname NOT LIKE '%_key'")
	want := describe(lite,
		"SELECT m.name, p.name, CASE WHEN p.\"notnull\" OR p.pk THEN 'not null' ELSE 'null' END"+
			" FROM sqlite_schema AS m, pragma_table_info(m.name) AS p WHERE m.type = 'table' AND m.name != 'sqlite_sequence'",
		"SELECT tbl_name, name, 'index' FROM sqlite_schema WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex_%'")
	if !slices.Equal(got, want) {
		t.Errorf("PostgreSQL schema differs from SQLite's:\n got %q\nwant %q", got, want)
	}
}

// Servers that open a new database at once apply each migration once.
func TestPostgresConcurrentOpen(t *testing.T) {
	addr := postgresBackend.newDB(t)
	var wg sync.WaitGroup
	errs := make([]error, racers)
	for i := range racers {
		wg.Go(func() {
			s, err := OpenPostgres(context.Background(), addr)
			if err == nil {
				var v int
				if v, err = s.SchemaVersion(context.Background()); err == nil && v != len(migrations) {
					err = fmt.Errorf("schema version %d, want %d", v, len(migrations))
				}
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("open %d: %v", i, err)
		}
	}
}

// A server that cannot be reached is unavailable (a retry may succeed); a
// wrong password or database is not. No error shows the password.
func TestPostgresOpenErrors(t *testing.T) {
	pg := testenv.SharedPostgres(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	good := pg.URL("postgres")
	for _, tc := range []struct {
		name, addr  string
		unavailable bool
		invalid     bool
	}{
		{"nothing listens", fmt.Sprintf("postgres://airlock:s3cret-pw@127.0.0.1:%d/x?sslmode=disable&connect_timeout=2", closed), true, false},
		{"wrong password", strings.Replace(good, "airlock:", "airlock:s3cret-pw", 1), false, false},
		{"no such database", strings.Replace(good, "/postgres?", "/nope?", 1), false, false},
		{"not a URL of PostgreSQL", "mysql://airlock:s3cret-pw@127.0.0.1/x", false, true},
		{"bad option", "postgres://airlock:s3cret-pw@127.0.0.1/x?sslmode=sometimes", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := OpenPostgres(ctx, tc.addr)
			if err == nil {
				s.Close()
				t.Fatal("opened")
			}
			if got := errors.Is(err, errdefs.ErrUnavailable); got != tc.unavailable {
				t.Errorf("%v: unavailable %v, want %v", err, got, tc.unavailable)
			}
			if got := errors.Is(err, errdefs.ErrInvalid); got != tc.invalid {
				t.Errorf("%v: invalid %v, want %v", err, got, tc.invalid)
			}
			if strings.Contains(err.Error(), "s3cret-pw") || strings.Contains(err.Error(), pgPassword(good)) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// pgPassword returns the password in a URL.
func pgPassword(addr string) string {
	at := strings.Index(addr, "@")
	colon := strings.LastIndex(addr[:at], ":")
	return addr[colon+1 : at]
}

// When the server ends the store's connections (a restart, a failover, an
// administrator), the next calls succeed: a statement that failed because
// its connection was gone runs again on a new one.
func TestPostgresReconnects(t *testing.T) {
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	addr := postgresBackend.newDB(t)
	s, err := OpenPostgres(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustInsertSandbox(t, s, "sbx1", "key1")
	db := addr[strings.LastIndex(addr, "/")+1 : strings.Index(addr, "?")]
	for round := range 3 {
		callsSurvive(t, s, fmt.Sprint("terminated ", round), func() {
			pg.Exec(t, "postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid != pg_backend_pid()", db)
			// The sessions end; their connections stay in the pool.
			testenv.Eventually(t, 10*time.Second, "the store's sessions ended", func() (bool, string) {
				n := pgQuery(t, pg, "SELECT count(*)::text FROM pg_stat_activity WHERE datname = $1", db)
				return n == "0", n + " sessions"
			})
		})
	}
}

// callsSurvive fills s's pool with idle connections, lets drop end their
// sessions, then checks that each kind of statement (a row, rows, an exec)
// on sandbox sbx1 succeeds at once; what names the round in errors.
func callsSurvive(t *testing.T, s *Store, what string, drop func()) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { s.db.ExecContext(ctx, "SELECT pg_sleep(0.05)") })
	}
	wg.Wait()
	drop()
	for i := range 6 {
		var err error
		switch i % 3 {
		case 0:
			_, err = s.GetSandbox(ctx, "sbx1") // QueryRow
		case 1:
			_, err = s.ListSandboxes(ctx, SandboxFilter{Limit: 10}) // Query
		case 2:
			err = s.PutIdempotent(ctx, Idempotent{KeyID: "k", Key: fmt.Sprint(what, i), Status: 200}) // Exec
		}
		if err != nil {
			t.Fatalf("%s, call %d: %v", what, i, err)
		}
	}
}

// Exclusive admits one server per database; the lock goes with its
// connection, and a server whose lock was taken while its connection was
// down is told.
func TestPostgresExclusive(t *testing.T) {
	defer func(d time.Duration) { ExclusiveCheckInterval = d }(ExclusiveCheckInterval)
	ExclusiveCheckInterval = 100 * time.Millisecond
	ctx := context.Background()
	pg := testenv.SharedPostgres(t)
	addr := postgresBackend.newDB(t)
	open := func() *Store {
		s, err := OpenPostgres(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	lostc := make(chan error, 2)
	lost := func(err error) { lostc <- err }

	a, b := open(), open()
	defer b.Close()
	if err := a.Exclusive(ctx, lost); err != nil {
		t.Fatal(err)
	}
	err := b.Exclusive(ctx, lost)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "in use by another airlock serve") {
		t.Fatalf("second server: %v, want a conflict that says why", err)
	}
	// The lock survives a dropped connection: a's check takes it again,
	// on a new session.
	holder := func() string {
		return pgQuery(t, pg, "SELECT coalesce(string_agg(pid::text, ','), '') FROM pg_locks WHERE locktype = 'advisory' AND granted")
	}
	was := holder()
	pg.Exec(t, "postgres", "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
	testenv.Eventually(t, 10*time.Second, "a taking the lock again", func() (bool, string) {
		h := holder()
		return h != "" && h != was, fmt.Sprintf("held by session %q, before by %q", h, was)
	})
	if err := b.Exclusive(ctx, lost); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("after a's connection was dropped: %v, want a to hold the lock again", err)
	}
	// Closing a frees it for b.
	a.Close()
	if err := b.Exclusive(ctx, lost); err != nil {
		t.Fatalf("after a closed: %v", err)
	}

	// c takes the lock while b's connection is down: b is told.
	c := open()
	defer c.Close()
	var taken error
	for range 50 {
		pg.Exec(t, "postgres", "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
		if taken = c.Exclusive(ctx, func(error) {}); taken == nil {
			break
		}
		c.Close()
		c = open()
	}
	if taken != nil {
		t.Fatalf("c never got the lock: %v", taken)
	}
	select {
	case err := <-lostc:
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("lost: %v, want a conflict", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b was not told that it lost the lock")
	}
}

// On SQLite, Exclusive does nothing: the file is in the server's data
// directory.
func TestSQLiteExclusive(t *testing.T) {
	s := sqliteBackend.newStore(t)
	if err := s.Exclusive(context.Background(), func(error) { t.Error("lost") }); err != nil {
		t.Fatal(err)
	}
	if s.Engine() != "sqlite" {
		t.Errorf("Engine() = %q", s.Engine())
	}
}

// While the PostgreSQL server is down, calls fail as unavailable, at once;
// when it is back, they succeed again on the same Store.
func TestPostgresServerDown(t *testing.T) {
	ctx := context.Background()
	pg, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	s, err := OpenPostgres(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustInsertSandbox(t, s, "sbx1", "key1")

	// A restart between calls costs none of them, however many pooled
	// connections it ended.
	for round := range 2 {
		callsSurvive(t, s, fmt.Sprint("restarted ", round), func() {
			pg.Down()
			if err := pg.Up(); err != nil {
				t.Fatal(err)
			}
		})
	}

	pg.Down()
	start := time.Now()
	for range 3 {
		if _, err := s.GetSandbox(ctx, "sbx1"); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("with the server down: %v, want unavailable", err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("three calls with the server down took %s", d)
	}
	if err := pg.Up(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(ctx, "sbx1"); err != nil {
		t.Fatalf("with the server back: %v", err)
	}
}

// PostgreSQL's migrations apply one by one to a database that holds rows
// of the shape before each: the columns they add get their defaults.
func TestPostgresMigrationsStepwise(t *testing.T) {
	ctx := context.Background()
	addr := postgresBackend.newDB(t)
	s, err := OpenPostgres(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Start again from nothing, in the same database.
	if _, err := s.db.db.ExecContext(ctx, "DROP SCHEMA public CASCADE; CREATE SCHEMA public"); err != nil {
		t.Fatal(err)
	}
	before := map[int]string{
		4: "INSERT INTO keys (id, name, role, hash, created_at) VALUES ('key1', 'k', 'admin', '\\x01', 1)",
		7: "INSERT INTO sandboxes (id, owner, state, template_ref, template_digest, vcpus, memory_mib, disk_mib," +
			" timeout_s, on_timeout, env, metadata, created_at, updated_at)" +
			" VALUES ('sbx1', 'key1', 'running', 'base', 'sha256:a', 1, 512, 2048, 0, 'delete', '{}', '{}', 1, 1)",
	}
	for _, m := range migrations {
		if q, ok := before[m.version]; ok {
			if _, err := s.db.db.ExecContext(ctx, q); err != nil {
				t.Fatalf("before migration %d: %v", m.version, err)
			}
		}
		if err := migrate(ctx, s.db, m.version); err != nil {
			t.Fatalf("migration %d: %v", m.version, err)
		}
		if v, err := s.SchemaVersion(ctx); err != nil || v != m.version {
			t.Fatalf("version %d, %v after migration %d", v, err, m.version)
		}
	}
	if k, err := s.GetKey(ctx, "key1"); err != nil || k.Format != "airlock" {
		t.Errorf("the key from before migration 4: %+v, %v", k, err)
	}
	if id, err := s.operationInFlight(ctx, "sbx1"); err != nil || id != "" {
		t.Errorf("the sandbox from before migration 7: in flight %q, %v", id, err)
	}
}

// pgQuery runs a query that answers one text value as pg's superuser in
// its postgres database.
func pgQuery(t *testing.T, pg *testenv.Postgres, query string, args ...any) string {
	t.Helper()
	db, err := sql.Open("pgx", pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v string
	if err := db.QueryRow(query, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v
}
