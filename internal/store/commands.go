package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Command is a process session in a sandbox: created by one call, started by
// the first attach.
type Command struct {
	// ID names the command ("cmd…").
	ID string
	// SandboxID is the sandbox it runs in.
	SandboxID string
	// Owner is the ID of the key that created it.
	Owner string
	// Request is the API request as given, as JSON.
	Request json.RawMessage
	// State is created, running or exited.
	State string
	// AgentID is the guest agent's ID of the process ("p3"); "" until started.
	AgentID string
	// PID is the process ID in the guest; 0 until started.
	PID int
	// ExitCode is the exit status; nil until it exits, and if killed by a signal.
	ExitCode *int
	// Signal names the signal that ended the process ("KILL"); nil if none did.
	Signal *string
	// TimedOut tells that the command's timeout killed it.
	TimedOut bool
	// TokenHash is the sha256 of the attach token's secret.
	TokenHash []byte
	// TokenExpiresAt is when the attach token stops being accepted.
	TokenExpiresAt time.Time
	// TokenSpent tells that the attach token has been used.
	TokenSpent bool
	// CreatedAt is when it was created; the zero time means now.
	CreatedAt time.Time
	// StartedAt is when the process started; nil until then.
	StartedAt *time.Time
	// FinishedAt is when the process ended; nil until then.
	FinishedAt *time.Time
}

const commandColumns = "id, sandbox_id, owner, request, state, agent_id, pid, exit_code, signal, timed_out, " +
	"token_hash, token_expires_at, token_spent, created_at, started_at, finished_at"

// InsertCommand stores c. Its sandbox must exist, else the error wraps
// errdefs.ErrNotFound; a command with the same ID is a conflict.
func (s *Store) InsertCommand(ctx context.Context, c Command) error {
	if err := requireID("insert command", c.ID); err != nil {
		return err
	}
	if c.CreatedAt.IsZero() {
		c.CreatedAt = now()
	}
	request, err := rawJSON("request", c.Request)
	if err != nil {
		return fmt.Errorf("insert command %s: %w", c.ID, err)
	}
	err = s.inSeqOrder(ctx, "commands", func(q queryer) error {
		_, err := q.ExecContext(ctx, "INSERT INTO commands ("+commandColumns+") VALUES ("+placeholders(16)+")",
			c.ID, c.SandboxID, c.Owner, request, c.State, c.AgentID, c.PID, nullInt(c.ExitCode), nullString(c.Signal),
			boolInt(c.TimedOut), nonNil(c.TokenHash), nanos(c.TokenExpiresAt), boolInt(c.TokenSpent), nanos(c.CreatedAt),
			nullNanos(c.StartedAt), nullNanos(c.FinishedAt))
		return err
	})
	switch {
	case isUniqueViolation(err):
		return fmt.Errorf("insert command %s: the ID is taken: %w", c.ID, errdefs.ErrConflict)
	case isForeignKeyViolation(err):
		return fmt.Errorf("insert command %s: sandbox %s: %w", c.ID, c.SandboxID, errdefs.ErrNotFound)
	case err != nil:
		return fmt.Errorf("insert command %s: %w", c.ID, classify(err))
	}
	return nil
}

// GetCommand returns the command with the given ID.
func (s *Store) GetCommand(ctx context.Context, id string) (Command, error) {
	return getByID(ctx, s.db, "command", "commands", commandColumns, id, scanCommand)
}

// UpdateCommand replaces the record of the command with c's ID by c. Its
// sandbox, owner, request, creation time and attach token are fixed at
// insert and are not changed; SpendCommandToken alone spends the token.
func (s *Store) UpdateCommand(ctx context.Context, c Command) error {
	res, err := s.db.ExecContext(ctx, "UPDATE commands SET state = ?, agent_id = ?, pid = ?, exit_code = ?, signal = ?,"+
		" timed_out = ?, started_at = ?, finished_at = ?"+
		" WHERE id = ?",
		c.State, c.AgentID, c.PID, nullInt(c.ExitCode), nullString(c.Signal), boolInt(c.TimedOut),
		nullNanos(c.StartedAt), nullNanos(c.FinishedAt), c.ID)
	if err != nil {
		return fmt.Errorf("update command %s: %w", c.ID, classify(err))
	}
	return mustAffect(res, "command", c.ID)
}

// SpendCommandToken marks the attach token of command id as used, once: if
// it was already used the error wraps errdefs.ErrConflict. Two attaches that
// race with the same token cannot both win.
func (s *Store) SpendCommandToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, "UPDATE commands SET token_spent = 1 WHERE id = ? AND token_spent = 0", id)
	if err != nil {
		return fmt.Errorf("spend token of command %s: %w", id, classify(err))
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("spend token of command %s: %w", id, err)
	} else if n == 1 {
		return nil
	}
	if _, err := s.GetCommand(ctx, id); err != nil {
		return err
	}
	return fmt.Errorf("command %s: the attach token was already used: %w", id, errdefs.ErrConflict)
}

// ListCommands returns the commands of a sandbox in creation order, created
// after the command after ("" for the first page), at most limit of them.
// A cursor that names no command of that sandbox is invalid.
func (s *Store) ListCommands(ctx context.Context, sandboxID, after string, limit int) ([]Command, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("list commands: limit %d is not positive: %w", limit, errdefs.ErrInvalid)
	}
	var from int64
	if after != "" {
		seq, err := seqOf(ctx, s.db, "commands", after, sandboxID)
		if err != nil {
			return nil, fmt.Errorf("list commands of sandbox %s: %w", sandboxID, err)
		}
		from = seq
	}
	return s.listCommands(ctx, "WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?", sandboxID, from, limit)
}

// ListCommandsByState returns every command in the given state, in creation
// order.
func (s *Store) ListCommandsByState(ctx context.Context, state string) ([]Command, error) {
	return s.listCommands(ctx, "WHERE state = ? ORDER BY seq", state)
}

// listCommands returns the commands that the clause (WHERE … ORDER BY …)
// selects.
func (s *Store) listCommands(ctx context.Context, clause string, args ...any) ([]Command, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT "+commandColumns+" FROM commands "+clause, args...)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", classify(err))
	}
	defer rows.Close()
	list := []Command{}
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, fmt.Errorf("list commands: %w", err)
		}
		list = append(list, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list commands: %w", classify(err))
	}
	return list, nil
}

// scanCommand reads a row of commandColumns.
func scanCommand(r scanner) (Command, error) {
	var c Command
	var request, signal sql.NullString
	var exitCode, started, finished sql.NullInt64
	var tokenExpires, created int64
	err := r.Scan(&c.ID, &c.SandboxID, &c.Owner, &request, &c.State, &c.AgentID, &c.PID, &exitCode, &signal,
		&c.TimedOut, &c.TokenHash, &tokenExpires, &c.TokenSpent, &created, &started, &finished)
	if err != nil {
		return Command{}, err
	}
	c.TokenHash = nonNil(c.TokenHash)
	c.Request = fromRawJSON(request)
	if exitCode.Valid {
		code := int(exitCode.Int64)
		c.ExitCode = &code
	}
	if signal.Valid {
		c.Signal = &signal.String
	}
	c.TokenExpiresAt = fromNanos(tokenExpires)
	c.CreatedAt = fromNanos(created)
	c.StartedAt = fromNullNanos(started)
	c.FinishedAt = fromNullNanos(finished)
	return c, nil
}

// nullInt converts an optional int to a column value, NULL for nil.
func nullInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// nullString converts an optional string to a column value, NULL for nil.
func nullString(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}
