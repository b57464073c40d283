// Package checkpoint keeps sandboxes' checkpoints: a sandbox's memory,
// devices and disk at one instant, kept apart from it, that new sandboxes
// start from (forks) and the sandbox can return to (rollback). It records
// each in the store, with its events, counts them against the key's
// `checkpoints` limit, and has the sandbox service make them of a running
// VM (sandbox.Runtime.Checkpoint does the work) and remove their files
// once nothing stands on them.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// Sandboxes is what checkpoints ask of the sandbox service.
type Sandboxes interface {
	// Owned returns sandbox id as the store has it, when p may use it.
	Owned(ctx context.Context, p tenancy.Principal, id string) (store.Sandbox, error)
	// CheckpointVM begins a lifecycle operation of kind on sandbox id
	// that makes checkpoint chkID of its VM; done is told the outcome
	// before the operation ends.
	CheckpointVM(ctx context.Context, p tenancy.Principal, id, kind, chkID string, done func(sandbox.Checkpoint, error)) (store.Operation, error)
	// RollbackVM begins a lifecycle operation that returns sandbox id to
	// its checkpoint chkID.
	RollbackVM(ctx context.Context, p tenancy.Principal, id, chkID string) (apiv1.SandboxOperation, error)
	// CreateSandbox and DeleteSandbox are the service's, for forks.
	CreateSandbox(ctx context.Context, p tenancy.Principal, req apiv1.CreateSandbox) (apiv1.SandboxOperation, error)
	DeleteSandbox(ctx context.Context, p tenancy.Principal, id string) (apiv1.SandboxOperation, error)
	// KeyLimits are the limits in force for key.
	KeyLimits(ctx context.Context, key string) (apiv1.Limits, error)
	// RemoveCheckpoint removes a checkpoint's files from this host unless
	// a sandbox stands on them, and says whether it did;
	// CheckpointsOnHost lists those the host holds.
	RemoveCheckpoint(id string) (bool, error)
	CheckpointsOnHost() ([]string, error)
}

// Config configures a Service.
type Config struct {
	Store     *store.Store
	Sandboxes Sandboxes
	Log       *slog.Logger
	// SweepEvery is how often Run removes the files of deleted
	// checkpoints that sandboxes stood on then. Default: a minute.
	SweepEvery time.Duration
}

// Service keeps checkpoints.
type Service struct {
	cfg Config
	st  *store.Store
	sbx Sandboxes
	log *slog.Logger
}

// New returns the service.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.SweepEvery == 0 {
		cfg.SweepEvery = time.Minute
	}
	return &Service{cfg: cfg, st: cfg.Store, sbx: cfg.Sandboxes, log: cfg.Log}
}

// maxName bounds a checkpoint's name.
const maxName = 128

// Create begins a checkpoint of sandbox id, which must be running or
// paused and runs on.
func (s *Service) Create(ctx context.Context, p tenancy.Principal, id string, req apiv1.CreateCheckpoint) (apiv1.CheckpointOperation, error) {
	c, op, err := s.begin(ctx, p, id, apiv1.OpCheckpoint, req.Name)
	if err != nil {
		return apiv1.CheckpointOperation{}, err
	}
	return apiv1.CheckpointOperation{Checkpoint: view(c), Operation: op.View()}, nil
}

// begin records a checkpoint of sandbox id named name and has the
// service make it in an operation of kind.
func (s *Service) begin(ctx context.Context, p tenancy.Principal, id, kind, name string) (store.Checkpoint, store.Operation, error) {
	c, err := s.record(ctx, p, id, name)
	if err != nil {
		return c, store.Operation{}, err
	}
	op, err := s.start(ctx, p, kind, c)
	return c, op, err
}

// record checks a checkpoint of sandbox id and records it, creating.
func (s *Service) record(ctx context.Context, p tenancy.Principal, id, name string) (store.Checkpoint, error) {
	if len(name) > maxName {
		return store.Checkpoint{}, fmt.Errorf("name is %d bytes: at most %d: %w", len(name), maxName, errdefs.ErrInvalid)
	}
	if !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return store.Checkpoint{}, fmt.Errorf("name must be UTF-8 text without control characters: %w", errdefs.ErrInvalid)
	}
	sb, err := s.sbx.Owned(ctx, p, id)
	if err != nil {
		return store.Checkpoint{}, err
	}
	if sb.State != apiv1.StateRunning && sb.State != apiv1.StatePaused && sb.State != apiv1.StateSuspended {
		return store.Checkpoint{}, fmt.Errorf("sandbox %s is %s: a checkpoint needs it running, paused or suspended: %w", id, sb.State, errdefs.ErrConflict)
	}
	lim, err := s.sbx.KeyLimits(ctx, sb.Owner)
	if err != nil {
		return store.Checkpoint{}, err
	}
	c := store.Checkpoint{
		ID: sandbox.NewCheckpointID(), Owner: sb.Owner, SandboxID: sb.ID, Name: name, State: apiv1.CheckpointCreating,
		TemplateRef: sb.TemplateRef, TemplateDigest: sb.TemplateDigest, VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB,
		Env: sb.Env, Network: sb.Network, CreatedAt: time.Now().UTC(),
	}
	if err := s.st.InsertCheckpoint(ctx, c, lim.Checkpoints); err != nil {
		return c, err
	}
	return c, nil
}

// start has the service make recorded checkpoint c in an operation of
// kind. If it cannot begin, the record goes.
func (s *Service) start(ctx context.Context, p tenancy.Principal, kind string, c store.Checkpoint) (store.Operation, error) {
	op, err := s.sbx.CheckpointVM(ctx, p, c.SandboxID, kind, c.ID, func(cp sandbox.Checkpoint, err error) { s.finish(c, cp, err) })
	if err != nil {
		s.discard(ctx, c.ID)
	}
	return op, err
}

// discard removes the record of checkpoint id, whose making never began:
// nothing was announced of it.
func (s *Service) discard(ctx context.Context, id string) {
	if err := s.st.DiscardCheckpoint(context.WithoutCancel(ctx), id); err != nil {
		s.log.Warn("discard a checkpoint that never began", "checkpoint", id, "err", err)
	}
}

// finish records how the making of c ended.
func (s *Service) finish(c store.Checkpoint, cp sandbox.Checkpoint, err error) {
	ctx := context.Background()
	c.State, c.SizeBytes = apiv1.CheckpointReady, cp.SizeBytes
	if err != nil {
		st := store.ErrorOf(err)
		c.State, c.Error = apiv1.CheckpointFailed, &st
		s.log.Warn("checkpoint failed", "checkpoint", c.ID, "sandbox", c.SandboxID, "err", err)
		if _, rerr := s.sbx.RemoveCheckpoint(c.ID); rerr != nil {
			s.log.Warn("remove a failed checkpoint's files", "checkpoint", c.ID, "err", rerr)
		}
	} else {
		s.log.Info("checkpoint ready", "checkpoint", c.ID, "sandbox", c.SandboxID, "stall", cp.Stall, "bytes", cp.SizeBytes)
	}
	if ferr := s.st.FinishCheckpoint(ctx, c); ferr != nil {
		// Deleted while it was made: its files go too.
		s.log.Warn("record the end of a checkpoint", "checkpoint", c.ID, "err", ferr)
		if errors.Is(ferr, errdefs.ErrNotFound) {
			s.remove(c.ID)
		}
	}
}

// Get returns checkpoint id, when p may see it.
func (s *Service) Get(ctx context.Context, p tenancy.Principal, id string) (apiv1.Checkpoint, error) {
	c, err := s.owned(ctx, p, id)
	if err != nil {
		return apiv1.Checkpoint{}, err
	}
	return view(c), nil
}

func (s *Service) owned(ctx context.Context, p tenancy.Principal, id string) (store.Checkpoint, error) {
	if err := fields.ID("checkpoint", "chk", id); err != nil {
		return store.Checkpoint{}, err
	}
	c, err := s.st.GetCheckpoint(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.Owns(c.Owner) {
		return store.Checkpoint{}, fmt.Errorf("checkpoint %s not found: %w", id, errdefs.ErrNotFound)
	}
	return c, err
}

// List returns a page of the checkpoints p may see, of sandbox sandboxID
// when it is set, oldest first: at most limit (fields.Limit), after the
// page token's.
func (s *Service) List(ctx context.Context, p tenancy.Principal, sandboxID, token string, limit int) (apiv1.List[apiv1.Checkpoint], error) {
	var none apiv1.List[apiv1.Checkpoint]
	if sandboxID != "" {
		if err := fields.ID("sandbox", "sbx", sandboxID); err != nil {
			return none, err
		}
	}
	n, err := fields.Limit(limit)
	if err != nil {
		return none, err
	}
	after := ""
	if token != "" {
		if after, err = fields.After(token, "chk"); err != nil {
			return none, err
		}
	}
	owner := p.KeyID
	if p.Admin() {
		owner = ""
	}
	cs, err := s.st.ListCheckpoints(ctx, store.CheckpointFilter{Owner: owner, SandboxID: sandboxID, After: after, Limit: n + 1})
	if err != nil {
		return none, err
	}
	out := apiv1.List[apiv1.Checkpoint]{Items: []apiv1.Checkpoint{}}
	for i, c := range cs {
		if i == n {
			out.NextPageToken = fields.PageToken(cs[i-1].ID)
			break
		}
		out.Items = append(out.Items, view(c))
	}
	return out, nil
}

// Delete deletes checkpoint id. Its files go now, or once no sandbox
// stands on them (Run sweeps). One being made is a conflict.
func (s *Service) Delete(ctx context.Context, p tenancy.Principal, id string) error {
	c, err := s.owned(ctx, p, id)
	if err != nil {
		return err
	}
	if c.State == apiv1.CheckpointCreating {
		return fmt.Errorf("checkpoint %s is being made: wait for its operation and retry: %w", id, errdefs.ErrConflict)
	}
	if err := s.st.DeleteCheckpoint(ctx, id); err != nil {
		return err
	}
	s.remove(id)
	return nil
}

// remove removes checkpoint id's files if nothing stands on them.
func (s *Service) remove(id string) {
	removed, err := s.sbx.RemoveCheckpoint(id)
	switch {
	case err != nil:
		s.log.Warn("remove a checkpoint's files", "checkpoint", id, "err", err)
	case !removed:
		s.log.Info("a deleted checkpoint's files stay while sandboxes stand on them", "checkpoint", id)
	}
}

// Fork makes a checkpoint of sandbox id and req.Count sandboxes from it,
// in one call: the sandboxes are recorded at once, and each is made once
// the checkpoint is ready, or fails with it. A child the key's limits or
// the host's refuse, or a checkpoint that cannot begin, ends the fork
// before anything is made: the children recorded so far are deleted and
// the error is the answer.
func (s *Service) Fork(ctx context.Context, p tenancy.Principal, id string, req apiv1.Fork) (apiv1.Forked, error) {
	if req.Count < 1 || req.Count > apiv1.MaxForks {
		return apiv1.Forked{}, fmt.Errorf("count %d is out of bounds: use 1 to %d: %w", req.Count, apiv1.MaxForks, errdefs.ErrInvalid)
	}
	c, err := s.record(ctx, p, id, "fork")
	if err != nil {
		return apiv1.Forked{}, err
	}
	out := apiv1.Forked{Checkpoint: c.ID, Sandboxes: []apiv1.Sandbox{}}
	undo := func() {
		for _, child := range out.Sandboxes {
			if _, derr := s.sbx.DeleteSandbox(context.WithoutCancel(ctx), p, child.ID); derr != nil {
				s.log.Warn("delete a child of a fork that failed", "sandbox", child.ID, "err", derr)
			}
		}
		s.discard(ctx, c.ID)
	}
	for range req.Count {
		so, err := s.sbx.CreateSandbox(ctx, p, apiv1.CreateSandbox{Checkpoint: c.ID, TimeoutS: req.TimeoutS, Metadata: req.Metadata})
		if err != nil {
			undo()
			return apiv1.Forked{}, fmt.Errorf("fork child %d of %d: %w", len(out.Sandboxes)+1, req.Count, err)
		}
		out.Sandboxes = append(out.Sandboxes, so.Sandbox)
	}
	op, err := s.start(ctx, p, apiv1.OpFork, c)
	if err != nil {
		undo()
		return apiv1.Forked{}, err
	}
	out.Operation = op.View()
	return out, nil
}

// Rollback returns sandbox id to req.Checkpoint, one of its own
// checkpoints that is ready: its memory and disk as they were then,
// under the same ID.
func (s *Service) Rollback(ctx context.Context, p tenancy.Principal, id string, req apiv1.Rollback) (apiv1.SandboxOperation, error) {
	var none apiv1.SandboxOperation
	if !sandbox.ValidCheckpointID(req.Checkpoint) {
		return none, fmt.Errorf("checkpoint must be the ID (chk…) of one of the sandbox's checkpoints: %w", errdefs.ErrInvalid)
	}
	if _, err := s.sbx.Owned(ctx, p, id); err != nil {
		return none, err
	}
	c, err := s.owned(ctx, p, req.Checkpoint)
	if err != nil {
		return none, err
	}
	if c.SandboxID != id {
		return none, fmt.Errorf("checkpoint %s is of sandbox %s: a sandbox rolls back only to its own checkpoints: %w", c.ID, c.SandboxID, errdefs.ErrInvalid)
	}
	switch c.State {
	case apiv1.CheckpointCreating:
		return none, fmt.Errorf("checkpoint %s is being made: wait for its operation and retry: %w", c.ID, errdefs.ErrConflict)
	case apiv1.CheckpointFailed:
		return none, fmt.Errorf("checkpoint %s failed; nothing can be rolled back to it: %w", c.ID, errdefs.ErrConflict)
	}
	return s.sbx.RollbackVM(ctx, p, id, c.ID)
}

// Run removes, every SweepEvery until ctx ends, the files of checkpoints
// that are deleted (or were never recorded) and that nothing stands on
// any longer.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepEvery)
	defer t.Stop()
	for {
		s.Sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep removes the files of checkpoints the store does not hold, unless
// a sandbox stands on them.
func (s *Service) Sweep(ctx context.Context) {
	ids, err := s.sbx.CheckpointsOnHost()
	if err != nil {
		s.log.Warn("list the checkpoints on this host", "err", err)
		return
	}
	slices.Sort(ids)
	for _, id := range ids {
		_, err := s.st.GetCheckpoint(ctx, id)
		if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if removed, err := s.sbx.RemoveCheckpoint(id); err != nil {
			s.log.Warn("remove a deleted checkpoint's files", "checkpoint", id, "err", err)
		} else if removed {
			s.log.Info("removed a deleted checkpoint's files", "checkpoint", id)
		}
	}
}

// view is c as the API shows it.
func view(c store.Checkpoint) apiv1.Checkpoint {
	v := apiv1.Checkpoint{
		ID: c.ID, SandboxID: c.SandboxID, Name: c.Name, State: c.State,
		Template: apiv1.TemplateRef{Ref: c.TemplateRef, Digest: c.TemplateDigest},
		VCPUs:    c.VCPUs, MemoryMiB: c.MemoryMiB, DiskMiB: c.DiskMiB, SizeBytes: c.SizeBytes, CreatedAt: c.CreatedAt,
	}
	if c.Error != nil {
		v.LastError = &apiv1.Status{Code: c.Error.Code, Message: c.Error.Message}
	}
	return v
}
