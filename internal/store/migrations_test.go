package store

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/airlockhq/airlock/internal/timings"
)

// migrationTest checks one migration.
type migrationTest struct {
	version int
	before  func(t *testing.T, db *sql.DB) // optional
	after   func(t *testing.T, db *sql.DB)
}

// migrationTests holds one case per migration. Each runs on a database
// migrated to version-1: before fills it with rows in the old shape, the
// migration is applied, and after checks the rows and constraints of the new
// shape. Adding a migration means adding its case here.
var migrationTests = []migrationTest{
	{version: 1, after: checkSchema1},
	{version: 2, before: fillSchema1, after: checkSchema2},
	{version: 3, before: fillSchema1, after: checkSchema3},
	{version: 4, before: fillKeys3, after: checkSchema4},
	{version: 5, before: fillKeys3, after: checkSchema5},
	{version: 6, before: fillOperations5, after: checkSchema6},
	{version: 7, before: fillSchema1, after: checkSchema7},
	{version: 8, before: fillSchema1, after: checkSchema8},
	{version: 9, before: fillSchema1, after: checkSchema9},
	{version: 10, before: fillBuilds9, after: checkSchema10},
	{version: 11, before: fillKeys3, after: checkSchema11},
	{version: 12, before: fillKeys3, after: checkSchema12},
	{version: 13, before: fillSchema1, after: checkSchema13},
	{version: 14, before: fillSchema1, after: checkSchema14},
	{version: 15, before: fillSchema1, after: checkSchema15},
	{version: 16, before: fillSchema1, after: checkSchema16},
}

// fillBuilds9 stores a build as servers before migration 10 did.
func fillBuilds9(t *testing.T, db *sql.DB) {
	if _, err := db.Exec("INSERT INTO builds (id, owner, name, tag, status, digest, created_at) VALUES ('bld1', 'key1', 'web', 'v1', 'ready', 'sha256:aa', 1)"); err != nil {
		t.Fatal(err)
	}
}

// checkSchema10: a build from before ran on no node, the catalogue is
// empty, and a tag can be written.
func checkSchema10(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	if b, err := s.GetBuild(ctx, "bld1"); err != nil || b.Node != "" || b.Digest != "sha256:aa" {
		t.Fatalf("build after migration 10: %+v, %v", b, err)
	}
	if tags, err := s.ListTemplateTags(ctx); err != nil || len(tags) != 0 {
		t.Fatalf("catalogue after migration 10: %v, %v; want empty", tags, err)
	}
	if err := s.PutTemplateTag(ctx, TemplateTag{Name: "web", Tag: "v1", Digest: "sha256:aa", Settings: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutBuildContextNode(ctx, "ctx1", "host-a"); err != nil {
		t.Fatal(err)
	}
}

// checkSchema9: a store from before has no settings, and one can be set.
// checkSchema11: keys from before have no limits of their own, and limits
// can be set.
func checkSchema11(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	k, err := s.GetKey(ctx, "key1")
	if err != nil || k.Limits != nil {
		t.Fatalf("limits after migration 11: %s, %v", k.Limits, err)
	}
	if err := s.SetKeyLimits(ctx, "key1", []byte(`{"sandboxes":1}`)); err != nil {
		t.Fatal(err)
	}
	// (KeyUsage reads tables of later migrations: it runs on the whole
	// schema only.)
	if k, err := s.GetKey(ctx, "key1"); err != nil || string(k.Limits) != `{"sandboxes":1}` {
		t.Fatalf("limits set after migration 11: %s, %v", k.Limits, err)
	}
}

// checkSchema12: no node is registered, and one can be.
func checkSchema12(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	if got, err := s.ClusterNodes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("nodes after migration 12: %v, %v", got, err)
	}
	if err := s.RegisterClusterNode(ctx, "host-a", "http://10.0.0.5:7701"); err != nil {
		t.Fatal(err)
	}
}

// checkSchema15: there are no checkpoints, and one can be stored.
func checkSchema15(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	if got, err := s.ListCheckpoints(ctx, CheckpointFilter{Limit: 10}); err != nil || len(got) != 0 {
		t.Fatalf("checkpoints after migration 15: %v, %v", got, err)
	}
	if err := s.InsertCheckpoint(ctx, Checkpoint{ID: "chk1", Owner: "key1", SandboxID: "sbx0", State: "creating"}, nil); err != nil {
		t.Fatal(err)
	}
}

// addLaterSandboxColumns gives a schema from before migration 16 the
// columns of sandboxes that migration added, which the store's code of
// today reads and writes, so that a check of an earlier migration can use
// that code.
func addLaterSandboxColumns(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"ALTER TABLE sandboxes ADD COLUMN idle_s INTEGER NOT NULL DEFAULT 0",
		"ALTER TABLE sandboxes ADD COLUMN on_idle TEXT NOT NULL DEFAULT ''",
		"ALTER TABLE sandboxes ADD COLUMN wake_on_request INTEGER NOT NULL DEFAULT 0",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// checkSchema16: sandboxes from before never go idle, and idleness can
// be recorded.
func checkSchema16(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	sb, err := s.GetSandbox(ctx, "sbx1")
	if err != nil || sb.IdleS != 0 || sb.OnIdle != "" || sb.WakeOnRequest {
		t.Fatalf("sandbox after migration 16: idle_s %d, on_idle %q, wake on request %v, %v; want 0, none, false", sb.IdleS, sb.OnIdle, sb.WakeOnRequest, err)
	}
	sb.IdleS, sb.OnIdle, sb.WakeOnRequest = 60, "pause", true
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if sb, err := s.GetSandbox(ctx, "sbx1"); err != nil || sb.IdleS != 60 || sb.OnIdle != "pause" || !sb.WakeOnRequest {
		t.Fatalf("idleness recorded after migration 16: %d %q, %v", sb.IdleS, sb.OnIdle, err)
	}
}

// checkSchema14: there are no webhooks, and one can be stored.
func checkSchema14(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	if got, err := s.ListWebhooks(ctx, "", 10); err != nil || len(got) != 0 {
		t.Fatalf("webhooks after migration 14: %v, %v", got, err)
	}
	if err := s.InsertWebhook(ctx, Webhook{ID: "whk1", Owner: "key1", URL: "https://example.com/"}); err != nil {
		t.Fatal(err)
	}
}

// checkSchema13: sandboxes from before have no events (none is made up),
// and the next change of state records one.
func checkSchema13(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	if got, err := s.ListEvents(ctx, EventFilter{Limit: 10}); err != nil || len(got) != 0 {
		t.Fatalf("events after migration 13: %v, %v", got, err)
	}
	addLaterSandboxColumns(t, db)
	sb, err := s.GetSandbox(ctx, "sbx0")
	if err != nil {
		t.Fatal(err)
	}
	sb.State = "paused"
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ListEvents(ctx, EventFilter{Limit: 10}); err != nil || len(got) != 1 || got[0].Type != "sandbox.paused" || got[0].Owner != "key1" {
		t.Fatalf("events after a pause: %+v, %v", got, err)
	}
}

func checkSchema9(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	if got, err := s.EnsureSetting(context.Background(), "k", "v"); err != nil || got != "v" {
		t.Errorf("setting after migration 9: %q, %v", got, err)
	}
}

// checkSchema8: sandboxes from before are bound to no node, and one can
// be recorded.
func checkSchema8(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	ctx := context.Background()
	nodes, err := s.SandboxNodes(ctx)
	if err != nil || len(nodes) != 0 {
		t.Fatalf("nodes after migration 8: %v, %v; want none", nodes, err)
	}
	if err := s.SetSandboxNode(ctx, "sbx1", "host-a"); err != nil {
		t.Fatal(err)
	}
	if nodes, err := s.SandboxNodes(ctx); err != nil || nodes["sbx1"] != "host-a" || len(nodes) != 1 {
		t.Errorf("nodes %v, %v; want sbx1 on host-a", nodes, err)
	}
}

// checkSchema7: sandboxes from before have no operation in flight, and one
// can begin on them.
func checkSchema7(t *testing.T, db *sql.DB) {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sandboxes WHERE op_id = ''").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d sandboxes without an operation in flight (%v), want 3", n, err)
	}
	addLaterSandboxColumns(t, db)
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	sb, err := s.GetSandbox(context.Background(), "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	op := Operation{ID: "op7", Kind: "pause", TargetID: "sbx1", Owner: "key1", Status: "pending"}
	if err := s.BeginOperation(context.Background(), sb, op, "running"); err != nil {
		t.Fatal(err)
	}
	if id, err := s.operationInFlight(context.Background(), "sbx1"); err != nil || id != "op7" {
		t.Errorf("in flight %q, %v; want op7", id, err)
	}
}

// checkSchema5: earlier rows stay; builds are typed, their IDs unique, and
// the newest build of a name:tag is found through its index.
func checkSchema5(t *testing.T, db *sql.DB) {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sandboxes").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d sandboxes after the migration, %v; want 3", n, err)
	}
	const ins = "INSERT INTO builds (id, owner, name, tag, status, digest, created_at) VALUES ('%s', 'key1', 'web', 'v1', 'building', '', %s)"
	if _, err := db.Exec(fmt.Sprintf(ins, "bld1", "1")); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(fmt.Sprintf(ins, "bld1", "2")); !isUniqueViolation(err) {
		t.Errorf("a second build bld1: %v, want a unique violation", err)
	}
	if _, err := db.Exec(fmt.Sprintf(ins, "bld2", "'soon'")); err == nil {
		t.Errorf("a text created_at was stored in a STRICT table")
	}
	var plan string
	rows, err := db.Query("EXPLAIN QUERY PLAN SELECT id FROM builds WHERE name = 'web' AND tag = 'v1' ORDER BY seq DESC LIMIT 1")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, parent, notused int
		var detail string
		rows.Scan(&id, &parent, &notused, &detail)
		plan += detail + "\n"
	}
	rows.Close()
	if !strings.Contains(plan, "builds_ref") {
		t.Errorf("the lookup of a tag's newest build does not use its index:\n%s", plan)
	}
}

// fillOperations5 writes a finished operation in the version 5 shape.
func fillOperations5(t *testing.T, db *sql.DB) {
	if _, err := db.Exec("INSERT INTO operations (id, kind, target_id, owner, status, created_at, finished_at)" +
		" VALUES ('op1', 'create', 'sbx1', 'key1', 'succeeded', 1, 2)"); err != nil {
		t.Fatal(err)
	}
}

// checkSchema6: an operation from before has no timings and still reads;
// a new one keeps its steps in order.
func checkSchema6(t *testing.T, db *sql.DB) {
	s := &Store{db: &conn{db: db, eng: sqliteEngine}}
	old, err := s.GetOperation(context.Background(), "op1")
	if err != nil || old.Status != "succeeded" || old.Timings != nil {
		t.Fatalf("the operation from before: %+v, %v", old, err)
	}
	op := Operation{ID: "op2", Kind: "create", TargetID: "sbx2", Owner: "key1", Status: "running",
		Timings: timings.Timings{{Name: "start vm", MS: 40.5}, {Name: "connect to agent", MS: 2}}}
	if err := s.InsertOperation(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	op.Timings.Add("init guest", 3*time.Millisecond)
	if err := s.UpdateOperation(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetOperation(context.Background(), "op2")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Timings) != 3 || got.Timings[0] != op.Timings[0] || got.Timings[2].Name != "init guest" || got.Timings[2].MS != 3 {
		t.Fatalf("timings read back %+v, want %+v", got.Timings, op.Timings)
	}
	if _, err := db.Exec("UPDATE operations SET timings = 'not json' WHERE id = 'op2'"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetOperation(context.Background(), "op2"); err == nil {
		t.Error("an operation with unreadable timings read without an error")
	}
}

// fillSchema1 writes sandboxes with and without a lease in the version 1
// shape.
func fillSchema1(t *testing.T, db *sql.DB) {
	for i, exp := range []string{"NULL", "5", "10"} {
		q := fmt.Sprintf("INSERT INTO sandboxes (id, owner, state, template_ref, template_digest, vcpus, memory_mib, disk_mib,"+
			" timeout_s, on_timeout, env, metadata, created_at, updated_at, expires_at)"+
			" VALUES ('sbx%d', 'key1', 'running', 'base', 'sha256:a', 1, 512, 2048, 0, 'delete', '{}', '{}', 1, 1, %s)", i, exp)
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// checkSchema2: the rows are kept, and lease queries use the new index.
func checkSchema2(t *testing.T, db *sql.DB) {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sandboxes").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d sandboxes after the migration, %v; want 3", n, err)
	}
	var plan string
	rows, err := db.Query("EXPLAIN QUERY PLAN SELECT id FROM sandboxes WHERE expires_at IS NOT NULL AND expires_at <= 7 ORDER BY expires_at")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, parent, notused int
		var detail string
		rows.Scan(&id, &parent, &notused, &detail)
		plan += detail + "\n"
	}
	if !strings.Contains(plan, "sandboxes_expires") {
		t.Errorf("the lease query does not use the index:\n%s", plan)
	}
	var id string
	if err := db.QueryRow("SELECT id FROM sandboxes WHERE expires_at IS NOT NULL AND expires_at <= 7 ORDER BY expires_at").Scan(&id); err != nil || id != "sbx1" {
		t.Errorf("expired sandbox %q, %v; want sbx1", id, err)
	}
}

// checkSchema3: the rows are kept, and secrets are unique per (owner, name),
// with every column required and typed.
func checkSchema3(t *testing.T, db *sql.DB) {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sandboxes").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d sandboxes after the migration, %v; want 3", n, err)
	}
	const secret = "INSERT INTO secrets (owner, name, sealed, created_at, updated_at) VALUES ('%s', '%s', x'01', 1, 1)"
	for _, q := range []string{fmt.Sprintf(secret, "key1", "openai"), fmt.Sprintf(secret, "key2", "openai"),
		fmt.Sprintf(secret, "key1", "github")} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, tc := range []struct {
		name     string
		query    string
		wantCode int
	}{
		{"name unique per owner", fmt.Sprintf(secret, "key1", "openai"), sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"owner not null", "INSERT INTO secrets (owner, name, sealed, created_at, updated_at) VALUES (NULL, 'x', x'01', 1, 1)",
			sqlite3.SQLITE_CONSTRAINT_NOTNULL},
		{"sealed not null", "UPDATE secrets SET sealed = NULL", sqlite3.SQLITE_CONSTRAINT_NOTNULL},
		{"strict types", "UPDATE secrets SET created_at = 'yesterday'", sqlite3.SQLITE_CONSTRAINT_DATATYPE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Exec(tc.query)
			if code := sqliteCode(err); code != tc.wantCode {
				t.Errorf("%s: code %d (%v), want %d", tc.query, code, err, tc.wantCode)
			}
		})
	}
	if err := db.QueryRow("SELECT count(*) FROM secrets WHERE owner = 'key1'").Scan(&n); err != nil || n != 2 {
		t.Errorf("%d secrets of key1, %v; want 2", n, err)
	}
}

// fillKeys3 writes keys in the version 3 shape (without a format), with
// sandboxes.
func fillKeys3(t *testing.T, db *sql.DB) {
	fillSchema1(t, db)
	for i := range 3 {
		q := fmt.Sprintf("INSERT INTO keys (id, name, role, hash, created_at) VALUES ('key%d', 'k%d', 'user', x'0%d', %d)", i, i, i, i)
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// checkSchema4: the keys are kept with format "airlock", hashes are unique
// and looked up through their index, and format is required and typed.
func checkSchema4(t *testing.T, db *sql.DB) {
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sandboxes").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d sandboxes after the migration, %v; want 3", n, err)
	}
	rows, err := db.Query("SELECT id, format FROM keys ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id, format string
		if err := rows.Scan(&id, &format); err != nil {
			t.Fatal(err)
		}
		got = append(got, id+"="+format)
	}
	rows.Close()
	if want := []string{"key0=airlock", "key1=airlock", "key2=airlock"}; !slices.Equal(got, want) {
		t.Errorf("keys after the migration %q, want %q", got, want)
	}
	const key = "INSERT INTO keys (id, name, role, hash, format, created_at) VALUES ('%s', 'k', 'user', %s, '%s', 1)"
	if _, err := db.Exec(fmt.Sprintf(key, "keye2b", "x'ee'", "e2b")); err != nil {
		t.Fatal(err)
	}
	var id string
	if err := db.QueryRow("SELECT id FROM keys WHERE hash = x'ee'").Scan(&id); err != nil || id != "keye2b" {
		t.Errorf("key by hash %q, %v; want keye2b", id, err)
	}
	var plan string
	prows, err := db.Query("EXPLAIN QUERY PLAN SELECT id FROM keys WHERE hash = x'ee'")
	if err != nil {
		t.Fatal(err)
	}
	for prows.Next() {
		var id, parent, notused int
		var detail string
		prows.Scan(&id, &parent, &notused, &detail)
		plan += detail + "\n"
	}
	prows.Close()
	if !strings.Contains(plan, "keys_hash") {
		t.Errorf("the lookup by hash does not use the index:\n%s", plan)
	}
	for _, tc := range []struct {
		name     string
		query    string
		wantCode int
	}{
		{"hash unique", fmt.Sprintf(key, "keynew", "x'01'", "e2b"), sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"hash unique across formats", fmt.Sprintf(key, "keynew", "x'ee'", "airlock"), sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"format not null", "UPDATE keys SET format = NULL WHERE id = 'key0'", sqlite3.SQLITE_CONSTRAINT_NOTNULL},
		{"strict types", "UPDATE keys SET format = x'01' WHERE id = 'key0'", sqlite3.SQLITE_CONSTRAINT_DATATYPE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Exec(tc.query)
			if code := sqliteCode(err); code != tc.wantCode {
				t.Errorf("%s: code %d (%v), want %d", tc.query, code, err, tc.wantCode)
			}
		})
	}
	if err := db.QueryRow("SELECT count(*) FROM keys").Scan(&n); err != nil || n != 4 {
		t.Errorf("%d keys, %v; want 4", n, err)
	}
}

func TestMigrations(t *testing.T) {
	ctx := context.Background()
	for i, m := range migrations {
		if m.version != i+1 {
			t.Fatalf("migrations[%d] has version %d, want %d", i, m.version, i+1)
		}
	}
	for _, m := range migrations {
		t.Run(fmt.Sprintf("%d %s", m.version, m.description), func(t *testing.T) {
			i := slices.IndexFunc(migrationTests, func(tc migrationTest) bool { return tc.version == m.version })
			if i < 0 {
				t.Fatalf("migration %d has no case in migrationTests", m.version)
			}
			tc := migrationTests[i]
			db, err := openDB(filepath.Join(t.TempDir(), "airlock.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			c := &conn{db: db, eng: sqliteEngine}
			if err := migrate(ctx, c, m.version-1); err != nil {
				t.Fatal(err)
			}
			if v, _ := schemaVersion(ctx, c, c.eng); v != m.version-1 {
				t.Fatalf("version %d before the migration, want %d", v, m.version-1)
			}
			if tc.before != nil {
				tc.before(t, db)
			}
			if err := migrate(ctx, c, m.version); err != nil {
				t.Fatal(err)
			}
			if v, _ := schemaVersion(ctx, c, c.eng); v != m.version {
				t.Fatalf("version %d after the migration, want %d", v, m.version)
			}
			tc.after(t, db)
			// Applying again changes nothing.
			if err := migrate(ctx, c, m.version); err != nil {
				t.Fatalf("migrating again: %v", err)
			}
		})
	}
}

// A migration that fails leaves the database as it was.
func TestFailedMigrationRollsBack(t *testing.T) {
	ctx := context.Background()
	db, err := openDB(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := &conn{db: db, eng: sqliteEngine}
	bad := migration{1, "half good", "CREATE TABLE good (a INTEGER); INSERT INTO missing VALUES (1);", postgresSame}
	if err := applyMigration(ctx, c, bad); err == nil {
		t.Fatal("a failing migration applied")
	}
	if v, _ := schemaVersion(ctx, c, c.eng); v != 0 {
		t.Errorf("version %d after a failed migration, want 0", v)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_schema WHERE name = 'good'").Scan(&n); err != nil || n != 0 {
		t.Errorf("table of a failed migration left behind (%d, %v)", n, err)
	}
	// The real migrations still apply.
	if err := migrate(ctx, c, len(migrations)); err != nil {
		t.Fatal(err)
	}
}

// checkSchema1 checks the tables, indexes and constraints of migration 1.
func checkSchema1(t *testing.T, db *sql.DB) {
	for _, name := range []string{
		"keys", "sandboxes", "operations", "commands", "idempotency",
		"sandboxes_owner", "sandboxes_state", "operations_status", "operations_target",
		"commands_sandbox", "commands_state", "idempotency_created",
	} {
		var n int
		if err := db.QueryRow("SELECT count(*) FROM sqlite_schema WHERE name = ?", name).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s: %d, %v; want it to exist", name, n, err)
		}
	}

	const (
		key     = "INSERT INTO keys (id, name, role, hash, created_at) VALUES ('key1', 'k', 'admin', x'01', 1)"
		sandbox = "INSERT INTO sandboxes (id, owner, state, template_ref, template_digest, vcpus, memory_mib, disk_mib," +
			" timeout_s, on_timeout, env, metadata, created_at, updated_at)" +
			" VALUES ('sbx1', 'key1', 'running', 'base', 'sha256:a', 1, 512, 2048, 0, 'delete', '{}', '{}', 1, 1)"
		operation = "INSERT INTO operations (id, kind, target_id, owner, status, created_at)" +
			" VALUES ('op1', 'create', 'sbx1', 'key1', 'pending', 1)"
		command = "INSERT INTO commands (id, sandbox_id, owner, state, agent_id, pid, timed_out, token_hash," +
			" token_expires_at, token_spent, created_at) VALUES ('cmd1', '%s', 'key1', 'created', '', 0, 0, x'01', 1, 0, 1)"
		idem = "INSERT INTO idempotency (key_id, key, request_hash, status, body, created_at)" +
			" VALUES ('key1', 'k', x'01', 202, x'', 1)"
	)
	for _, q := range []string{key, sandbox, operation, fmt.Sprintf(command, "sbx1"), idem} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	for _, tc := range []struct {
		name     string
		query    string
		wantCode int
	}{
		{"key ID unique", key, sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"sandbox ID unique", sandbox, sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"operation ID unique", operation, sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"command ID unique", fmt.Sprintf(command, "sbx1"), sqlite3.SQLITE_CONSTRAINT_UNIQUE},
		{"idempotency key unique per API key", idem, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY},
		{"command needs its sandbox", "UPDATE commands SET sandbox_id = 'sbxnope'", sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY},
		{"key name not null", "INSERT INTO keys (id, name, role, hash, created_at) VALUES ('key2', NULL, 'user', x'01', 1)",
			sqlite3.SQLITE_CONSTRAINT_NOTNULL},
		{"sandbox metadata not null", "UPDATE sandboxes SET metadata = NULL", sqlite3.SQLITE_CONSTRAINT_NOTNULL},
		{"strict types", "UPDATE sandboxes SET vcpus = 'many'", sqlite3.SQLITE_CONSTRAINT_DATATYPE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Exec(tc.query)
			if code := sqliteCode(err); code != tc.wantCode {
				t.Errorf("%s: code %d (%v), want %d", tc.query, code, err, tc.wantCode)
			}
		})
	}

	// Deleting a sandbox deletes its commands.
	if _, err := db.Exec("DELETE FROM sandboxes WHERE id = 'sbx1'"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM commands").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d commands left after their sandbox was deleted (%v)", n, err)
	}
	// AUTOINCREMENT: a deleted row's seq is not reused, so cursors stay valid.
	if _, err := db.Exec(sandbox); err != nil {
		t.Fatal(err)
	}
	var seq int
	if err := db.QueryRow("SELECT seq FROM sandboxes WHERE id = 'sbx1'").Scan(&seq); err != nil || seq != 2 {
		t.Errorf("seq of a new row after a delete = %d (%v), want 2", seq, err)
	}
}
