package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Sandbox is the desired and recorded state of one sandbox.
type Sandbox struct {
	// ID names the sandbox ("sbx…").
	ID string
	// Owner is the ID of the key that created it.
	Owner string
	// State is creating, running, paused, suspending, suspended, waking,
	// deleting, deleted or failed.
	State string
	// TemplateRef is the template as asked for ("base:latest").
	TemplateRef string
	// TemplateDigest is the template it was made from ("sha256:…").
	TemplateDigest string
	// VCPUs is the number of virtual CPUs.
	VCPUs int
	// MemoryMiB is the guest memory in MiB.
	MemoryMiB int
	// DiskMiB is the size of the writable disk in MiB.
	DiskMiB int
	// TimeoutS is the lease length in seconds; 0 means no lease.
	TimeoutS int
	// OnTimeout is what expiry does: "delete" or "suspend".
	OnTimeout string
	// Env is the default environment of every command; never nil when read.
	Env map[string]string
	// Metadata holds free labels, filterable in a list; never nil when read.
	Metadata map[string]string
	// Network is the egress policy as JSON; nil when unset.
	Network json.RawMessage
	// CreatedAt is when it was created; the zero time means now.
	CreatedAt time.Time
	// UpdatedAt is when its record last changed; the store sets it.
	UpdatedAt time.Time
	// ExpiresAt is when the lease ends; nil without a lease.
	ExpiresAt *time.Time
	// LastError says why the last lifecycle step failed; nil if none did.
	LastError *Error
	// IdleS is how long, in seconds, the sandbox may go without activity
	// before the server suspends or pauses it; 0 means never.
	IdleS int
	// OnIdle is what idleness does: "suspend" or "pause"; "" is "suspend".
	OnIdle string
	// WakeOnRequest says that a call that needs the sandbox running wakes
	// it from paused or suspended, rather than being refused.
	WakeOnRequest bool
}

const sandboxColumns = "id, owner, state, template_ref, template_digest, vcpus, memory_mib, disk_mib, " +
	"timeout_s, on_timeout, env, metadata, network, created_at, updated_at, expires_at, last_error, idle_s, on_idle, wake_on_request"

// sandboxRow holds a sandbox's column values in the order of sandboxColumns.
func sandboxRow(sb Sandbox) ([]any, error) {
	env, err := stringMap(sb.Env)
	if err != nil {
		return nil, fmt.Errorf("encode env: %w", err)
	}
	metadata, err := stringMap(sb.Metadata)
	if err != nil {
		return nil, fmt.Errorf("encode metadata: %w", err)
	}
	network, err := rawJSON("network", sb.Network)
	if err != nil {
		return nil, err
	}
	lastErr, err := errorJSON(sb.LastError)
	if err != nil {
		return nil, fmt.Errorf("encode last error: %w", err)
	}
	return []any{sb.ID, sb.Owner, sb.State, sb.TemplateRef, sb.TemplateDigest, sb.VCPUs, sb.MemoryMiB, sb.DiskMiB,
		sb.TimeoutS, sb.OnTimeout, env, metadata, network, nanos(sb.CreatedAt), nanos(sb.UpdatedAt),
		nullNanos(sb.ExpiresAt), lastErr, sb.IdleS, sb.OnIdle, boolInt(sb.WakeOnRequest)}, nil
}

// InsertSandbox stores sb together with op, the operation that creates it,
// in one transaction. op must target sb. A sandbox or operation whose ID is
// taken is a conflict, and then neither is stored. UpdatedAt is set to
// CreatedAt.
func (s *Store) InsertSandbox(ctx context.Context, sb Sandbox, op Operation) error {
	return s.insertSandbox(ctx, sb, op, nil)
}

// insertSandbox is InsertSandbox, running check (if not nil) in the
// transaction once inserts are serialized, before anything is written.
func (s *Store) insertSandbox(ctx context.Context, sb Sandbox, op Operation, check func(t *tx) error) error {
	if err := requireID("insert sandbox", sb.ID); err != nil {
		return err
	}
	if op.TargetID != sb.ID {
		return fmt.Errorf("insert sandbox %s: operation %s targets %q: %w", sb.ID, op.ID, op.TargetID, errdefs.ErrInvalid)
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = now()
	}
	sb.UpdatedAt = sb.CreatedAt
	row, err := sandboxRow(sb)
	if err != nil {
		return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
	}
	return s.inTx(ctx, func(t *tx) error {
		if err := t.lockSeq(ctx, "sandboxes"); err != nil {
			return fmt.Errorf("insert sandbox %s: %w", sb.ID, classify(err))
		}
		if check != nil {
			if err := check(t); err != nil {
				return err
			}
		}
		_, err := t.ExecContext(ctx, "INSERT INTO sandboxes ("+sandboxColumns+") VALUES ("+placeholders(len(row))+")", row...)
		if isUniqueViolation(err) {
			return fmt.Errorf("insert sandbox %s: the ID is taken: %w", sb.ID, errdefs.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("insert sandbox %s: %w", sb.ID, classify(err))
		}
		if err := appendEvent(ctx, t, Event{Owner: sb.Owner, Type: apiv1.EventSandboxCreated, SandboxID: sb.ID,
			Data: sandboxEventData("", sb)}); err != nil {
			return err
		}
		return insertOperation(ctx, t, op)
	})
}

// GetSandbox returns the sandbox with the given ID.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	return getByID(ctx, s.db, "sandbox", "sandboxes", sandboxColumns, id, scanSandbox)
}

// SetSandboxNode records node as the cluster node the sandbox's Pod is
// bound to ("" for none). The node is kept out of Sandbox, so that an
// update of the rest of the row, read before the node was set, cannot
// undo it.
func (s *Store) SetSandboxNode(ctx context.Context, id, node string) error {
	res, err := s.db.ExecContext(ctx, "UPDATE sandboxes SET node = ? WHERE id = ?", node, id)
	if err != nil {
		return fmt.Errorf("set node of sandbox %s: %w", id, classify(err))
	}
	return mustAffect(res, "sandbox", id)
}

// ReplicaClaim is the node an API replica claims a sandbox for when it
// deletes one no node has taken up: no node can claim it after, and the
// controller makes no Pod for it. It is no valid Node name.
const ReplicaClaim = "(replica)"

// ClaimSandboxNode records node as the sandbox's if it has none yet, and
// returns the node the sandbox has after: node itself, or the one that
// claimed it first. Of nodes racing for one sandbox, one wins.
func (s *Store) ClaimSandboxNode(ctx context.Context, id, node string) (string, error) {
	if node == "" {
		return "", fmt.Errorf("claim sandbox %s: no node named: %w", id, errdefs.ErrInvalid)
	}
	if _, err := s.db.ExecContext(ctx, "UPDATE sandboxes SET node = ? WHERE id = ? AND node = ''", node, id); err != nil {
		return "", fmt.Errorf("claim sandbox %s for node %s: %w", id, node, classify(err))
	}
	return s.SandboxNode(ctx, id)
}

// SandboxNode returns the node the sandbox is bound to, "" for none.
func (s *Store) SandboxNode(ctx context.Context, id string) (string, error) {
	var node string
	err := s.db.QueryRowContext(ctx, "SELECT node FROM sandboxes WHERE id = ?", id).Scan(&node)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("node of sandbox %s: %w", id, classify(err))
	}
	return node, nil
}

// NodesOf returns the nodes of the sandboxes named that are bound to one,
// by ID: a page of a list, without reading the whole table.
func (s *Store) NodesOf(ctx context.Context, ids []string) (map[string]string, error) {
	out := map[string]string{}
	for len(ids) > 0 {
		n := min(len(ids), 500)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = id
		}
		ids = ids[n:]
		if err := s.queryNodes(ctx, out, "SELECT id, node FROM sandboxes WHERE node <> '' AND id IN ("+placeholders(n)+")", args...); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// queryNodes adds the (id, node) rows query selects to out.
func (s *Store) queryNodes(ctx context.Context, out map[string]string, query string, args ...any) error {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("list sandbox nodes: %w", classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var id, node string
		if err := rows.Scan(&id, &node); err != nil {
			return fmt.Errorf("list sandbox nodes: %w", classify(err))
		}
		out[id] = node
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list sandbox nodes: %w", classify(err))
	}
	return nil
}

// SandboxNodes returns the node of every sandbox bound to one, by ID;
// given states, only of the sandboxes in one of them.
func (s *Store) SandboxNodes(ctx context.Context, states ...string) (map[string]string, error) {
	query, args := "SELECT id, node FROM sandboxes WHERE node <> ''", []any{}
	if len(states) > 0 {
		query += " AND state IN (" + placeholders(len(states)) + ")"
		for _, st := range states {
			args = append(args, st)
		}
	}
	out := map[string]string{}
	if err := s.queryNodes(ctx, out, query, args...); err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateSandbox replaces the record of the sandbox with sb's ID by sb and
// sets its UpdatedAt to now. Owner and CreatedAt are fixed at insert and are
// not changed.
func (s *Store) UpdateSandbox(ctx context.Context, sb Sandbox) error {
	return s.inTx(ctx, func(t *tx) error { return updateSandbox(ctx, t, sb) })
}

// TransitionSandbox records one lifecycle step in one transaction: it
// updates sb as UpdateSandbox does (sb must exist) and inserts op, or, if op
// exists, records its status, error and finish time. op must target sb.
// Examples: state deleting with a new delete operation; state running with
// the create operation succeeded. An op that has finished (FinishedAt set)
// is no longer the sandbox's operation in flight, if it was
// (BeginOperation).
func (s *Store) TransitionSandbox(ctx context.Context, sb Sandbox, op Operation) error {
	if op.TargetID != sb.ID {
		return fmt.Errorf("transition sandbox %s: operation %s targets %q: %w", sb.ID, op.ID, op.TargetID, errdefs.ErrInvalid)
	}
	return s.inTx(ctx, func(t *tx) error {
		if err := updateSandbox(ctx, t, sb); err != nil {
			return err
		}
		return upsertOperation(ctx, t, op)
	})
}

// BeginOperation starts op, a new lifecycle operation on sb, if the
// sandbox is still in state from and no other operation is in flight on
// it: in one transaction it records sb (as UpdateSandbox does), inserts op
// and makes op the sandbox's operation in flight, until a TransitionSandbox
// with op finished. Otherwise nothing changes and the error wraps
// errdefs.ErrConflict, saying what stood in the way. Of the servers that
// begin operations on one sandbox at once, one wins.
func (s *Store) BeginOperation(ctx context.Context, sb Sandbox, op Operation, from string) error {
	return s.beginOperation(ctx, sb, op, from, true, nil)
}

// BeginIdleOperation is BeginOperation for the suspend or pause that
// idleness starts: in the same transaction it writes a sandbox.idle event
// with data (a JSON object), so the event is there if and only if the
// operation began.
func (s *Store) BeginIdleOperation(ctx context.Context, sb Sandbox, op Operation, from string, data json.RawMessage) error {
	return s.beginOperation(ctx, sb, op, from, true, &Event{Owner: sb.Owner, Type: apiv1.EventSandboxIdle, SandboxID: sb.ID, Data: data})
}

// BeginDelete is BeginOperation for a delete: it does not wait for an
// operation in flight, and takes the sandbox over from it (that one's end
// no longer clears the mark). It still needs the sandbox in state from, so
// of two deletes one wins.
func (s *Store) BeginDelete(ctx context.Context, sb Sandbox, op Operation, from string) error {
	return s.beginOperation(ctx, sb, op, from, false, nil)
}

func (s *Store) beginOperation(ctx context.Context, sb Sandbox, op Operation, from string, idle bool, ev *Event) error {
	if op.TargetID != sb.ID {
		return fmt.Errorf("begin %s on sandbox %s: operation %s targets %q: %w", op.Kind, sb.ID, op.ID, op.TargetID, errdefs.ErrInvalid)
	}
	if err := requireID("begin operation", op.ID); err != nil {
		return err
	}
	query := "UPDATE sandboxes SET op_id = ? WHERE id = ? AND state = ?"
	if idle {
		query += " AND op_id = ''"
	}
	return s.inTx(ctx, func(t *tx) error {
		res, err := t.ExecContext(ctx, query, op.ID, sb.ID, from)
		if err != nil {
			return fmt.Errorf("begin %s on sandbox %s: %w", op.Kind, sb.ID, classify(err))
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("begin %s on sandbox %s: %w", op.Kind, sb.ID, err)
		} else if n == 0 {
			return s.whyNotBegun(ctx, t, sb.ID, op.Kind, from)
		}
		if ev != nil {
			// Before the state change's own event: idleness is why it
			// happens.
			if err := appendEvent(ctx, t, *ev); err != nil {
				return err
			}
		}
		if err := updateSandbox(ctx, t, sb); err != nil {
			return err
		}
		return insertOperation(ctx, t, op)
	})
}

// whyNotBegun says why an operation of kind could not begin on sandbox id.
func (s *Store) whyNotBegun(ctx context.Context, t *tx, id, kind, from string) error {
	var state, opID string
	err := t.QueryRowContext(ctx, "SELECT state, op_id FROM sandboxes WHERE id = ?", id).Scan(&state, &opID)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("begin %s on sandbox %s: %w", kind, id, classify(err))
	}
	if state != from {
		return fmt.Errorf("sandbox %s is %s now, not %s: %w", id, state, from, errdefs.ErrConflict)
	}
	var inflight string
	t.QueryRowContext(ctx, "SELECT kind FROM operations WHERE id = ?", opID).Scan(&inflight)
	return fmt.Errorf("sandbox %s has a %s operation in flight (%s): wait for it and retry: %w", id, inflight, opID, errdefs.ErrConflict)
}

// operationInFlight returns the ID of the lifecycle operation in flight on
// sandbox id (BeginOperation), or "" when there is none.
func (s *Store) operationInFlight(ctx context.Context, id string) (string, error) {
	var opID string
	err := s.db.QueryRowContext(ctx, "SELECT op_id FROM sandboxes WHERE id = ?", id).Scan(&opID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("get sandbox %s: %w", id, classify(err))
	}
	return opID, nil
}

// updateSandbox is UpdateSandbox through q, which may be a transaction.
//
// A change of state that callers are told of is recorded as an event in
// the same transaction.
func updateSandbox(ctx context.Context, t *tx, sb Sandbox) error {
	lock := ""
	if t.eng == postgresEngine {
		lock = " FOR UPDATE"
	}
	var from, owner string
	err := t.QueryRowContext(ctx, "SELECT state, owner FROM sandboxes WHERE id = ?"+lock, sb.ID).Scan(&from, &owner)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, classify(err))
	}
	sb.UpdatedAt = now()
	row, err := sandboxRow(sb)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	// Every column but id, owner and created_at, from the row in the order
	// of sandboxColumns.
	cols := strings.Split(sandboxColumns, ", ")
	var set []string
	var args []any
	for i, c := range cols {
		if c == "id" || c == "owner" || c == "created_at" {
			continue
		}
		set = append(set, c+" = ?")
		args = append(args, row[i])
	}
	args = append(args, sb.ID)
	res, err := t.ExecContext(ctx, "UPDATE sandboxes SET "+strings.Join(set, ", ")+" WHERE id = ?", args...)
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, classify(err))
	}
	if err := mustAffect(res, "sandbox", sb.ID); err != nil {
		return err
	}
	if ty := sandboxEvent(from, sb.State); ty != "" {
		return appendEvent(ctx, t, Event{Owner: owner, Type: ty, SandboxID: sb.ID, Data: sandboxEventData(from, sb)})
	}
	return nil
}

// SandboxFilter selects sandboxes in a list.
type SandboxFilter struct {
	// Owner, if set, keeps only the sandboxes of that key ID.
	Owner string
	// States, if set, keeps only the sandboxes in one of these states.
	States []string
	// Metadata keeps only the sandboxes whose metadata has every one of
	// these pairs.
	Metadata map[string]string
	// After is the page cursor: the last ID of the previous page, "" for the
	// first page. An ID that names no sandbox is invalid.
	After string
	// Limit is the most sandboxes to return; it must be positive.
	Limit int
}

// ListSandboxes returns the sandboxes that match f, in creation order,
// created after the sandbox f.After, at most f.Limit of them. Pages do not
// overlap or skip a sandbox while others are created; a sandbox that changes
// state between pages may leave or join the filter.
func (s *Store) ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("list sandboxes: limit %d is not positive: %w", f.Limit, errdefs.ErrInvalid)
	}
	var where []string
	var args []any
	if f.After != "" {
		seq, err := seqOf(ctx, s.db, "sandboxes", f.After, "")
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		where = append(where, "seq > ?")
		args = append(args, seq)
	}
	if f.Owner != "" {
		where = append(where, "owner = ?")
		args = append(args, f.Owner)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(f.States))+")")
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(f.Metadata)) {
		where = append(where, s.db.eng.metadataHas())
		args = append(args, k, f.Metadata[k])
	}
	query := "SELECT " + sandboxColumns + " FROM sandboxes"
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY seq LIMIT ?"
	args = append(args, f.Limit)

	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", classify(err))
	}
	defer rows.Close()
	list := []Sandbox{}
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		list = append(list, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", classify(err))
	}
	return list, nil
}

// scanSandbox reads a row of sandboxColumns.
func scanSandbox(r scanner) (Sandbox, error) {
	var sb Sandbox
	var env, metadata string
	var network, lastErr sql.NullString
	var created, updated int64
	var expires sql.NullInt64
	err := r.Scan(&sb.ID, &sb.Owner, &sb.State, &sb.TemplateRef, &sb.TemplateDigest, &sb.VCPUs, &sb.MemoryMiB,
		&sb.DiskMiB, &sb.TimeoutS, &sb.OnTimeout, &env, &metadata, &network, &created, &updated, &expires, &lastErr,
		&sb.IdleS, &sb.OnIdle, &sb.WakeOnRequest)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.Env, err = fromStringMap("env", env); err != nil {
		return Sandbox{}, err
	}
	if sb.Metadata, err = fromStringMap("metadata", metadata); err != nil {
		return Sandbox{}, err
	}
	sb.Network = fromRawJSON(network)
	sb.CreatedAt = fromNanos(created)
	sb.UpdatedAt = fromNanos(updated)
	sb.ExpiresAt = fromNullNanos(expires)
	if sb.LastError, err = fromErrorJSON("last error", lastErr); err != nil {
		return Sandbox{}, err
	}
	return sb, nil
}

// seqOf resolves a page cursor, the ID of a row of table, to its seq. With
// sandboxID set, the row must also belong to that sandbox. A cursor that
// names no such row is invalid.
func seqOf(ctx context.Context, q queryer, table, id, sandboxID string) (int64, error) {
	query := "SELECT seq FROM " + table + " WHERE id = ?"
	args := []any{id}
	if sandboxID != "" {
		query += " AND sandbox_id = ?"
		args = append(args, sandboxID)
	}
	var seq int64
	err := q.QueryRowContext(ctx, query, args...).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("page cursor %q names nothing in the list: %w", id, errdefs.ErrInvalid)
	}
	if err != nil {
		return 0, fmt.Errorf("resolve page cursor %q: %w", id, classify(err))
	}
	return seq, nil
}

// ListExpired returns the sandboxes in one of states whose lease ended at
// or before now, soonest first, at most limit of them; given a node, only
// the sandboxes recorded on it.
func (s *Store) ListExpired(ctx context.Context, now time.Time, states []string, node string, limit int) ([]Sandbox, error) {
	if limit <= 0 || len(states) == 0 {
		return nil, fmt.Errorf("list expired sandboxes: need states and a positive limit: %w", errdefs.ErrInvalid)
	}
	args := []any{nanos(now)}
	for _, st := range states {
		args = append(args, st)
	}
	onNode := ""
	if node != "" {
		onNode = " AND node = ?"
		args = append(args, node)
	}
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, "SELECT "+sandboxColumns+" FROM sandboxes"+
		" WHERE expires_at IS NOT NULL AND expires_at <= ? AND state IN ("+placeholders(len(states))+")"+onNode+
		" ORDER BY expires_at LIMIT ?", args...)
	if err != nil {
		return nil, fmt.Errorf("list expired sandboxes: %w", classify(err))
	}
	defer rows.Close()
	list := []Sandbox{}
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list expired sandboxes: %w", err)
		}
		list = append(list, sb)
	}
	return list, rows.Err()
}
