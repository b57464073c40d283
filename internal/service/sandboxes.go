package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/timings"
)

var labelKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-/]*$`)

func labelKeyOK(k string) bool { return labelKey.MatchString(k) }

// CreateSandbox records a new sandbox and its create operation, and has
// it made in the background: booted here, or, on a cluster's API replica,
// placed by the cluster on a node. A cluster node refuses it.
func (s *Service) CreateSandbox(ctx context.Context, p Principal, req apiv1.CreateSandbox) (apiv1.SandboxOperation, error) {
	if err := s.role.mayCreate(); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if req.Checkpoint != "" {
		var err error
		if req, err = s.fromCheckpoint(ctx, p, req); err != nil {
			return apiv1.SandboxOperation{}, err
		}
	}
	if req.Template == "" {
		return apiv1.SandboxOperation{}, fmt.Errorf("template is required (for example \"base\"): %w", errdefs.ErrInvalid)
	}
	switch req.OnTimeout {
	case "":
		req.OnTimeout = "delete"
	case "delete", "suspend":
	default:
		return apiv1.SandboxOperation{}, fmt.Errorf("on_timeout %q is not \"delete\" or \"suspend\": %w", fields.Truncate(req.OnTimeout, 40), errdefs.ErrInvalid)
	}
	timeout := 0
	if req.TimeoutS != nil {
		timeout = *req.TimeoutS
		if timeout < 0 || timeout > 365*24*3600 {
			return apiv1.SandboxOperation{}, fmt.Errorf("timeout_s %d is out of bounds: use 0 (no lease) to %d: %w", timeout, 365*24*3600, errdefs.ErrInvalid)
		}
	}
	idleS, onIdle, err := idleSettings(req.IdleS, req.OnIdle)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if err := fields.Map("env", req.Env, fields.EnvKey); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if err := fields.Map("metadata", req.Metadata, labelKeyOK); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	pol, network, err := s.parseNetwork(ctx, p.KeyID, req.Network)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	// The template is pinned by digest from here, and its image kept from
	// Reclaim until the sandbox's row names it.
	defer s.catalogue.HoldImages()()
	spec, tpl, err := s.resolveSpec(ctx, sandbox.Spec{Template: req.Template, VCPUs: req.VCPUs, MemoryMiB: req.MemoryMiB, DiskMiB: req.DiskMiB, Network: &pol})
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	spec.Template = tpl.Digest
	spec.Checkpoint = req.Checkpoint

	// A warm pool member that fits gives the sandbox its ID; one taken
	// and not used is given back on every way out below.
	want := spec
	want.Env, want.Detach = req.Env, true // as runCreate creates it
	var id string
	pooled := false
	if spec.Checkpoint == "" {
		id, pooled = s.rt.Claim(want)
	}
	if !pooled {
		id = ids.New("sbx")
	}
	keep := false
	defer func() {
		if pooled && !keep {
			s.rt.Unclaim(id)
		}
	}()
	now := s.now()
	sb := store.Sandbox{
		ID: id, Owner: p.KeyID, State: apiv1.StateCreating,
		TemplateRef: tpl.Ref(), TemplateDigest: tpl.Digest,
		VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB, DiskMiB: spec.DiskMiB,
		TimeoutS: timeout, OnTimeout: req.OnTimeout,
		IdleS: idleS, OnIdle: onIdle, WakeOnRequest: idleS > 0 || req.WakeOnRequest,
		Env: req.Env, Metadata: req.Metadata, Network: network,
		CreatedAt: now, UpdatedAt: now,
	}
	if timeout > 0 {
		exp := now.Add(time.Duration(timeout) * time.Second)
		sb.ExpiresAt = &exp
	}
	op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: p.KeyID, Status: apiv1.OpPending, CreatedAt: now}
	admit, err := s.keyAdmits(ctx, sb)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	so, err := s.role.admit(ctx, s, newSandbox{sb: sb, op: op, spec: spec, tpl: tpl, admit: admit})
	keep = err == nil
	return so, err
}

// fromCheckpoint fills a create from a checkpoint with what the
// checkpoint fixes (template, vCPUs, memory, the least disk) and what it
// gives by default (environment, network policy); what the caller asks
// of those must agree with it.
func (s *Service) fromCheckpoint(ctx context.Context, p Principal, req apiv1.CreateSandbox) (apiv1.CreateSandbox, error) {
	if err := s.mayCheckpoint(); err != nil {
		return req, err
	}
	c, err := s.checkpointOf(ctx, p, req.Checkpoint)
	if err != nil {
		return req, err
	}
	var bad []string
	if req.Template != "" && req.Template != c.TemplateRef && req.Template != c.TemplateDigest {
		if _, tpl, err := s.resolveSpec(ctx, sandbox.Spec{Template: req.Template}); err != nil || tpl.Digest != c.TemplateDigest {
			bad = append(bad, fmt.Sprintf("template %s", c.TemplateRef))
		}
	}
	if req.VCPUs != 0 && req.VCPUs != c.VCPUs {
		bad = append(bad, fmt.Sprintf("vcpus %d", c.VCPUs))
	}
	if req.MemoryMiB != 0 && req.MemoryMiB != c.MemoryMiB {
		bad = append(bad, fmt.Sprintf("memory_mib %d", c.MemoryMiB))
	}
	if req.DiskMiB != 0 && req.DiskMiB < c.DiskMiB {
		bad = append(bad, fmt.Sprintf("disk_mib of at least %d", c.DiskMiB))
	}
	if len(bad) > 0 {
		return req, fmt.Errorf("a sandbox from checkpoint %s has its %s: leave them out: %w", c.ID, strings.Join(bad, ", "), errdefs.ErrInvalid)
	}
	req.Template, req.VCPUs, req.MemoryMiB = c.TemplateDigest, c.VCPUs, c.MemoryMiB
	if req.DiskMiB == 0 {
		req.DiskMiB = c.DiskMiB
	}
	if req.Env == nil {
		req.Env = c.Env
	}
	if len(req.Network) == 0 {
		req.Network = c.Network
	}
	return req, nil
}

// keyAdmits returns the check of a create of sb against its owner's
// limits, which the store runs on what the owner holds when the create is
// recorded (store.InsertSandboxWithin); nil when the owner has no limit a
// create touches, so that its creates count nothing.
func (s *Service) keyAdmits(ctx context.Context, sb store.Sandbox) (func(store.Usage) error, error) {
	l, err := s.limitsOf(ctx, sb.Owner)
	if err != nil {
		return nil, err
	}
	if l.Sandboxes == nil && l.VCPUs == nil && l.MemoryMiB == nil && l.DiskMiB == nil {
		return nil, nil
	}
	w := want{sandboxes: 1, vcpus: int64(sb.VCPUs), memoryMiB: int64(sb.MemoryMiB), diskMiB: int64(sb.DiskMiB)}
	return func(u store.Usage) error { return within(sb.Owner, l, u, w) }, nil
}

// admitCreate checks the host's caps and memory budget and takes the
// sandbox's place among the creations, under one lock; runCreate, or
// unadmit, gives it back.
func (s *Service) admitCreate(id string, memoryMiB int64) (context.Context, *creation, error) {
	if err := s.checkFreeDisk(s.cfg.Dir.Sandboxes()); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, fmt.Errorf("the server is shutting down: retry shortly: %w", errdefs.ErrUnavailable)
	}
	if _, ok := s.creating[id]; ok {
		return nil, nil, errMaking
	}
	if n := s.vmCount(); n >= s.cfg.MaxSandboxes {
		return nil, nil, fmt.Errorf("this host already runs %d sandboxes, its limit (max_sandboxes=%d): delete one and retry: %w", n, s.cfg.MaxSandboxes, errdefs.ErrExhausted)
	}
	if n := len(s.creating); n >= s.cfg.MaxStarts+s.cfg.MaxQueuedStarts {
		return nil, nil, fmt.Errorf("%d sandboxes are starting or waiting to start, the limit (max_starts=%d plus %d queued): retry shortly: %w", n, s.cfg.MaxStarts, s.cfg.MaxQueuedStarts, errdefs.ErrExhausted)
	}
	if err := s.fitsBudget(memoryMiB); err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithCancel(s.ctx)
	c := &creation{cancel: cancel, done: make(chan struct{}), memoryMiB: memoryMiB}
	s.creating[id] = c
	s.work.Add(1)
	return cctx, c, nil
}

// errMaking is admitCreate's answer for a sandbox being made already.
var errMaking = fmt.Errorf("the sandbox is being made: %w", errdefs.ErrConflict)

// unadmit gives back a place admitCreate took for a create that never ran.
func (s *Service) unadmit(id string, c *creation) {
	s.mu.Lock()
	delete(s.creating, id)
	s.mu.Unlock()
	c.cancel()
	s.work.Done()
}

// runCreate boots the sandbox: it waits for a start slot, then creates.
func (s *Service) runCreate(ctx context.Context, c *creation, sb store.Sandbox, op store.Operation, spec sandbox.Spec) {
	defer s.work.Done()
	defer close(c.done)
	defer c.cancel()
	start := time.Now()
	log := s.log.With("sandbox", sb.ID, "operation", op.ID)
	// From when the create was asked for, so that the steps add up to the
	// operation's duration.
	clock := timings.StartAt(op.CreatedAt)
	clock.Lap("admit and record")

	err := func() error {
		if spec.Checkpoint != "" {
			if err := s.waitCheckpoint(ctx, spec.Checkpoint); err != nil {
				return err
			}
			clock.Lap("wait for the checkpoint")
		}
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-s.slots }()
		clock.Lap("wait for a start slot")
		op.Status = apiv1.OpRunning
		if err := s.st.UpdateOperation(s.ctx, op); err != nil {
			return err
		}
		clock.Lap("record running")
		s.makeRoom(ctx)
		spec.ID, spec.Env, spec.Detach = sb.ID, sb.Env, true
		box, err := s.rt.Create(ctx, spec)
		if err != nil {
			return err
		}
		clock.LapSteps("create: other", box.StepTimings())
		lv := s.adoptLive(box, sb)
		s.mu.Lock()
		s.live[sb.ID] = lv
		delete(s.creating, sb.ID)
		s.mu.Unlock()
		clock.Lap("register sandbox")
		return nil
	}()

	now := s.now()
	op.FinishedAt = &now
	if err == nil {
		op.Timings = clock.T
	}
	if err != nil {
		s.mu.Lock()
		delete(s.creating, sb.ID)
		s.mu.Unlock()
		if ctx.Err() != nil && s.ctx.Err() == nil {
			// Cancelled by a delete, which finishes the story.
			op.Status = apiv1.OpFailed
			op.Error = &store.Error{Code: apiv1.CodeConflict, Message: "the sandbox was deleted while it was being created"}
			s.finishOp(op, time.Since(start))
			return
		}
		if s.ctx.Err() != nil {
			return // shutting down: the next start fails the operation with a reason
		}
		log.Warn("create failed", "err", err)
		status := store.ErrorOf(err)
		op.Status, op.Error = apiv1.OpFailed, &status
		if err := s.rt.Remove(context.Background(), sb.ID); err != nil {
			log.Warn("remove what the failed create left", "err", err)
		}
		cur, gerr := s.st.GetSandbox(s.ctx, sb.ID)
		if gerr == nil && cur.State == apiv1.StateCreating {
			cur.State, cur.LastError = apiv1.StateFailed, &status
			s.transition(cur, &op, apiv1.StateCreating)
		} else {
			s.finishOp(op, time.Since(start))
		}
		s.m.opFinished(op.Kind, op.Status, time.Since(start))
		return
	}
	op.Status = apiv1.OpSucceeded
	cur, err := s.st.GetSandbox(s.ctx, sb.ID)
	if err == nil {
		cur.State = apiv1.StateRunning
		s.transition(cur, &op, apiv1.StateCreating)
	}
	s.m.opFinished(op.Kind, op.Status, time.Since(start))
	log.Info("sandbox created", "ms", time.Since(start).Milliseconds())
}

// makeRoom destroys warm pool members while the sandboxes holding a VM
// and the members together are over the host's cap: a member never takes
// the place of a sandbox someone asked for.
func (s *Service) makeRoom(ctx context.Context) {
	for {
		members := 0
		for _, p := range s.rt.Pools() {
			members += p.Ready
		}
		s.mu.Lock()
		n := s.vmCount()
		s.mu.Unlock()
		if members == 0 || n+members <= s.cfg.MaxSandboxes || !s.rt.ShedPoolMember(ctx) {
			return
		}
	}
}

// transition moves a sandbox to sb's state (and last error), finishing or
// recording op in the same transaction, then tells watchers. It writes onto
// the row as it is now, so a lease set meanwhile by keep is kept; from is
// the state the caller moved it from, for the counts.
func (s *Service) transition(sb store.Sandbox, op *store.Operation, from string) {
	s.mu.Lock()
	cur, err := s.st.GetSandbox(context.Background(), sb.ID)
	if err == nil {
		if cur.State == apiv1.StateCreating && sb.State == apiv1.StateRunning && cur.TimeoutS > 0 {
			// The lease runs from when the sandbox is up, so a short one
			// cannot end before the sandbox could be used.
			exp := s.now().Add(time.Duration(cur.TimeoutS) * time.Second)
			cur.ExpiresAt = &exp
		}
		from = cur.State
		cur.State, cur.LastError, cur.UpdatedAt = sb.State, sb.LastError, s.now()
		if op != nil {
			err = s.st.TransitionSandbox(context.Background(), cur, *op)
		} else {
			err = s.st.UpdateSandbox(context.Background(), cur)
		}
	}
	s.mu.Unlock()
	if err != nil {
		s.log.Error("record sandbox state", "sandbox", sb.ID, "state", sb.State, "err", err)
		return
	}
	s.countState(from, cur.State)
	if op != nil && (op.Status == apiv1.OpSucceeded || op.Status == apiv1.OpFailed) {
		s.opFinished(op.ID)
	}
	s.publish(cur)
}

// markRunning records that op has begun. A failed write is logged and
// the operation goes on: its end is recorded over it.
func (s *Service) markRunning(op *store.Operation) {
	op.Status = apiv1.OpRunning
	if err := s.st.UpdateOperation(context.Background(), *op); err != nil {
		s.log.Warn("record operation running", "operation", op.ID, "err", err)
	}
}

// finishOp records a finished operation on its own.
func (s *Service) finishOp(op store.Operation, took time.Duration) {
	if err := s.st.UpdateOperation(context.Background(), op); err != nil {
		s.log.Error("record operation", "operation", op.ID, "err", err)
	}
	s.opFinished(op.ID)
}

func (s *Service) countState(from, to string) {
	s.mu.Lock()
	if from != "" {
		s.states[from]--
	}
	if to != "" {
		s.states[to]++
	}
	counts := s.statesCopy()
	s.mu.Unlock()
	s.m.setStates(counts)
}

func (s *Service) statesCopy() map[string]int {
	c := make(map[string]int, len(s.states))
	for k, v := range s.states {
		c[k] = v
	}
	return c
}

func (s *Service) stateCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statesCopy()
}

// getOwned returns the sandbox if p may see it; others' are "not found".
func (s *Service) getOwned(ctx context.Context, p Principal, id string) (store.Sandbox, error) {
	if err := fields.ID("sandbox", "sbx", id); err != nil {
		return store.Sandbox{}, err
	}
	sb, err := s.st.GetSandbox(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.Owns(sb.Owner) {
		return store.Sandbox{}, fmt.Errorf("sandbox %s not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	if err := s.role.reaches(ctx, s.st, id); err != nil {
		return store.Sandbox{}, err
	}
	return sb, nil
}

// GetSandbox returns one sandbox.
func (s *Service) GetSandbox(ctx context.Context, p Principal, id string) (apiv1.Sandbox, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return apiv1.Sandbox{}, err
	}
	vs := []apiv1.Sandbox{s.sandboxView(sb)}
	if err := s.role.markUnavailable(ctx, s.st, vs); err != nil {
		return apiv1.Sandbox{}, err
	}
	return vs[0], nil
}

// SandboxFilter selects sandboxes to list.
type SandboxFilter struct {
	State     string
	Metadata  map[string]string
	PageToken string
	Limit     int
}

// ListSandboxes lists the sandboxes p may see. Deleted ones are listed only
// when asked for by state.
func (s *Service) ListSandboxes(ctx context.Context, p Principal, f SandboxFilter) (apiv1.List[apiv1.Sandbox], error) {
	var out apiv1.List[apiv1.Sandbox]
	limit, err := fields.Limit(f.Limit)
	if err != nil {
		return out, err
	}
	sf := store.SandboxFilter{Metadata: f.Metadata, Limit: limit + 1}
	if !p.Admin() {
		sf.Owner = p.KeyID
	}
	if f.State != "" {
		if !validState(f.State) {
			return out, fmt.Errorf("state %q is not one of %s: %w", fields.Truncate(f.State, 40), strings.Join(apiv1.States, ", "), errdefs.ErrInvalid)
		}
		sf.States = []string{f.State}
	} else {
		for _, st := range apiv1.States {
			if st != apiv1.StateDeleted {
				sf.States = append(sf.States, st)
			}
		}
	}
	if f.PageToken != "" {
		after, err := fields.After(f.PageToken, "sbx")
		if err != nil {
			return out, err
		}
		sf.After = after
	}
	rows, err := s.st.ListSandboxes(ctx, sf)
	if err != nil {
		return out, err
	}
	out.Items = []apiv1.Sandbox{}
	for i, sb := range rows {
		if i == limit {
			out.NextPageToken = fields.PageToken(rows[i-1].ID)
			break
		}
		out.Items = append(out.Items, s.sandboxView(sb))
	}
	if err := s.role.markUnavailable(ctx, s.st, out.Items); err != nil {
		return out, err
	}
	return out, nil
}

func validState(st string) bool {
	for _, s := range apiv1.States {
		if s == st {
			return true
		}
	}
	return false
}

// DeleteSandbox records the delete and carries it out in the background.
func (s *Service) DeleteSandbox(ctx context.Context, p Principal, id string) (apiv1.SandboxOperation, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return apiv1.SandboxOperation{}, fmt.Errorf("the server is shutting down: retry shortly: %w", errdefs.ErrUnavailable)
	}
	// Re-read under the lock so that two deletes cannot both start.
	sb, err = s.st.GetSandbox(ctx, id)
	if err != nil {
		s.mu.Unlock()
		return apiv1.SandboxOperation{}, err
	}
	if sb.State == apiv1.StateDeleting || sb.State == apiv1.StateDeleted {
		s.mu.Unlock()
		return apiv1.SandboxOperation{}, fmt.Errorf("sandbox %s is %s already: %w", id, sb.State, errdefs.ErrConflict)
	}
	if err := s.role.claimDelete(ctx, s.st, id); err != nil {
		s.mu.Unlock()
		return apiv1.SandboxOperation{}, err
	}
	from := sb.State
	now := s.now()
	op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpDelete, TargetID: id, Owner: p.KeyID, Status: apiv1.OpPending, CreatedAt: now}
	sb.State = apiv1.StateDeleting
	sb.UpdatedAt = now
	// Of two deletes, on this server or another, the store lets one begin.
	if err := s.st.BeginDelete(ctx, sb, op, from); err != nil {
		s.mu.Unlock()
		return apiv1.SandboxOperation{}, fmt.Errorf("record delete: %w", err)
	}
	s.work.Add(1)
	s.mu.Unlock()
	s.role.deleteBegun(ctx, s, id, from)
	s.countState(from, sb.State)
	s.publish(sb)
	s.m.opStarted(op.Kind)
	go s.runDelete(sb, op)
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

// runDelete stops whatever the sandbox has and removes its files.
func (s *Service) runDelete(sb store.Sandbox, op store.Operation) {
	defer s.work.Done()
	start := time.Now()
	s.markRunning(&op)

	s.mu.Lock()
	c := s.creating[sb.ID]
	f := s.busy[sb.ID]
	s.mu.Unlock()
	if c != nil {
		c.cancel()
		<-c.done
	}
	if f != nil {
		<-f.done // a pause, suspend or wake ends within its own bound
	}
	s.mu.Lock()
	lv := s.live[sb.ID]
	delete(s.live, sb.ID)
	s.mu.Unlock()
	s.idle.Forget(sb.ID)
	var err error
	if lv != nil {
		err = lv.destroy(context.Background())
	} else {
		err = s.rt.Remove(context.Background(), sb.ID)
	}
	s.cmds.End(sb.ID, "the sandbox was deleted")
	now := s.now()
	op.FinishedAt = &now
	if err != nil {
		status := store.ErrorOf(fmt.Errorf("delete sandbox %s: %w", sb.ID, err))
		op.Status, op.Error = apiv1.OpFailed, &status
		sb.State, sb.LastError = apiv1.StateFailed, &status
	} else {
		op.Status = apiv1.OpSucceeded
		sb.State = apiv1.StateDeleted
	}
	s.transition(sb, &op, apiv1.StateDeleting)
	s.m.opFinished(op.Kind, op.Status, time.Since(start))
	if err == nil {
		// The sandbox may have been the last user of an image no tag names.
		s.reclaim()
	}
}

// sandboxView is the API's view of a sandbox row.
func (s *Service) sandboxView(sb store.Sandbox) apiv1.Sandbox {
	v := apiv1.Sandbox{
		ID: sb.ID, State: sb.State,
		Template: apiv1.TemplateRef{Ref: sb.TemplateRef, Digest: sb.TemplateDigest},
		VCPUs:    sb.VCPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, OnTimeout: sb.OnTimeout,
		Metadata: sb.Metadata, Network: sb.Network,
	}
	idleView(&v, sb)
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	if len(v.Network) == 0 {
		v.Network = json.RawMessage(`{"egress":"deny"}`)
	}
	if sb.LastError != nil {
		v.LastError = &apiv1.Status{Code: sb.LastError.Code, Message: sb.LastError.Message}
	}
	if s.rt != nil {
		if r := s.rt.Limits(sb.VCPUs, sb.MemoryMiB); r != nil {
			v.Limits = &apiv1.SandboxLimits{CPUPct: int(r.CPUQuotaUS * 100 / max(r.CPUPeriodUS, 1)),
				MemoryMiB: int(r.MemoryBytes >> 20), Pids: int(r.Pids), IOWeight: int(r.IOWeight)}
		}
	}
	return v
}

// GetOperation returns an operation; with wait > 0 it first waits up to
// that long for it to finish.
func (s *Service) GetOperation(ctx context.Context, p Principal, id string, wait time.Duration) (apiv1.Operation, error) {
	if err := fields.ID("operation", "op", id); err != nil {
		return apiv1.Operation{}, err
	}
	get := func() (store.Operation, error) {
		op, err := s.st.GetOperation(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.Owns(op.Owner) {
			return op, fmt.Errorf("operation %s not found: %w", id, errdefs.ErrNotFound)
		}
		return op, err
	}
	op, err := get()
	if err != nil || wait <= 0 || op.Status == apiv1.OpSucceeded || op.Status == apiv1.OpFailed {
		return op.View(), err
	}
	if !s.role.holdsVMs() {
		// The operation runs on another server: its row is all there is
		// to watch.
		return s.pollOperation(ctx, get, wait)
	}
	s.mu.Lock()
	ch, ok := s.opWait[id]
	if !ok {
		ch = make(chan struct{})
		s.opWait[id] = ch
	}
	s.mu.Unlock()
	// The operation may have finished between the read and the wait.
	if op, err = get(); err != nil || op.Status == apiv1.OpSucceeded || op.Status == apiv1.OpFailed {
		return op.View(), err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return apiv1.Operation{}, ctx.Err()
	case <-s.ctx.Done():
	}
	op, err = get()
	return op.View(), err
}

func (s *Service) opFinished(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.opWait[id]; ok {
		close(ch)
		delete(s.opWait, id)
	}
}

// Watch streams the sandbox's state on every change until ctx ends or
// the sandbox is deleted (its last event is the "deleted" state). The
// channel is closed at the end.
func (s *Service) Watch(ctx context.Context, p Principal, id string) (<-chan apiv1.Sandbox, error) {
	if _, err := s.getOwned(ctx, p, id); err != nil {
		return nil, err
	}
	ch := make(chan apiv1.Sandbox, 16)
	s.mu.Lock()
	if s.watchers[id] == nil {
		s.watchers[id] = map[chan apiv1.Sandbox]struct{}{}
	}
	s.watchers[id][ch] = struct{}{}
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		s.mu.Lock()
		if _, ok := s.watchers[id][ch]; ok {
			delete(s.watchers[id], ch)
			close(ch)
		}
		if len(s.watchers[id]) == 0 {
			delete(s.watchers, id)
		}
		s.mu.Unlock()
	}()
	return ch, nil
}

// publish sends a state change to the sandbox's watchers. A watcher too
// slow to keep 16 changes queued loses the oldest.
func (s *Service) publish(sb store.Sandbox) {
	v := s.sandboxView(sb)
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.watchers[sb.ID] {
		select {
		case ch <- v:
		default:
			select {
			case <-ch:
			default:
			}
			ch <- v
		}
		if sb.State == apiv1.StateDeleted {
			close(ch) // nothing more will happen to it
		}
	}
	if sb.State == apiv1.StateDeleted {
		delete(s.watchers, sb.ID)
	}
}
