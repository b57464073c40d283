package store

import (
	"context"
	"fmt"
	"strings"
)

// Usage is what one key's sandboxes and builds hold, in the units of
// apiv1.Limits.
type Usage struct {
	// Sandboxes and DiskMiB count every sandbox not deleted.
	Sandboxes, DiskMiB int64
	// VCPUs and MemoryMiB count the sandboxes whose VM holds memory:
	// MemoryStates.
	VCPUs, MemoryMiB int64
	// SuspendedMiB counts the memory of suspended sandboxes: the images
	// on disk are at most that.
	SuspendedMiB int64
	// Builds counts the builds still building.
	Builds int64
	// Checkpoints counts the checkpoints, of any state.
	Checkpoints int64
}

// MemoryStates are the states of a sandbox whose VM holds memory, or is
// being given it.
var MemoryStates = []string{"creating", "running", "paused", "suspending", "waking"}

// KeyUsage returns what owner's sandboxes and builds hold now.
func (s *Store) KeyUsage(ctx context.Context, owner string) (Usage, error) {
	return usageOf(ctx, s.db, owner)
}

func usageOf(ctx context.Context, q queryer, owner string) (Usage, error) {
	var u Usage
	inMemory := "state IN ('" + strings.Join(MemoryStates, "', '") + "')"
	err := q.QueryRowContext(ctx, "SELECT count(*), coalesce(sum(disk_mib), 0), "+
		"coalesce(sum(CASE WHEN "+inMemory+" THEN vcpus ELSE 0 END), 0), "+
		"coalesce(sum(CASE WHEN "+inMemory+" THEN memory_mib ELSE 0 END), 0), "+
		"coalesce(sum(CASE WHEN state = 'suspended' THEN memory_mib ELSE 0 END), 0) "+
		"FROM sandboxes WHERE owner = ? AND state <> 'deleted'", owner).
		Scan(&u.Sandboxes, &u.DiskMiB, &u.VCPUs, &u.MemoryMiB, &u.SuspendedMiB)
	if err == nil {
		err = q.QueryRowContext(ctx, "SELECT count(*) FROM builds WHERE owner = ? AND status = 'building'", owner).Scan(&u.Builds)
	}
	if err == nil {
		err = q.QueryRowContext(ctx, "SELECT count(*) FROM checkpoints WHERE owner = ?", owner).Scan(&u.Checkpoints)
	}
	if err != nil {
		return Usage{}, fmt.Errorf("usage of key %s: %w", owner, classify(err))
	}
	return u, nil
}

// InsertSandboxWithin is InsertSandbox that first asks admit whether the
// owner, holding what it holds now, may have sb too. Inserts of sandboxes
// are serialized (one writer on SQLite, an advisory lock on PostgreSQL),
// so two that race cannot both pass the last of a limit, whichever server
// made them. An error from admit is returned as it is, and nothing is
// written. A nil admit admits anything, without counting.
func (s *Store) InsertSandboxWithin(ctx context.Context, sb Sandbox, op Operation, admit func(Usage) error) error {
	if admit == nil {
		return s.InsertSandbox(ctx, sb, op)
	}
	return s.insertSandbox(ctx, sb, op, func(t *tx) error {
		u, err := usageOf(ctx, t, sb.Owner)
		if err != nil {
			return err
		}
		return admit(u)
	})
}
