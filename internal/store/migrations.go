package store

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// A migration moves the schema from version-1 to version. It is written
// for each engine; its SQL runs in one transaction together with the
// update of the version (SQLite: PRAGMA user_version; PostgreSQL: the row
// of airlock_schema), so a migration is applied whole or not at all.
//
// A migration that rebuilds a SQLite table must not rely on foreign keys
// being off: PRAGMA foreign_keys cannot change inside a transaction.
type migration struct {
	version     int
	description string
	sql         string // SQLite
	postgres    string
}

// postgresSame as a migration's postgres SQL says that PostgreSQL runs its
// SQLite SQL as written.
const postgresSame = "(the SQLite SQL)"

// sqlFor returns m's SQL for the engine.
func (m migration) sqlFor(e engine) string {
	if e == postgresEngine && m.postgres != postgresSame {
		return m.postgres
	}
	return m.sql
}

// migrations are applied in order; migrations[i].version is i+1. Never edit
// one that has shipped: add a new one, and its case in migrationTests.
//
// Every table has an integer seq that orders its rows by insertion: IDs are
// random, and AUTOINCREMENT never reuses a number, so a page cursor (the last
// ID of a page, resolved to its seq) is stable while rows are inserted.
// Enumerated values (states, roles, kinds) have no CHECK constraint: SQLite
// cannot alter one without rebuilding the table, and the service validates
// them. Owners are key IDs without a foreign key, since a sandbox outlives
// the key that created it.
//
// The PostgreSQL schema has the same tables, columns, indexes and
// constraints: SQLite's INTEGER is BIGINT (times are unix nanoseconds,
// booleans 0 or 1), BLOB is BYTEA, AUTOINCREMENT is an identity column, and
// JSON is kept as TEXT in both.
var migrations = []migration{
	{1, "create keys, sandboxes, operations, commands, idempotency", `
CREATE TABLE keys (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT    NOT NULL UNIQUE,
	name       TEXT    NOT NULL,
	role       TEXT    NOT NULL,
	hash       BLOB    NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE sandboxes (
	seq             INTEGER PRIMARY KEY AUTOINCREMENT,
	id              TEXT    NOT NULL UNIQUE,
	owner           TEXT    NOT NULL,
	state           TEXT    NOT NULL,
	template_ref    TEXT    NOT NULL,
	template_digest TEXT    NOT NULL,
	vcpus           INTEGER NOT NULL,
	memory_mib      INTEGER NOT NULL,
	disk_mib        INTEGER NOT NULL,
	timeout_s       INTEGER NOT NULL,
	on_timeout      TEXT    NOT NULL,
	env             TEXT    NOT NULL,  -- JSON object
	metadata        TEXT    NOT NULL,  -- JSON object
	network         TEXT,              -- JSON, NULL when unset
	created_at      INTEGER NOT NULL,
	updated_at      INTEGER NOT NULL,
	expires_at      INTEGER,
	last_error      TEXT               -- JSON {"code","message"}, NULL when none
) STRICT;
CREATE INDEX sandboxes_owner ON sandboxes (owner, seq);
CREATE INDEX sandboxes_state ON sandboxes (state, seq);

CREATE TABLE operations (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	id          TEXT    NOT NULL UNIQUE,
	kind        TEXT    NOT NULL,
	target_id   TEXT    NOT NULL,
	owner       TEXT    NOT NULL,
	status      TEXT    NOT NULL,
	error       TEXT,              -- JSON {"code","message"}, NULL when none
	created_at  INTEGER NOT NULL,
	finished_at INTEGER
) STRICT;
CREATE INDEX operations_status ON operations (status, seq);
CREATE INDEX operations_target ON operations (target_id, seq);

CREATE TABLE commands (
	seq              INTEGER PRIMARY KEY AUTOINCREMENT,
	id               TEXT    NOT NULL UNIQUE,
	sandbox_id       TEXT    NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	owner            TEXT    NOT NULL,
	request          TEXT,              -- JSON, the API request as given
	state            TEXT    NOT NULL,
	agent_id         TEXT    NOT NULL,
	pid              INTEGER NOT NULL,
	exit_code        INTEGER,
	signal           TEXT,
	timed_out        INTEGER NOT NULL,
	token_hash       BLOB    NOT NULL,
	token_expires_at INTEGER NOT NULL,
	token_spent      INTEGER NOT NULL,
	created_at       INTEGER NOT NULL,
	started_at       INTEGER,
	finished_at      INTEGER
) STRICT;
CREATE INDEX commands_sandbox ON commands (sandbox_id, seq);
CREATE INDEX commands_state ON commands (state, seq);

CREATE TABLE idempotency (
	key_id       TEXT    NOT NULL,
	key          TEXT    NOT NULL,
	request_hash BLOB    NOT NULL,
	status       INTEGER NOT NULL,
	body         BLOB    NOT NULL,
	created_at   INTEGER NOT NULL,
	PRIMARY KEY (key_id, key)
) STRICT;
CREATE INDEX idempotency_created ON idempotency (created_at);
`, `
CREATE TABLE keys (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT   NOT NULL UNIQUE,
	name       TEXT   NOT NULL,
	role       TEXT   NOT NULL,
	hash       BYTEA  NOT NULL,
	created_at BIGINT NOT NULL
);

CREATE TABLE sandboxes (
	seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id              TEXT   NOT NULL UNIQUE,
	owner           TEXT   NOT NULL,
	state           TEXT   NOT NULL,
	template_ref    TEXT   NOT NULL,
	template_digest TEXT   NOT NULL,
	vcpus           BIGINT NOT NULL,
	memory_mib      BIGINT NOT NULL,
	disk_mib        BIGINT NOT NULL,
	timeout_s       BIGINT NOT NULL,
	on_timeout      TEXT   NOT NULL,
	env             TEXT   NOT NULL,
	metadata        TEXT   NOT NULL,
	network         TEXT,
	created_at      BIGINT NOT NULL,
	updated_at      BIGINT NOT NULL,
	expires_at      BIGINT,
	last_error      TEXT
);
CREATE INDEX sandboxes_owner ON sandboxes (owner, seq);
CREATE INDEX sandboxes_state ON sandboxes (state, seq);

CREATE TABLE operations (
	seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id          TEXT   NOT NULL UNIQUE,
	kind        TEXT   NOT NULL,
	target_id   TEXT   NOT NULL,
	owner       TEXT   NOT NULL,
	status      TEXT   NOT NULL,
	error       TEXT,
	created_at  BIGINT NOT NULL,
	finished_at BIGINT
);
CREATE INDEX operations_status ON operations (status, seq);
CREATE INDEX operations_target ON operations (target_id, seq);

CREATE TABLE commands (
	seq              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id               TEXT   NOT NULL UNIQUE,
	sandbox_id       TEXT   NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	owner            TEXT   NOT NULL,
	request          TEXT,
	state            TEXT   NOT NULL,
	agent_id         TEXT   NOT NULL,
	pid              BIGINT NOT NULL,
	exit_code        BIGINT,
	signal           TEXT,
	timed_out        BIGINT NOT NULL,
	token_hash       BYTEA  NOT NULL,
	token_expires_at BIGINT NOT NULL,
	token_spent      BIGINT NOT NULL,
	created_at       BIGINT NOT NULL,
	started_at       BIGINT,
	finished_at      BIGINT
);
CREATE INDEX commands_sandbox ON commands (sandbox_id, seq);
CREATE INDEX commands_state ON commands (state, seq);

CREATE TABLE idempotency (
	key_id       TEXT   NOT NULL,
	key          TEXT   NOT NULL,
	request_hash BYTEA  NOT NULL,
	status       BIGINT NOT NULL,
	body         BYTEA  NOT NULL,
	created_at   BIGINT NOT NULL,
	PRIMARY KEY (key_id, key)
);
CREATE INDEX idempotency_created ON idempotency (created_at);
`},
	{2, "index sandboxes by lease expiry", `
CREATE INDEX sandboxes_expires ON sandboxes (expires_at) WHERE expires_at IS NOT NULL;
`, postgresSame},
	{3, "create secrets", `
CREATE TABLE secrets (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	owner      TEXT    NOT NULL,
	name       TEXT    NOT NULL,
	sealed     BLOB    NOT NULL,  -- internal/secrets: version, nonce, ciphertext
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	UNIQUE (owner, name)
) STRICT;
`, `
CREATE TABLE secrets (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	owner      TEXT   NOT NULL,
	name       TEXT   NOT NULL,
	sealed     BYTEA  NOT NULL,
	created_at BIGINT NOT NULL,
	updated_at BIGINT NOT NULL,
	UNIQUE (owner, name)
);
`},
	{4, "add keys.format, index keys by hash", `
-- "airlock" or "e2b"; a key of the e2b format does not name its ID, so it
-- is found by the hash of its secret.
ALTER TABLE keys ADD COLUMN format TEXT NOT NULL DEFAULT 'airlock';
CREATE UNIQUE INDEX keys_hash ON keys (hash);
`, postgresSame},
	{5, "create builds", `
-- A template build: POST /v1/templates or POST /v1/sandboxes/{id}/template.
CREATE TABLE builds (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	id          TEXT    NOT NULL UNIQUE,
	owner       TEXT    NOT NULL,
	name        TEXT    NOT NULL,
	tag         TEXT    NOT NULL,
	status      TEXT    NOT NULL,  -- building, ready or failed
	digest      TEXT    NOT NULL,  -- the result, once ready
	request     TEXT,              -- JSON, the request as given
	error       TEXT,              -- JSON store.Error, once failed
	created_at  INTEGER NOT NULL,
	finished_at INTEGER
) STRICT;
CREATE INDEX builds_ref ON builds (name, tag, seq);
CREATE INDEX builds_status ON builds (status, seq);
`, `
CREATE TABLE builds (
	seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id          TEXT   NOT NULL UNIQUE,
	owner       TEXT   NOT NULL,
	name        TEXT   NOT NULL,
	tag         TEXT   NOT NULL,
	status      TEXT   NOT NULL,
	digest      TEXT   NOT NULL,
	request     TEXT,
	error       TEXT,
	created_at  BIGINT NOT NULL,
	finished_at BIGINT
);
CREATE INDEX builds_ref ON builds (name, tag, seq);
CREATE INDEX builds_status ON builds (status, seq);
`},
	{6, "add operations.timings", `
-- JSON object of step names to milliseconds, in the order the steps ran
-- (internal/timings); NULL when the operation recorded none.
ALTER TABLE operations ADD COLUMN timings TEXT;
`, postgresSame},
	{7, "add sandboxes.op_id", `
-- The lifecycle operation in flight on the sandbox, '' when none: the row,
-- not a lock in one server's memory, admits one operation at a time.
ALTER TABLE sandboxes ADD COLUMN op_id TEXT NOT NULL DEFAULT '';
`, postgresSame},
	{8, "add sandboxes.node", `
-- In cluster mode, the node the sandbox's Pod is bound to, '' until it is
-- bound. Written only by the controller; a single host leaves it ''.
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
`, postgresSame},
	{9, "create settings", `
-- Values every server and node of one store must agree on, set by the
-- first to start (the hash of a cluster's internal token).
CREATE TABLE settings (
	name  TEXT NOT NULL PRIMARY KEY,
	value TEXT NOT NULL
) STRICT;
`, `
CREATE TABLE settings (
	name  TEXT NOT NULL PRIMARY KEY,
	value TEXT NOT NULL
);
`},
	{10, "create template_tags and build_contexts, add builds.node", `
-- In cluster mode, the catalogue of the templates built or saved on nodes:
-- the digest each name:tag names, with the image's settings (JSON
-- template.Settings) and size, so that any API replica resolves it and any
-- node fetches the image by digest. A single host keeps its tags in its
-- template store and leaves this empty.
CREATE TABLE template_tags (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	name       TEXT    NOT NULL,
	tag        TEXT    NOT NULL,
	digest     TEXT    NOT NULL,
	size_bytes INTEGER NOT NULL,
	settings   TEXT    NOT NULL,
	owner      TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE (name, tag)
) STRICT;
CREATE INDEX template_tags_digest ON template_tags (digest);
-- The node that runs, or ran, the build ('' on a single host): its log is
-- there.
ALTER TABLE builds ADD COLUMN node TEXT NOT NULL DEFAULT '';
-- In cluster mode, the node each uploaded build context is on, so that a
-- build that reads it runs there. A single host leaves it empty.
CREATE TABLE build_contexts (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT    NOT NULL UNIQUE,
	node       TEXT    NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;
`, `
CREATE TABLE template_tags (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	name       TEXT   NOT NULL,
	tag        TEXT   NOT NULL,
	digest     TEXT   NOT NULL,
	size_bytes BIGINT NOT NULL,
	settings   TEXT   NOT NULL,
	owner      TEXT   NOT NULL,
	created_at BIGINT NOT NULL,
	UNIQUE (name, tag)
);
CREATE INDEX template_tags_digest ON template_tags (digest);
ALTER TABLE builds ADD COLUMN node TEXT NOT NULL DEFAULT '';
CREATE TABLE build_contexts (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT   NOT NULL UNIQUE,
	node       TEXT   NOT NULL,
	created_at BIGINT NOT NULL
);
`},
	{11, "add keys.limits", `
-- JSON apiv1.Limits: the key's own limits ("{}": none of its own).
ALTER TABLE keys ADD COLUMN limits TEXT NOT NULL DEFAULT '{}';
`, postgresSame},
	{12, "create cluster_nodes and template_settings", `
-- The airlock nodes of a cluster, each registered by its agent (which
-- holds the store's credentials), and where the cluster reaches it: a
-- Kubernetes Node that carries airlock's label is not one unless here.
CREATE TABLE cluster_nodes (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	name       TEXT    NOT NULL UNIQUE,
	endpoint   TEXT    NOT NULL,
	updated_at INTEGER NOT NULL
) STRICT;
-- The settings (template.Settings JSON) of each image a create pinned by
-- digest, as the server that pinned it read them: what a node that fetches
-- the image from a peer checks the peer's against.
CREATE TABLE template_settings (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	digest     TEXT    NOT NULL UNIQUE,
	settings   TEXT    NOT NULL,
	updated_at INTEGER NOT NULL
) STRICT;
`, `
CREATE TABLE cluster_nodes (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	name       TEXT   NOT NULL UNIQUE,
	endpoint   TEXT   NOT NULL,
	updated_at BIGINT NOT NULL
);
CREATE TABLE template_settings (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	digest     TEXT   NOT NULL UNIQUE,
	settings   TEXT   NOT NULL,
	updated_at BIGINT NOT NULL
);
`},
	{13, "create events", `
-- The outbox: each change of state of a sandbox or a build callers are
-- told of, written in the transaction that makes the change. Read in seq
-- order (GET /v1/events), per owner; pruned after a week.
CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT    NOT NULL UNIQUE,
	owner      TEXT    NOT NULL,
	type       TEXT    NOT NULL,
	sandbox_id TEXT    NOT NULL,
	data       TEXT    NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX events_owner ON events (owner, seq);
CREATE INDEX events_created_at ON events (created_at);
-- The lease end (expires_at) a sandbox.expiring event was written for:
-- each lease end is told once; a keep that moves it is told again.
ALTER TABLE sandboxes ADD COLUMN expiry_told INTEGER NOT NULL DEFAULT 0;
`, `
CREATE TABLE events (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT   NOT NULL UNIQUE,
	owner      TEXT   NOT NULL,
	type       TEXT   NOT NULL,
	sandbox_id TEXT   NOT NULL,
	data       TEXT   NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE INDEX events_owner ON events (owner, seq);
CREATE INDEX events_created_at ON events (created_at);
ALTER TABLE sandboxes ADD COLUMN expiry_told BIGINT NOT NULL DEFAULT 0;
`},
	{14, "create webhooks and webhook_deliveries", `
-- A key's webhooks: where its events (an admin key's: every key's, when
-- all_owners is 1) are POSTed, in order. after_seq is the
-- seq of the last event settled (delivered, or given up after a day of
-- failures); the event after it is tried next, at next_at, by the server
-- that holds the lease (lease_until) so that one delivers at a time.
CREATE TABLE webhooks (
	seq           INTEGER PRIMARY KEY AUTOINCREMENT,
	id            TEXT    NOT NULL UNIQUE,
	owner         TEXT    NOT NULL,
	all_owners    INTEGER NOT NULL,
	url           TEXT    NOT NULL,
	types         TEXT    NOT NULL,
	secret        BLOB    NOT NULL,
	created_at    INTEGER NOT NULL,
	after_seq     INTEGER NOT NULL,
	attempts      INTEGER NOT NULL DEFAULT 0,
	failing_since INTEGER NOT NULL DEFAULT 0,
	next_at       INTEGER NOT NULL DEFAULT 0,
	lease_until   INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX webhooks_owner ON webhooks (owner, seq);
-- Every attempt at a delivery: the event, the answer's status (0 for
-- none) or the error.
CREATE TABLE webhook_deliveries (
	seq         INTEGER PRIMARY KEY AUTOINCREMENT,
	id          TEXT    NOT NULL UNIQUE,
	webhook_id  TEXT    NOT NULL,
	event_id    TEXT    NOT NULL,
	event_type  TEXT    NOT NULL,
	attempt     INTEGER NOT NULL,
	status      INTEGER NOT NULL,
	error       TEXT    NOT NULL,
	duration_ms INTEGER NOT NULL,
	created_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, seq);
CREATE INDEX webhook_deliveries_created_at ON webhook_deliveries (created_at);
`, `
CREATE TABLE webhooks (
	seq           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id            TEXT   NOT NULL UNIQUE,
	owner         TEXT   NOT NULL,
	all_owners    BIGINT NOT NULL,
	url           TEXT   NOT NULL,
	types         TEXT   NOT NULL,
	secret        BYTEA  NOT NULL,
	created_at    BIGINT NOT NULL,
	after_seq     BIGINT NOT NULL,
	attempts      BIGINT NOT NULL DEFAULT 0,
	failing_since BIGINT NOT NULL DEFAULT 0,
	next_at       BIGINT NOT NULL DEFAULT 0,
	lease_until   BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX webhooks_owner ON webhooks (owner, seq);
CREATE TABLE webhook_deliveries (
	seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id          TEXT   NOT NULL UNIQUE,
	webhook_id  TEXT   NOT NULL,
	event_id    TEXT   NOT NULL,
	event_type  TEXT   NOT NULL,
	attempt     BIGINT NOT NULL,
	status      BIGINT NOT NULL,
	error       TEXT   NOT NULL,
	duration_ms BIGINT NOT NULL,
	created_at  BIGINT NOT NULL
);
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, seq);
CREATE INDEX webhook_deliveries_created_at ON webhook_deliveries (created_at);
`},
	{15, "create checkpoints", `
-- A sandbox's memory, devices and disk at one instant, kept apart from it
-- on the host that made it (node; "" for a single host). It belongs to
-- its owner and outlives its sandbox; env and network are the sandbox's
-- at the instant, the defaults of sandboxes made from it.
CREATE TABLE checkpoints (
	seq             INTEGER PRIMARY KEY AUTOINCREMENT,
	id              TEXT    NOT NULL UNIQUE,
	owner           TEXT    NOT NULL,
	sandbox_id      TEXT    NOT NULL,
	name            TEXT    NOT NULL,
	state           TEXT    NOT NULL,
	template_ref    TEXT    NOT NULL,
	template_digest TEXT    NOT NULL,
	vcpus           INTEGER NOT NULL,
	memory_mib      INTEGER NOT NULL,
	disk_mib        INTEGER NOT NULL,
	size_bytes      INTEGER NOT NULL,
	env             TEXT    NOT NULL,
	network         TEXT,
	node            TEXT    NOT NULL,
	error           TEXT,
	created_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX checkpoints_owner ON checkpoints (owner, seq);
CREATE INDEX checkpoints_sandbox ON checkpoints (sandbox_id, seq);
`, `
CREATE TABLE checkpoints (
	seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id              TEXT   NOT NULL UNIQUE,
	owner           TEXT   NOT NULL,
	sandbox_id      TEXT   NOT NULL,
	name            TEXT   NOT NULL,
	state           TEXT   NOT NULL,
	template_ref    TEXT   NOT NULL,
	template_digest TEXT   NOT NULL,
	vcpus           BIGINT NOT NULL,
	memory_mib      BIGINT NOT NULL,
	disk_mib        BIGINT NOT NULL,
	size_bytes      BIGINT NOT NULL,
	env             TEXT   NOT NULL,
	network         TEXT,
	node            TEXT   NOT NULL,
	error           TEXT,
	created_at      BIGINT NOT NULL
);
CREATE INDEX checkpoints_owner ON checkpoints (owner, seq);
CREATE INDEX checkpoints_sandbox ON checkpoints (sandbox_id, seq);
`},
	{16, "add sandboxes.idle_s, on_idle and wake_on_request", `
-- After idle_s seconds without activity (0: never) the server suspends
-- the sandbox, or pauses it when on_idle is 'pause'; '' before this
-- migration, read as 'suspend'. With wake_on_request 1, a call that needs
-- the sandbox running wakes it from paused or suspended.
ALTER TABLE sandboxes ADD COLUMN idle_s INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN on_idle TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN wake_on_request INTEGER NOT NULL DEFAULT 0;
`, `
ALTER TABLE sandboxes ADD COLUMN idle_s BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN on_idle TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN wake_on_request BIGINT NOT NULL DEFAULT 0;
`},
}

// schemaVersion reads the version of the schema: SQLite's PRAGMA
// user_version, or the row of PostgreSQL's airlock_schema (0 before the
// first migration made it).
func schemaVersion(ctx context.Context, q queryer, e engine) (int, error) {
	var v int
	var err error
	if e == postgresEngine {
		var exists bool
		err = q.QueryRowContext(ctx, "SELECT to_regclass('airlock_schema') IS NOT NULL").Scan(&exists)
		if err == nil && exists {
			err = q.QueryRowContext(ctx, "SELECT version FROM airlock_schema").Scan(&v)
		}
	} else {
		err = q.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
	}
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", classify(err))
	}
	return v, nil
}

// setSchemaVersion records v as the version of the schema.
func setSchemaVersion(ctx context.Context, q queryer, e engine, v int) error {
	var err error
	if e == postgresEngine {
		_, err = q.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS airlock_schema ("+
			"one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)")
		if err == nil {
			_, err = q.ExecContext(ctx, "INSERT INTO airlock_schema (version) VALUES (?)"+
				" ON CONFLICT (one) DO UPDATE SET version = excluded.version", v)
		}
	} else {
		_, err = q.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v))
	}
	return err
}

// migrate applies the migrations up to and including version target, each
// in its own transaction, skipping those already applied. A database whose
// version is above what this binary knows is refused.
func migrate(ctx context.Context, c *conn, target int) error {
	for _, m := range migrations[:target] {
		if err := applyMigration(ctx, c, m); err != nil {
			return err
		}
	}
	// With nothing to apply the loop above checked nothing; check here too.
	v, err := schemaVersion(ctx, c, c.eng)
	if err != nil {
		return err
	}
	return checkNotNewer(v)
}

// migrationLock is the advisory lock under which a PostgreSQL migration
// runs, so that processes opening the database at once apply it once.
const migrationLock = "airlock.migrate"

// applyMigration applies m unless the database already has it.
func applyMigration(ctx context.Context, c *conn, m migration) error {
	t, err := c.begin(ctx)
	if err != nil {
		return fmt.Errorf("migration %d: %w", m.version, classify(err))
	}
	defer t.tx.Rollback()
	if c.eng == postgresEngine {
		// Released at the end of the transaction; the version is read after.
		if _, err := t.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext(?))", migrationLock); err != nil {
			return fmt.Errorf("migration %d: %w", m.version, classify(err))
		}
	}
	v, err := schemaVersion(ctx, t, c.eng)
	if err != nil {
		return err
	}
	if err := checkNotNewer(v); err != nil {
		return err
	}
	if v >= m.version {
		return nil
	}
	if v != m.version-1 {
		return fmt.Errorf("migration %d (%s): the schema is at version %d", m.version, m.description, v)
	}
	// Straight to the driver: the SQL is run as written, with no placeholders.
	if _, err := t.tx.ExecContext(ctx, m.sqlFor(c.eng)); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.version, m.description, classify(err))
	}
	if err := setSchemaVersion(ctx, t, c.eng, m.version); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.version, m.description, classify(err))
	}
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("migration %d (%s): %w", m.version, m.description, classify(err))
	}
	return nil
}

// checkNotNewer refuses a schema version above the last migration known.
func checkNotNewer(v int) error {
	if known := len(migrations); v > known {
		return fmt.Errorf("the database was written by a newer airlock (schema %d > %d): upgrade airlock: %w",
			v, known, errdefs.ErrPrecondition)
	}
	return nil
}
