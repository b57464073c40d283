package sessions

// What E2B's envd layer (internal/e2b/envd) needs beyond the native API:
// the running commands of a sandbox with their requests, a start that
// keeps a note beside the command (E2B's process tag and config), and an
// attach that starts at the present rather than at the first event.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// MaxCommandNote bounds a command's note.
const MaxCommandNote = 64 << 10

// RunningCommand is a running command of a sandbox: its state, the
// request it was created with, and the note set on it (nil if none).
type RunningCommand struct {
	apiv1.Command
	Request apiv1.CommandRequest
	Note    []byte
}

// SetCommandNote keeps note beside command id, for the API layer that
// created it (E2B's envd layer keeps a process's tag and config there).
// Commands does not read it; it goes with the sandbox's directory.
func (c *Commands) SetCommandNote(ctx context.Context, p tenancy.Principal, id string, note []byte) error {
	if len(note) > MaxCommandNote {
		return fmt.Errorf("a command note is %d bytes, over %d: %w", len(note), MaxCommandNote, errdefs.ErrInvalid)
	}
	rec, err := c.getCommand(ctx, p, id)
	if err != nil {
		return err
	}
	return c.writeNote(rec.SandboxID, rec.ID, note)
}

func (c *Commands) writeNote(sbx, id string, note []byte) error {
	path := c.notePath(sbx, id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("keep note of command %s: %w", id, err)
	}
	_, err := atomicfile.Write(path, 0o600, func(w io.Writer) error {
		_, err := w.Write(note)
		return err
	})
	return err
}

// StartCommand creates a command in sandbox sbx, keeps note beside it and
// starts it: CreateCommand, SetCommandNote and the first Attach in one
// step, so that the note is there before the process runs. It returns the
// command's ID and its stream from the first event.
func (c *Commands) StartCommand(ctx context.Context, p tenancy.Principal, sbx string, req apiv1.CommandRequest, note []byte) (string, *command.Stream, error) {
	if len(note) > MaxCommandNote {
		return "", nil, fmt.Errorf("a command note is %d bytes, over %d: %w", len(note), MaxCommandNote, errdefs.ErrInvalid)
	}
	sess, err := c.CreateCommand(ctx, p, sbx, req)
	if err != nil {
		return "", nil, err
	}
	if err := c.writeNote(sbx, sess.ID, note); err != nil {
		return "", nil, err
	}
	st, err := c.Attach(ctx, AttachAuth{Principal: &p}, sess.ID, 0)
	if err != nil {
		return "", nil, err
	}
	return sess.ID, st, nil
}

// RunningCommands lists the commands of sandbox sbx that p owns and that
// run now (started, not yet exited), in creation order.
func (c *Commands) RunningCommands(ctx context.Context, p tenancy.Principal, sbx string) ([]RunningCommand, error) {
	if _, err := c.sb.Owned(ctx, p, sbx); err != nil {
		return nil, err
	}
	rows, err := c.st.ListCommandsByState(ctx, apiv1.CommandRunning)
	if err != nil {
		return nil, err
	}
	out := []RunningCommand{}
	for _, rec := range rows {
		if rec.SandboxID != sbx || !p.Owns(rec.Owner) || rec.PID <= 0 {
			continue
		}
		rc := RunningCommand{Command: commandView(rec)}
		if err := json.Unmarshal(rec.Request, &rc.Request); err != nil {
			return nil, fmt.Errorf("command %s has an unreadable request: %w", rec.ID, err)
		}
		note, err := os.ReadFile(c.notePath(sbx, rec.ID))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read note of command %s: %w", rec.ID, err)
		}
		if len(note) <= MaxCommandNote {
			rc.Note = note
		}
		out = append(out, rc)
	}
	return out, nil
}

// AttachNow attaches to a started command from the present on: its stream
// gives the events logged after this call, or only the exit event if the
// command has exited already. Unlike Attach it never starts a command.
func (c *Commands) AttachNow(ctx context.Context, p tenancy.Principal, id string) (*command.Stream, error) {
	rec, err := c.getCommand(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if rec.State == apiv1.CommandCreated {
		return nil, fmt.Errorf("command %s has not started: %w", id, errdefs.ErrConflict)
	}
	lifetime, ok := c.sb.Live(rec.SandboxID)
	if !ok {
		return nil, fmt.Errorf("command %s cannot be reached: its sandbox %s is not running: %w", id, rec.SandboxID, errdefs.ErrConflict)
	}
	sess, err := c.open(rec, lifetime)
	if err != nil {
		return nil, err
	}
	return c.Attach(ctx, AttachAuth{Principal: &p}, id, sess.Present())
}
