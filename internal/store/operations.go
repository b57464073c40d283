package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/timings"
)

// Operation is one asynchronous lifecycle change and its outcome.
type Operation struct {
	// ID names the operation ("op…").
	ID string
	// Kind is create, pause, suspend, wake, delete or build.
	Kind string
	// TargetID is the sandbox (or template build) the operation acts on.
	TargetID string
	// Owner is the ID of the key that asked for it.
	Owner string
	// Status is pending, running, succeeded or failed.
	Status string
	// Error says why a failed operation failed; nil otherwise.
	Error *Error
	// CreatedAt is when it was asked for; the zero time means now.
	CreatedAt time.Time
	// FinishedAt is when it succeeded or failed; nil until then.
	FinishedAt *time.Time
	// Timings break down how long the work took, step by step; empty
	// when the operation records none (only creates and wakes do).
	Timings timings.Timings
}

const operationColumns = "id, kind, target_id, owner, status, error, created_at, finished_at, timings"

// InsertOperation stores op. An operation with the same ID is a conflict.
func (s *Store) InsertOperation(ctx context.Context, op Operation) error {
	return insertOperation(ctx, s.db, op)
}

// insertOperation stores op through q, which may be a transaction.
func insertOperation(ctx context.Context, q queryer, op Operation) error {
	if err := requireID("insert operation", op.ID); err != nil {
		return err
	}
	if op.CreatedAt.IsZero() {
		op.CreatedAt = now()
	}
	opErr, err := errorJSON(op.Error)
	if err != nil {
		return fmt.Errorf("insert operation %s: %w", op.ID, err)
	}
	_, err = q.ExecContext(ctx, "INSERT INTO operations ("+operationColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
		op.ID, op.Kind, op.TargetID, op.Owner, op.Status, opErr, nanos(op.CreatedAt), nullNanos(op.FinishedAt), timingsJSON(op.Timings))
	if isUniqueViolation(err) {
		return fmt.Errorf("insert operation %s: the ID is taken: %w", op.ID, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert operation %s: %w", op.ID, classify(err))
	}
	return nil
}

// upsertOperation stores op through q, or, if an operation with its ID
// exists, updates that one's status, error and finish time.
func upsertOperation(ctx context.Context, q queryer, op Operation) error {
	if err := requireID("upsert operation", op.ID); err != nil {
		return err
	}
	if op.CreatedAt.IsZero() {
		op.CreatedAt = now()
	}
	opErr, err := errorJSON(op.Error)
	if err != nil {
		return fmt.Errorf("upsert operation %s: %w", op.ID, err)
	}
	_, err = q.ExecContext(ctx, "INSERT INTO operations ("+operationColumns+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"+
		" ON CONFLICT (id) DO UPDATE SET status = excluded.status, error = excluded.error, finished_at = excluded.finished_at, timings = excluded.timings",
		op.ID, op.Kind, op.TargetID, op.Owner, op.Status, opErr, nanos(op.CreatedAt), nullNanos(op.FinishedAt), timingsJSON(op.Timings))
	if err != nil {
		return fmt.Errorf("upsert operation %s: %w", op.ID, classify(err))
	}
	return endInFlight(ctx, q, op)
}

// endInFlight frees the sandbox op targets if op has finished and is the
// sandbox's operation in flight (BeginOperation). Every record of a
// finished operation goes through here, so the mark never outlives it.
func endInFlight(ctx context.Context, q queryer, op Operation) error {
	if op.FinishedAt == nil {
		return nil
	}
	_, err := q.ExecContext(ctx, "UPDATE sandboxes SET op_id = '' WHERE id = (SELECT target_id FROM operations WHERE id = ?) AND op_id = ?",
		op.ID, op.ID)
	if err != nil {
		return fmt.Errorf("end operation %s: %w", op.ID, classify(err))
	}
	return nil
}

// GetOperation returns the operation with the given ID.
func (s *Store) GetOperation(ctx context.Context, id string) (Operation, error) {
	return getByID(ctx, s.db, "operation", "operations", operationColumns, id, scanOperation)
}

// UpdateOperation records op's status, error, finish time and timings.
// Its kind, target, owner and creation time are fixed when it is
// inserted. An op that has finished (FinishedAt set) is no longer its
// sandbox's operation in flight, in the same transaction.
func (s *Store) UpdateOperation(ctx context.Context, op Operation) error {
	opErr, err := errorJSON(op.Error)
	if err != nil {
		return fmt.Errorf("update operation %s: %w", op.ID, err)
	}
	update := func(q queryer) error {
		res, err := q.ExecContext(ctx, "UPDATE operations SET status = ?, error = ?, finished_at = ?, timings = ? WHERE id = ?",
			op.Status, opErr, nullNanos(op.FinishedAt), timingsJSON(op.Timings), op.ID)
		if err != nil {
			return fmt.Errorf("update operation %s: %w", op.ID, classify(err))
		}
		if err := mustAffect(res, "operation", op.ID); err != nil {
			return err
		}
		return endInFlight(ctx, q, op)
	}
	if op.FinishedAt == nil {
		return update(s.db) // one statement: no transaction needed
	}
	return s.inTx(ctx, func(t *tx) error { return update(t) })
}

// ListOperations returns the operations whose status is one of statuses, or
// all of them when none is given, in the order they were created.
func (s *Store) ListOperations(ctx context.Context, statuses ...string) ([]Operation, error) {
	query := "SELECT " + operationColumns + " FROM operations"
	var args []any
	if len(statuses) > 0 {
		query += " WHERE status IN (" + placeholders(len(statuses)) + ")"
		for _, st := range statuses {
			args = append(args, st)
		}
	}
	query += " ORDER BY seq"
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list operations: %w", classify(err))
	}
	defer rows.Close()
	ops := []Operation{}
	for rows.Next() {
		op, err := scanOperation(rows)
		if err != nil {
			return nil, fmt.Errorf("list operations: %w", err)
		}
		ops = append(ops, op)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list operations: %w", classify(err))
	}
	return ops, nil
}

// scanOperation reads a row of operationColumns.
func scanOperation(r scanner) (Operation, error) {
	var op Operation
	var opErr sql.NullString
	var created int64
	var finished sql.NullInt64
	var steps sql.NullString
	if err := r.Scan(&op.ID, &op.Kind, &op.TargetID, &op.Owner, &op.Status, &opErr, &created, &finished, &steps); err != nil {
		return Operation{}, err
	}
	var err error
	if op.Error, err = fromErrorJSON("error", opErr); err != nil {
		return Operation{}, err
	}
	if steps.Valid {
		if err := json.Unmarshal([]byte(steps.String), &op.Timings); err != nil {
			return Operation{}, fmt.Errorf("operation %s: timings: %w", op.ID, err)
		}
	}
	op.CreatedAt = fromNanos(created)
	op.FinishedAt = fromNullNanos(finished)
	return op, nil
}

// timingsJSON is t as stored: NULL when there are no steps.
func timingsJSON(t timings.Timings) any {
	if len(t) == 0 {
		return nil
	}
	b, err := json.Marshal(t)
	if err != nil {
		return nil // a float that cannot be written; not worth failing the operation
	}
	return string(b)
}

// View is the operation as the API shows it.
func (op Operation) View() apiv1.Operation {
	v := apiv1.Operation{ID: op.ID, Kind: op.Kind, TargetID: op.TargetID, Status: op.Status,
		CreatedAt: op.CreatedAt, FinishedAt: op.FinishedAt, Timings: op.Timings}
	if op.Error != nil {
		v.Error = &apiv1.Status{Code: op.Error.Code, Message: op.Error.Message}
	}
	return v
}
