package service

// What E2B's envd layer (internal/e2b/envd) needs beyond the native API:
// a sandbox's default environment, stats that keep a symlink's target,
// the running commands of a sandbox with their requests, a start that
// keeps a note beside the command (E2B's process tag and config), and an
// attach that starts at the present rather than at the first event.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// SandboxEnv returns the default environment of a sandbox's commands, as
// it was given at create.
func (s *Service) SandboxEnv(ctx context.Context, p Principal, id string) (map[string]string, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return nil, err
	}
	env := maps.Clone(sb.Env)
	if env == nil {
		env = map[string]string{}
	}
	return env, nil
}

// Entry describes a path in a sandbox without following a final symlink;
// Target is a symlink's destination as the link reads, "" for the rest.
type Entry struct {
	apiv1.Stat
	Target string
}

func entryView(st agentproto.Stat) Entry {
	return Entry{Stat: statView(st), Target: st.Target}
}

// StatEntry describes path, keeping a symlink's target.
func (s *Service) StatEntry(ctx context.Context, p Principal, sbx, path string) (Entry, error) {
	agent, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return Entry{}, err
	}
	st, err := agent.Stat(ctx, path)
	if err != nil {
		return Entry{}, err
	}
	return entryView(st), nil
}

// ListEntries describes the entries under dir, depth levels deep (1 to
// MaxListDepth), keeping symlinks' targets.
func (s *Service) ListEntries(ctx context.Context, p Principal, sbx, dir string, depth int) ([]Entry, error) {
	if depth < 1 || depth > MaxListDepth {
		return nil, fmt.Errorf("depth %d is out of bounds: use 1 to %d: %w", depth, MaxListDepth, errdefs.ErrInvalid)
	}
	agent, err := s.filesOf(ctx, p, sbx, dir)
	if err != nil {
		return nil, err
	}
	sts, err := agent.List(ctx, dir, depth)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(sts))
	for _, st := range sts {
		out = append(out, entryView(st))
	}
	return out, nil
}

// MaxCommandNote bounds a command's note.
const MaxCommandNote = 64 << 10

// RunningCommand is a running command of a sandbox: its state, the
// request it was created with, and the note set on it (nil if none).
type RunningCommand struct {
	apiv1.Command
	Request apiv1.CommandRequest
	Note    []byte
}

func (s *Service) commandNotePath(sbx, id string) string {
	return filepath.Join(s.sandboxDir(sbx), "commands", id+".note")
}

// SetCommandNote keeps note beside command id, for the API layer that
// created it (E2B's envd layer keeps a process's tag and config there).
// The service does not read it; it goes with the sandbox's directory.
func (s *Service) SetCommandNote(ctx context.Context, p Principal, id string, note []byte) error {
	if len(note) > MaxCommandNote {
		return fmt.Errorf("a command note is %d bytes, over %d: %w", len(note), MaxCommandNote, errdefs.ErrInvalid)
	}
	rec, err := s.getCommand(ctx, p, id)
	if err != nil {
		return err
	}
	return s.writeNote(rec.SandboxID, rec.ID, note)
}

func (s *Service) writeNote(sbx, id string, note []byte) error {
	path := s.commandNotePath(sbx, id)
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
func (s *Service) StartCommand(ctx context.Context, p Principal, sbx string, req apiv1.CommandRequest, note []byte) (string, *command.Stream, error) {
	if len(note) > MaxCommandNote {
		return "", nil, fmt.Errorf("a command note is %d bytes, over %d: %w", len(note), MaxCommandNote, errdefs.ErrInvalid)
	}
	sess, err := s.CreateCommand(ctx, p, sbx, req)
	if err != nil {
		return "", nil, err
	}
	if err := s.writeNote(sbx, sess.ID, note); err != nil {
		return "", nil, err
	}
	st, err := s.Attach(ctx, AttachAuth{Principal: &p}, sess.ID, 0)
	if err != nil {
		return "", nil, err
	}
	return sess.ID, st, nil
}

// RunningCommands lists the commands of sandbox sbx that p owns and that
// run now (started, not yet exited), in creation order.
func (s *Service) RunningCommands(ctx context.Context, p Principal, sbx string) ([]RunningCommand, error) {
	if _, err := s.getOwned(ctx, p, sbx); err != nil {
		return nil, err
	}
	rows, err := s.st.ListCommandsByState(ctx, apiv1.CommandRunning)
	if err != nil {
		return nil, err
	}
	out := []RunningCommand{}
	for _, rec := range rows {
		if rec.SandboxID != sbx || !p.owns(rec.Owner) || rec.PID <= 0 {
			continue
		}
		rc := RunningCommand{Command: commandView(rec)}
		if err := json.Unmarshal(rec.Request, &rc.Request); err != nil {
			return nil, fmt.Errorf("command %s has an unreadable request: %w", rec.ID, err)
		}
		note, err := os.ReadFile(s.commandNotePath(sbx, rec.ID))
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
func (s *Service) AttachNow(ctx context.Context, p Principal, id string) (*command.Stream, error) {
	rec, err := s.getCommand(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if rec.State == apiv1.CommandCreated {
		return nil, fmt.Errorf("command %s has not started: %w", id, errdefs.ErrConflict)
	}
	lv := s.getLive(rec.SandboxID)
	if lv == nil {
		return nil, fmt.Errorf("command %s cannot be reached: its sandbox %s is not running: %w", id, rec.SandboxID, errdefs.ErrConflict)
	}
	c, err := lv.command(rec)
	if err != nil {
		return nil, err
	}
	return s.Attach(ctx, AttachAuth{Principal: &p}, id, c.Present())
}
