package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Checkpoint is a sandbox's memory, devices and disk at one instant, kept
// on the host that made it.
type Checkpoint struct {
	ID        string
	Owner     string
	SandboxID string
	Name      string
	// State is one of apiv1's Checkpoint* states.
	State          string
	TemplateRef    string
	TemplateDigest string
	VCPUs          int
	MemoryMiB      int
	DiskMiB        int
	SizeBytes      int64
	// Env and Network are the sandbox's at the instant: what sandboxes
	// made from the checkpoint start with unless told otherwise.
	Env     map[string]string
	Network json.RawMessage
	// Node is the host that holds it; "" on a single host.
	Node      string
	Error     *Error
	CreatedAt time.Time
}

const checkpointColumns = "id, owner, sandbox_id, name, state, template_ref, template_digest, vcpus, memory_mib, disk_mib, size_bytes, env, network, node, error, created_at"

// InsertCheckpoint stores c. With max set, the owner may hold at most
// *max checkpoints with it: one more is errdefs.ErrExhausted, checked in
// the transaction that inserts it. A taken ID is a conflict.
func (s *Store) InsertCheckpoint(ctx context.Context, c Checkpoint, max *int64) error {
	if err := requireID("insert checkpoint", c.ID); err != nil {
		return err
	}
	if c.CreatedAt.IsZero() {
		c.CreatedAt = now()
	}
	env, err := stringMap(c.Env)
	if err != nil {
		return fmt.Errorf("insert checkpoint %s: %w", c.ID, err)
	}
	network, err := rawJSON("network", c.Network)
	if err != nil {
		return fmt.Errorf("insert checkpoint %s: %w", c.ID, err)
	}
	cErr, err := errorJSON(c.Error)
	if err != nil {
		return fmt.Errorf("insert checkpoint %s: %w", c.ID, err)
	}
	return s.inTx(ctx, func(t *tx) error {
		// Rows commit in seq order (pages stay stable), and two inserts
		// of one owner cannot both pass the count.
		if err := t.lockSeq(ctx, "checkpoints"); err != nil {
			return fmt.Errorf("insert checkpoint %s: %w", c.ID, classify(err))
		}
		if max != nil {
			var n int64
			if err := t.QueryRowContext(ctx, "SELECT COUNT(*) FROM checkpoints WHERE owner = ?", c.Owner).Scan(&n); err != nil {
				return fmt.Errorf("insert checkpoint %s: %w", c.ID, classify(err))
			}
			if n >= *max {
				return fmt.Errorf("the key holds %d checkpoints, its limit (checkpoints=%d): delete one and retry: %w", n, *max, errdefs.ErrExhausted)
			}
		}
		_, err := t.ExecContext(ctx, "INSERT INTO checkpoints ("+checkpointColumns+") VALUES ("+placeholders(16)+")",
			c.ID, c.Owner, c.SandboxID, c.Name, c.State, c.TemplateRef, c.TemplateDigest, c.VCPUs, c.MemoryMiB, c.DiskMiB,
			c.SizeBytes, env, network, c.Node, cErr, nanos(c.CreatedAt))
		if isUniqueViolation(err) {
			return fmt.Errorf("insert checkpoint %s: the ID is taken: %w", c.ID, errdefs.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("insert checkpoint %s: %w", c.ID, classify(err))
		}
		return nil
	})
}

// GetCheckpoint returns the checkpoint with the given ID.
func (s *Store) GetCheckpoint(ctx context.Context, id string) (Checkpoint, error) {
	return getByID(ctx, s.db, "checkpoint", "checkpoints", checkpointColumns, id, scanCheckpoint)
}

// CheckpointFilter selects checkpoints: of Owner ("" for every owner's),
// of SandboxID ("" for every sandbox's), after the one named After (a
// page cursor), at most Limit.
type CheckpointFilter struct {
	Owner     string
	SandboxID string
	After     string
	Limit     int
}

// ListCheckpoints returns the checkpoints f selects, oldest first.
func (s *Store) ListCheckpoints(ctx context.Context, f CheckpointFilter) ([]Checkpoint, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("list checkpoints: limit %d is not positive: %w", f.Limit, errdefs.ErrInvalid)
	}
	q, args := "SELECT "+checkpointColumns+" FROM checkpoints WHERE 1 = 1", []any{}
	if f.Owner != "" {
		q, args = q+" AND owner = ?", append(args, f.Owner)
	}
	if f.SandboxID != "" {
		q, args = q+" AND sandbox_id = ?", append(args, f.SandboxID)
	}
	if f.After != "" {
		seq, err := seqOf(ctx, s.db, "checkpoints", f.After, "")
		if err != nil {
			return nil, err
		}
		q, args = q+" AND seq > ?", append(args, seq)
	}
	rows, err := s.db.QueryContext(ctx, q+" ORDER BY seq LIMIT ?", append(args, f.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", classify(err))
	}
	defer rows.Close()
	out := []Checkpoint{}
	for rows.Next() {
		c, err := scanCheckpoint(rows)
		if err != nil {
			return nil, fmt.Errorf("list checkpoints: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", classify(err))
	}
	return out, nil
}

// FinishCheckpoint records the end of a checkpoint's making: its state
// (ready or failed), size and error, with its event, in one transaction.
// A checkpoint deleted meanwhile is errdefs.ErrNotFound.
func (s *Store) FinishCheckpoint(ctx context.Context, c Checkpoint) error {
	cErr, err := errorJSON(c.Error)
	if err != nil {
		return fmt.Errorf("finish checkpoint %s: %w", c.ID, err)
	}
	ty := map[string]string{apiv1.CheckpointReady: apiv1.EventCheckpointReady, apiv1.CheckpointFailed: apiv1.EventCheckpointFailed}[c.State]
	if ty == "" {
		return fmt.Errorf("finish checkpoint %s: state %q is not ready or failed: %w", c.ID, c.State, errdefs.ErrInvalid)
	}
	err = s.inTx(ctx, func(t *tx) error {
		res, err := t.ExecContext(ctx, "UPDATE checkpoints SET state = ?, size_bytes = ?, error = ? WHERE id = ?", c.State, c.SizeBytes, cErr, c.ID)
		if err != nil {
			return classify(err)
		}
		if err := mustAffect(res, "checkpoint", c.ID); err != nil {
			return err
		}
		return checkpointEvent(ctx, t, ty, c.ID)
	})
	if err != nil {
		return fmt.Errorf("finish checkpoint %s: %w", c.ID, err)
	}
	return nil
}

// DeleteCheckpoint removes checkpoint id's row, with its event.
func (s *Store) DeleteCheckpoint(ctx context.Context, id string) error {
	err := s.inTx(ctx, func(t *tx) error {
		if err := checkpointEvent(ctx, t, apiv1.EventCheckpointDeleted, id); err != nil {
			return err
		}
		res, err := t.ExecContext(ctx, "DELETE FROM checkpoints WHERE id = ?", id)
		if err != nil {
			return classify(err)
		}
		return mustAffect(res, "checkpoint", id)
	})
	if err != nil {
		return fmt.Errorf("delete checkpoint %s: %w", id, err)
	}
	return nil
}

// DiscardCheckpoint removes checkpoint id's row without an event: one
// whose making never began, of which nothing was announced.
func (s *Store) DiscardCheckpoint(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM checkpoints WHERE id = ?", id); err != nil {
		return fmt.Errorf("discard checkpoint %s: %w", id, classify(err))
	}
	return nil
}

// checkpointEvent writes event ty of checkpoint id, as its row in t has it.
func checkpointEvent(ctx context.Context, t *tx, ty, id string) error {
	c, err := scanCheckpoint(t.QueryRowContext(ctx, "SELECT "+checkpointColumns+" FROM checkpoints WHERE id = ?", id))
	if err == sql.ErrNoRows {
		return fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return classify(err)
	}
	data, _ := json.Marshal(struct { // strings, numbers: cannot fail
		CheckpointID string `json:"checkpoint_id"`
		Name         string `json:"name"`
		SizeBytes    int64  `json:"size_bytes"`
		Error        *Error `json:"error,omitempty"`
	}{c.ID, c.Name, c.SizeBytes, c.Error})
	return appendEvent(ctx, t, Event{Owner: c.Owner, Type: ty, SandboxID: c.SandboxID, Data: data})
}

// CountCheckpoints returns how many checkpoints owner holds.
func (s *Store) CountCheckpoints(ctx context.Context, owner string) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM checkpoints WHERE owner = ?", owner).Scan(&n); err != nil {
		return 0, fmt.Errorf("count checkpoints: %w", classify(err))
	}
	return n, nil
}

func scanCheckpoint(r scanner) (Checkpoint, error) {
	var c Checkpoint
	var env string
	var network, cErr sql.NullString
	var created int64
	if err := r.Scan(&c.ID, &c.Owner, &c.SandboxID, &c.Name, &c.State, &c.TemplateRef, &c.TemplateDigest, &c.VCPUs, &c.MemoryMiB,
		&c.DiskMiB, &c.SizeBytes, &env, &network, &c.Node, &cErr, &created); err != nil {
		return Checkpoint{}, err
	}
	var err error
	if c.Env, err = fromStringMap("env", env); err != nil {
		return Checkpoint{}, err
	}
	if c.Error, err = fromErrorJSON("error", cErr); err != nil {
		return Checkpoint{}, err
	}
	c.Network = fromRawJSON(network)
	c.CreatedAt = fromNanos(created)
	return c, nil
}
