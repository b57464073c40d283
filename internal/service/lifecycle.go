package service

import (
	"context"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/timings"
)

// The sandbox state machine. Each lifecycle request is allowed from some
// states; from the others it answers 409 naming the state:
//
//	create:  → creating → running (or failed)
//	pause:   running → paused
//	suspend: running | paused → suspending → suspended
//	wake:    paused → running; suspended → waking → running
//	rollback: running | paused | suspended → waking → running
//	delete:  any but deleting, deleted → deleting → deleted
//	keep:    any but deleting, deleted, failed (sets the lease only)
//
// One lifecycle operation runs per sandbox at a time; a second one answers
// 409 until the first ends, except delete, which waits for it.
var allowedFrom = map[string][]string{
	apiv1.OpPause:   {apiv1.StateRunning},
	apiv1.OpSuspend: {apiv1.StateRunning, apiv1.StatePaused},
	apiv1.OpWake:    {apiv1.StatePaused, apiv1.StateSuspended},
	// A checkpoint (or a fork's) leaves the state as it is.
	apiv1.OpCheckpoint: {apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended},
	apiv1.OpFork:       {apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended},
	apiv1.OpRollback:   {apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended},
}

// inflight is a lifecycle operation running on a sandbox.
type inflight struct {
	kind string
	done chan struct{}
	// ending is set (under Service.mu) just before the operation's
	// result is recorded: a client that saw it finished may already ask
	// for the next, which then waits for done instead of being refused.
	ending bool
}

// lockSettled takes s.mu once id has no operation that is only recording
// its end; it returns with s.mu held, or ctx's error without it.
func (s *Service) lockSettled(ctx context.Context, id string) error {
	for {
		s.mu.Lock()
		f := s.busy[id]
		if f == nil || !f.ending {
			return nil
		}
		s.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// beginOp checks that kind is allowed now, records the sandbox's
// transitional state (if any) with a new pending operation, and marks the
// sandbox busy. The caller runs the operation and calls endOp.
func (s *Service) beginOp(ctx context.Context, p Principal, id, kind, transitional string) (sb store.Sandbox, op store.Operation, f *inflight, from string, err error) {
	sb, op, f, err = s.beginOpLocked(ctx, p, id, kind, transitional, &from, nil)
	return sb, op, f, from, err
}

// idleBegin is what beginOpLocked needs to begin the suspend or pause
// that idleness starts.
type idleBegin struct {
	// quiet says, under s.mu, whether nothing uses the sandbox still: a
	// call that takes hold of it under s.mu (use) either comes before
	// this check, which then refuses, or finds the operation begun.
	quiet func() bool
	// data is the sandbox.idle event's.
	data []byte
}

func (s *Service) beginOpLocked(ctx context.Context, p Principal, id, kind, transitional string, fromOut *string, idle *idleBegin) (store.Sandbox, store.Operation, *inflight, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return sb, store.Operation{}, nil, err
	}
	if err := s.lockSettled(ctx, id); err != nil {
		return sb, store.Operation{}, nil, err
	}
	defer s.mu.Unlock()
	if s.closed {
		return sb, store.Operation{}, nil, fmt.Errorf("the server is shutting down: retry shortly: %w", errdefs.ErrUnavailable)
	}
	if sb, err = s.st.GetSandbox(ctx, id); err != nil {
		return sb, store.Operation{}, nil, err
	}
	if f, ok := s.busy[id]; ok {
		return sb, store.Operation{}, nil, fmt.Errorf("sandbox %s has a %s operation in flight: wait for it and retry: %w", id, f.kind, errdefs.ErrConflict)
	}
	if !contains(allowedFrom[kind], sb.State) {
		return sb, store.Operation{}, nil, fmt.Errorf("sandbox %s is %s: %s needs it %s: %w", id, sb.State, kind, orList(allowedFrom[kind]), errdefs.ErrConflict)
	}
	if idle != nil && !idle.quiet() {
		return sb, store.Operation{}, nil, fmt.Errorf("sandbox %s is in use: %w", id, errdefs.ErrConflict)
	}
	now := s.now()
	op := store.Operation{ID: ids.New("op"), Kind: kind, TargetID: id, Owner: p.KeyID, Status: apiv1.OpPending, CreatedAt: now}
	from := sb.State
	*fromOut = from
	if transitional != "" {
		sb.State = transitional
	}
	sb.UpdatedAt = now
	// The store admits one operation per sandbox, whichever server asks.
	begin := s.st.BeginOperation
	if idle != nil {
		begin = func(ctx context.Context, sb store.Sandbox, op store.Operation, from string) error {
			return s.st.BeginIdleOperation(ctx, sb, op, from, idle.data)
		}
	}
	if err := begin(ctx, sb, op, from); err != nil {
		return sb, op, nil, fmt.Errorf("record %s: %w", kind, err)
	}
	f := &inflight{kind: kind, done: make(chan struct{})}
	s.busy[id] = f
	s.work.Add(1)
	s.states[from]--
	s.states[sb.State]++
	s.m.setStates(s.statesCopy())
	s.m.opStarted(kind)
	if transitional != "" {
		go s.publish(sb)
	}
	return sb, op, f, nil
}

// endOp finishes a lifecycle operation: the sandbox's new state and the
// operation's result in one transaction.
func (s *Service) endOp(f *inflight, sb store.Sandbox, from string, op store.Operation, err error, took time.Duration) {
	now := s.now()
	op.FinishedAt = &now
	if err != nil {
		st := store.ErrorOf(err)
		op.Status, op.Error = apiv1.OpFailed, &st
	} else {
		op.Status = apiv1.OpSucceeded
	}
	s.mu.Lock()
	f.ending = true
	s.mu.Unlock()
	s.transition(sb, &op, from)
	s.m.opFinished(op.Kind, op.Status, took)
	s.mu.Lock()
	if s.busy[sb.ID] == f {
		delete(s.busy, sb.ID)
	}
	s.mu.Unlock()
	close(f.done)
	s.work.Done()
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func orList(states []string) string {
	switch len(states) {
	case 0:
		return "in no state"
	case 1:
		return states[0]
	}
	out := states[0]
	for _, st := range states[1 : len(states)-1] {
		out += ", " + st
	}
	return out + " or " + states[len(states)-1]
}

// Pause stops the sandbox's vCPUs; its memory stays resident.
func (s *Service) Pause(ctx context.Context, p Principal, id string) (apiv1.SandboxOperation, error) {
	sb, op, f, _, err := s.beginOp(ctx, p, id, apiv1.OpPause, "")
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	go s.runPause(sb, op, f) // copies: the answer below reads the originals
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

func (s *Service) runPause(sb store.Sandbox, op store.Operation, f *inflight) {
	start := time.Now()
	s.markRunning(&op)
	err := s.pauseVM(sb.ID)
	if err == nil {
		sb.State = apiv1.StatePaused
	}
	s.endOp(f, sb, apiv1.StateRunning, op, err, time.Since(start))
}

// liveVM returns the sandbox this server looks after and its VM, or a
// conflict when it has none.
func (s *Service) liveVM(id string) (*live, VM, error) {
	lv := s.getLive(id)
	if lv == nil {
		return nil, nil, fmt.Errorf("sandbox %s has no VM: %w", id, errdefs.ErrConflict)
	}
	box, _, err := lv.vm()
	return lv, box, err
}

func (s *Service) pauseVM(id string) error {
	_, box, err := s.liveVM(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	return box.Pause(ctx)
}

// Suspend writes the sandbox's memory and device state to disk and ends
// its VM.
func (s *Service) Suspend(ctx context.Context, p Principal, id string) (apiv1.SandboxOperation, error) {
	cur, err := s.getOwned(ctx, p, id)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	if err := s.admitSuspend(ctx, cur); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	sb, op, f, from, err := s.beginOp(ctx, p, id, apiv1.OpSuspend, apiv1.StateSuspending)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	go s.runSuspend(sb, op, f, from)
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

func (s *Service) runSuspend(sb store.Sandbox, op store.Operation, f *inflight, from string) {
	start := time.Now()
	s.markRunning(&op)
	err := s.suspendVM(sb.ID)
	switch {
	case err == nil:
		sb.State = apiv1.StateSuspended
	case s.hasVM(sb.ID):
		sb.State = from // a failed suspend leaves the VM as it was
	default:
		// The VM was lost; its watch may have failed the sandbox already.
		if cur, gerr := s.st.GetSandbox(context.Background(), sb.ID); gerr == nil && cur.State != apiv1.StateSuspending {
			sb = cur
		} else {
			st := store.ErrorOf(err)
			sb.State, sb.LastError = apiv1.StateFailed, &st
		}
	}
	s.endOp(f, sb, apiv1.StateSuspending, op, err, time.Since(start))
}

func (s *Service) hasVM(id string) bool {
	lv := s.getLive(id)
	return lv != nil && lv.hasVM()
}

func (s *Service) suspendVM(id string) error {
	lv, box, err := s.liveVM(id)
	if err != nil {
		return err
	}
	// The VM's context ends first, so the command pumps treat the
	// session's end as a suspend, not a loss.
	lv.dropBox()
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	if err := box.Suspend(ctx); err != nil {
		if !box.Exited() {
			lv.setBox(box) // still running: keep it
			s.cmds.Resume(id)
		} else {
			// The VM died during the suspend, and its watch ended with
			// the context above: let go of it as the watch would have,
			// or its owner lock, held here, keeps a delete from
			// removing the sandbox.
			s.cmds.Lost(id, "the sandbox VM exited")
			box.Release()
		}
		return fmt.Errorf("suspend sandbox %s: %w", id, err)
	}
	s.cmds.Wait(id)
	return nil
}

// Wake brings a paused or suspended sandbox back.
func (s *Service) Wake(ctx context.Context, p Principal, id string) (apiv1.SandboxOperation, error) {
	cur, err := s.getOwned(ctx, p, id)
	if err != nil {
		return apiv1.SandboxOperation{}, err
	}
	// A woken VM writes to its disk on the host, and a restore that fails
	// once the guest ran saves its memory again: on a full disk that save
	// fails and the sandbox is lost.
	if err := s.checkFreeDisk(s.sandboxDir(id)); err != nil {
		return apiv1.SandboxOperation{}, err
	}
	transitional := ""
	if cur.State == apiv1.StateSuspended {
		transitional = apiv1.StateWaking
		if err := s.admitWake(ctx, cur); err != nil {
			return apiv1.SandboxOperation{}, err
		}
	}
	sb, op, f, _, err := s.beginOp(ctx, p, id, apiv1.OpWake, transitional)
	if err != nil {
		s.endWake(id)
		return apiv1.SandboxOperation{}, err
	}
	go func(sb store.Sandbox, op store.Operation) { // copies: the answer below reads the originals
		defer s.endWake(id)
		start := time.Now()
		clock := timings.StartAt(op.CreatedAt)
		clock.Lap("admit and record")
		s.markRunning(&op)
		clock.Lap("record running")
		from := sb.State
		var err error
		if from == apiv1.StateWaking {
			err = s.wakeSuspended(sb, clock)
		} else {
			err = s.resumeVM(sb.ID)
			clock.Lap("resume vm and refresh guest")
		}
		if err == nil {
			op.Timings = clock.T
		}
		switch {
		case err == nil:
			sb.State = apiv1.StateRunning
			s.idle.Touch(sb.ID) // its idle time counts from the wake
		case from == apiv1.StateWaking && sandbox.SuspendedState(s.sandboxDir(sb.ID)):
			sb.State = apiv1.StateSuspended // the saved state is kept: wake may be retried
		case from == apiv1.StateWaking:
			st := store.ErrorOf(err)
			sb.State, sb.LastError = apiv1.StateFailed, &st
		}
		s.endOp(f, sb, from, op, err, time.Since(start))
	}(sb, op)
	return apiv1.SandboxOperation{Sandbox: s.sandboxView(sb), Operation: op.View()}, nil
}

// admitSuspend checks a suspend of sb against its owner's suspended_mib
// limit and against the disk: the saved memory, up to the sandbox's
// memory, must leave --min-free-disk free.
func (s *Service) admitSuspend(ctx context.Context, sb store.Sandbox) error {
	if sb.State == apiv1.StateRunning || sb.State == apiv1.StatePaused {
		l, err := s.limitsOf(ctx, sb.Owner)
		if err != nil {
			return err
		}
		u, err := s.st.KeyUsage(ctx, sb.Owner)
		if err != nil {
			return err
		}
		if err := within(sb.Owner, l, u, want{suspendedMiB: int64(sb.MemoryMiB)}); err != nil {
			return err
		}
	}
	return s.checkFreeDiskFor(s.sandboxDir(sb.ID), int64(sb.MemoryMiB)<<20)
}

// admitWake checks the wake of the suspended sandbox sb against its
// owner's limits (the memory and vCPUs it takes back), the host-wide cap
// on sandboxes holding a VM and the memory budget, and holds its memory
// in the budget until endWake.
func (s *Service) admitWake(ctx context.Context, sb store.Sandbox) error {
	l, err := s.limitsOf(ctx, sb.Owner)
	if err != nil {
		return err
	}
	u, err := s.st.KeyUsage(ctx, sb.Owner)
	if err != nil {
		return err
	}
	if err := within(sb.Owner, l, u, want{vcpus: int64(sb.VCPUs), memoryMiB: int64(sb.MemoryMiB)}); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.vmCount(); n >= s.cfg.MaxSandboxes {
		return fmt.Errorf("this host already runs %d sandboxes, its limit (max_sandboxes=%d): delete or suspend one and retry: %w", n, s.cfg.MaxSandboxes, errdefs.ErrExhausted)
	}
	if _, ok := s.waking[sb.ID]; ok {
		return fmt.Errorf("sandbox %s is being woken: %w", sb.ID, errdefs.ErrConflict)
	}
	if err := s.fitsBudget(int64(sb.MemoryMiB)); err != nil {
		return err
	}
	s.waking[sb.ID] = int64(sb.MemoryMiB)
	return nil
}

// endWake gives back what admitWake held for sandbox id, if anything.
func (s *Service) endWake(id string) {
	s.mu.Lock()
	delete(s.waking, id)
	s.mu.Unlock()
}

// vmCount is the number of sandboxes holding or making a VM. s.mu is held.
func (s *Service) vmCount() int {
	n := len(s.creating)
	for _, lv := range s.live {
		if lv.hasVM() {
			n++
		}
	}
	return n
}

func (s *Service) resumeVM(id string) error {
	_, box, err := s.liveVM(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	if err := box.Resume(ctx); err != nil {
		return err
	}
	s.cmds.Resume(id) // those a server restart left detached while paused
	return nil
}

// wakeSuspended restores a suspended sandbox's VM and re-attaches to the
// commands that were running in it, recording its steps on clock.
func (s *Service) wakeSuspended(sb store.Sandbox, clock *timings.Clock) error {
	lv := s.getLive(sb.ID)
	if lv == nil {
		return fmt.Errorf("sandbox %s is not known to this server: %w", sb.ID, errdefs.ErrConflict)
	}
	select {
	case s.slots <- struct{}{}:
	case <-s.ctx.Done():
		return fmt.Errorf("the server is shutting down: %w", errdefs.ErrUnavailable)
	}
	defer func() { <-s.slots }()
	clock.Lap("wait for a start slot")
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	box, err := s.rt.Wake(ctx, sb.ID)
	if err != nil {
		return err
	}
	clock.LapSteps("wake: other", box.StepTimings())
	lv.setBox(box)
	s.cmds.Resume(sb.ID)
	clock.Lap("reattach commands")
	return nil
}

// Keep sets the sandbox's lease: it ends timeoutS from now (0: never).
func (s *Service) Keep(ctx context.Context, p Principal, id string, timeoutS *int) (apiv1.Sandbox, error) {
	if timeoutS == nil {
		return apiv1.Sandbox{}, fmt.Errorf("timeout_s is required (seconds from now; 0 keeps it until deleted): %w", errdefs.ErrInvalid)
	}
	if *timeoutS < 0 || *timeoutS > maxLease {
		return apiv1.Sandbox{}, fmt.Errorf("timeout_s %d is out of bounds: use 0 (no lease) to %d: %w", *timeoutS, maxLease, errdefs.ErrInvalid)
	}
	if _, err := s.getOwned(ctx, p, id); err != nil {
		return apiv1.Sandbox{}, err
	}
	s.idle.Touch(id) // a keep is a use (docs/api.md, "Idle sandboxes")
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return apiv1.Sandbox{}, err
	}
	switch sb.State {
	case apiv1.StateDeleting, apiv1.StateDeleted, apiv1.StateFailed:
		return apiv1.Sandbox{}, fmt.Errorf("sandbox %s is %s: there is nothing to keep: %w", id, sb.State, errdefs.ErrConflict)
	}
	now := s.now()
	sb.TimeoutS, sb.ExpiresAt, sb.UpdatedAt = *timeoutS, nil, now
	if *timeoutS > 0 {
		exp := now.Add(time.Duration(*timeoutS) * time.Second)
		sb.ExpiresAt = &exp
	}
	if err := s.st.UpdateSandbox(ctx, sb); err != nil {
		return apiv1.Sandbox{}, err
	}
	return s.sandboxView(sb), nil
}

// maxLease bounds a lease: a year.
const maxLease = 365 * 24 * 3600

// reconcile applies ended leases, once a second until the service closes.
// A lease that ended while the server was down is applied on the first
// pass.
func (s *Service) reconcile() {
	defer s.work.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.applyLeases()
		s.applyIdle()
		select {
		case <-s.ctx.Done():
			return
		case <-s.closing:
			return
		case <-t.C:
		}
	}
}

func (s *Service) applyLeases() {
	// A creating sandbox's lease starts when it runs.
	states := []string{apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspending,
		apiv1.StateSuspended, apiv1.StateWaking, apiv1.StateFailed}
	expired, err := s.st.ListExpired(s.ctx, s.clockNow(), states, s.role.node(), 100)
	if err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("list expired leases", "err", err)
		}
		return
	}
	system := Principal{Role: apiv1.RoleAdmin}
	for _, sb := range expired {
		s.mu.Lock()
		_, busy := s.busy[sb.ID]
		_, creating := s.creating[sb.ID]
		s.mu.Unlock()
		if sb.OnTimeout == "delete" {
			if _, err := s.DeleteSandbox(s.ctx, system, sb.ID); err == nil {
				s.log.Info("lease ended: deleting", "sandbox", sb.ID)
			}
			continue
		}
		if busy || creating {
			continue // the next pass sees it again
		}
		switch sb.State {
		case apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended, apiv1.StateFailed:
		default:
			continue // in flight: the next pass sees it again
		}
		// The lease is spent first: a woken sandbox has none until kept
		// again, and a suspend that fails is not retried every second.
		s.mu.Lock()
		cur, err := s.st.GetSandbox(s.ctx, sb.ID)
		if err == nil && cur.ExpiresAt != nil && !cur.ExpiresAt.After(s.clockNow()) {
			cur.ExpiresAt = nil
			err = s.st.UpdateSandbox(s.ctx, cur)
		}
		s.mu.Unlock()
		if err != nil || cur.State != apiv1.StateRunning && cur.State != apiv1.StatePaused {
			continue
		}
		if _, err := s.Suspend(s.ctx, system, sb.ID); err != nil {
			s.log.Warn("lease ended: suspend", "sandbox", sb.ID, "err", err)
			continue
		}
		s.log.Info("lease ended: suspending", "sandbox", sb.ID)
	}
}
