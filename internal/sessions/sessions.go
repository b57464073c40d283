// Package sessions keeps the command sessions of the sandboxes this
// server looks after: the command records in the store, each command's
// event log (internal/command) and its attach tokens; starting a
// command's process on a sandbox's VM at its first attach, following it
// to its exit, re-attaching to it after a suspend and wake or a server
// restart so that its stream goes on whole, and ending it when its
// sandbox stops; stdin, signals and terminal size; and the one-shot exec,
// whose output waits on disk (ExecOutput).
//
// Commands is the type that does it. It sits beside the service, which
// keeps the sandboxes and orders their lifecycle: Commands asks the
// service about sandboxes through Sandboxes (who may see one, and the VM
// of one running here), and the service tells Commands at each lifecycle
// point (Resume after a wake or an adoption, Wait after a suspend, Lost,
// EndOpen, Close and End when a sandbox's VM or the sandbox goes). The
// edges (internal/api, E2B's envd) call Commands for the command routes
// and encode its typed events their own way.
//
// Tenancy is checked here as in the service: a key sees only its own
// sandboxes' commands (tenancy.Principal.Owns); an attach token is good
// for its own command only, and answers the same for a command that does
// not exist as for one it is not valid for.
//
// Lifetimes: each command process followed has one goroutine (its pump,
// waitCommand), which ends with the process, or when its VM's context
// ends (the sandbox was suspended, its VM lost, or the server let go of
// it); Wait and Close wait for a sandbox's pumps.
//
// On disk, in the sandbox's directory: commands/<id>.log, a command's
// event log, and commands/<id>.note, the note an edge keeps beside a
// command (SetCommandNote); exec output in unlinked files under
// tmp/exec in the data directory.
package sessions

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// Sandboxes is what Commands asks of the side that keeps the sandboxes
// (the service).
type Sandboxes interface {
	// Owned returns sandbox id if p may see it, else an error wrapping
	// errdefs.ErrNotFound.
	Owned(ctx context.Context, p tenancy.Principal, id string) (store.Sandbox, error)
	// Running returns nil if p may see sandbox id and it runs with a VM
	// on this server, else an error: not found as Owned's, or a conflict
	// naming its state.
	Running(ctx context.Context, p tenancy.Principal, id string) error
	// Use readies sandbox id, which the caller has checked it may use,
	// for a call that needs it running: a sandbox that wakes on request
	// is woken from paused or suspended and waited for. The call uses the
	// sandbox, which is then not idle, until release (docs/api.md, "Idle
	// sandboxes"). An error says why the wake failed; a sandbox that
	// cannot be woken is left as it is, for the caller's own checks.
	Use(ctx context.Context, id string) (release func(), err error)
	// Hold records a use of sandbox id, a command's process that runs,
	// until release.
	Hold(id string) (release func())
	// Live returns the lifetime of sandbox id on this server, which ends
	// when the server lets go of it (deleted, released, its VM lost); ok
	// is false when this server does not look after it (it holds neither
	// its VM nor its suspended state).
	Live(id string) (lifetime context.Context, ok bool)
	// VM returns the VM that runs sandbox id on this server and the VM's
	// context, which ends when the VM is suspended or lost or the server
	// lets go of it; an error wrapping errdefs.ErrConflict while it has
	// none.
	VM(id string) (VM, context.Context, error)
}

// VM is a running sandbox's VM as commands use it: its guest agent
// starts processes, re-attaches to them and reports their exit.
type VM interface {
	// Exec starts a process; its output goes to stdio.
	Exec(ctx context.Context, req agentproto.ExecRequest, stdio agentclient.Stdio) (*agentclient.Process, error)
	// Attach re-attaches to process id, its output from offset on.
	Attach(ctx context.Context, id string, offset int64, stdio agentclient.Stdio) (*agentclient.Process, error)
	// Wait waits for p's exit.
	Wait(p *agentclient.Process) (agentproto.Exit, error)
	// Done is closed when the VM has ended.
	Done() <-chan struct{}
}

// Config configures Commands.
type Config struct {
	// Dir is the data directory: command logs and notes are kept in each
	// sandbox's directory, exec output under Dir.Root/tmp/exec.
	Dir datadir.Dir
	// Store keeps the command records. Required.
	Store *store.Store
	// Sandboxes answers for the sandboxes. Required.
	Sandboxes Sandboxes
	// Log receives diagnostics. Default: discarded.
	Log *slog.Logger
	// Now tells the time of records and of token expiry. Default the
	// system's, in UTC to the millisecond.
	Now func() time.Time
	// Metrics counts commands; nil counts nothing.
	Metrics *Metrics
	// Streamed, if not nil, is told the size of each piece of command
	// output (airlock_streamed_bytes_total, which counts file content as
	// well).
	Streamed func(n int)
}

// Commands keeps the command sessions of the sandboxes this server looks
// after.
type Commands struct {
	cfg Config
	st  *store.Store
	sb  Sandboxes
	log *slog.Logger
	m   *Metrics

	mu    sync.Mutex                  // guards boxes, and the cmds of each box in it
	boxes map[string]*sandboxSessions // the sandboxes with open sessions, by ID
}

// sandboxSessions are one sandbox's open sessions and the pumps that
// feed them.
type sandboxSessions struct {
	cmds  map[string]*command.Session // commands with an open log, by ID
	pumps sync.WaitGroup              // each ends with its process or its VM's context
}

// New returns the command sessions of cfg.
func New(cfg Config) *Commands {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }
	}
	return &Commands{cfg: cfg, st: cfg.Store, sb: cfg.Sandboxes, log: cfg.Log, m: cfg.Metrics, boxes: map[string]*sandboxSessions{}}
}

func (c *Commands) now() time.Time { return c.cfg.Now() }

// streamed counts n bytes of output streamed.
func (c *Commands) streamed(n int) {
	if c.cfg.Streamed != nil && n > 0 {
		c.cfg.Streamed(n)
	}
}

func (c *Commands) logPath(sbx, id string) string {
	return filepath.Join(c.cfg.Dir.Sandbox(sbx), "commands", id+".log")
}

func (c *Commands) notePath(sbx, id string) string {
	return filepath.Join(c.cfg.Dir.Sandbox(sbx), "commands", id+".note")
}

// execTmp is where unary execs keep their output: in the data directory,
// on disk, not in the server's memory.
func (c *Commands) execTmp() string { return filepath.Join(c.cfg.Dir.Root, "tmp", "exec") }

// box returns sandbox sbx's open sessions, made if missing.
func (c *Commands) box(sbx string) *sandboxSessions {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boxLocked(sbx)
}

func (c *Commands) boxLocked(sbx string) *sandboxSessions {
	b := c.boxes[sbx]
	if b == nil {
		b = &sandboxSessions{cmds: map[string]*command.Session{}}
		c.boxes[sbx] = b
	}
	return b
}

// sessions returns sandbox sbx's open sessions.
func (c *Commands) sessions(sbx string) []*command.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.boxes[sbx]
	if b == nil {
		return nil
	}
	out := make([]*command.Session, 0, len(b.cmds))
	for _, s := range b.cmds {
		out = append(out, s)
	}
	return out
}

// Wait waits for the pumps of sandbox sbx's commands, after the service
// ended its VM's context (a suspend): each lets go of its process and the
// session stays open for the wake's Resume.
func (c *Commands) Wait(sbx string) {
	c.mu.Lock()
	b := c.boxes[sbx]
	c.mu.Unlock()
	if b != nil {
		b.pumps.Wait()
	}
}

// EndOpen ends the stream of every open session of sandbox sbx, whose
// processes can no longer be followed, so that their readers get an
// exit; "airlock: reason" is on their stderr.
func (c *Commands) EndOpen(sbx, reason string) { c.endOpen(sbx, reason, false) }

func (c *Commands) endOpen(sbx, reason string, rolledBack bool) {
	for _, s := range c.sessions(sbx) {
		end := s.End
		if rolledBack {
			end = s.RolledBack
		}
		if err := end(reason); err != nil {
			c.log.Error("log command's end", "command", s.ID(), "err", err)
		}
	}
}

// Lost ends the commands of sandbox sbx, whose VM exited under them after
// the service ended the VM's context: it waits for their pumps, ends
// their open streams and their records (End), and forgets the sandbox's
// sessions, leaving their logs to the readers still on them.
func (c *Commands) Lost(sbx, reason string) { c.endAll(sbx, reason, false) }

// RolledBack ends the commands of sandbox sbx as Lost does, after the
// service ended the VM's context for a rollback to a checkpoint: each
// stream's exit says rolled_back, with no exit code, and so does each
// record. Processes the checkpoint holds run on in the guest, unfollowed.
func (c *Commands) RolledBack(sbx, reason string) { c.endAll(sbx, reason, true) }

func (c *Commands) endAll(sbx, reason string, rolledBack bool) {
	c.Wait(sbx)
	c.endOpen(sbx, reason, rolledBack)
	c.mu.Lock()
	delete(c.boxes, sbx)
	c.mu.Unlock()
	c.end(sbx, reason, rolledBack)
}

// Close waits up to grace for the pumps of sandbox sbx's commands, after
// the service ended its lifetime, and closes its sessions' logs: the
// server lets go of the sandbox (a delete, or its own shutdown).
func (c *Commands) Close(sbx string, grace time.Duration) {
	c.mu.Lock()
	b := c.boxes[sbx]
	delete(c.boxes, sbx)
	c.mu.Unlock()
	if b == nil {
		return
	}
	done := make(chan struct{})
	go func() { b.pumps.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		c.log.Warn("command output pumps did not end", "sandbox", sbx)
	}
	for _, s := range b.cmds {
		if err := s.Close(); err != nil {
			c.log.Warn("close command log", "command", s.ID(), "err", err)
		}
	}
}
