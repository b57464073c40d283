package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// live is a sandbox this server looks after: one with a VM (running or
// paused) or a suspended one, whose commands' logs stay open (in the
// service's sessions.Commands) so that their streams go on across suspend
// and wake.
type live struct {
	s  *Service
	id string
	// idleS and onIdle are the sandbox's idle_s and on_idle, fixed at
	// its create.
	idleS  int
	onIdle string

	// ctx is the sandbox's lifetime on this server. It ends when the
	// sandbox is deleted or released.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex         // guards the fields below
	box      VM                 // the VM; nil while suspended
	vmCtx    context.Context    // the current VM's lifetime: ends on suspend, VM loss or the sandbox's end
	vmCancel context.CancelFunc // ends vmCtx
}

// adoptLive wraps a sandbox the runtime created, adopted or woke (box), or
// a suspended one (box nil).
func (s *Service) adoptLive(box VM, sb store.Sandbox) *live {
	ctx, cancel := context.WithCancel(context.Background())
	lv := &live{s: s, id: sb.ID, idleS: sb.IdleS, onIdle: sb.OnIdle, ctx: ctx, cancel: cancel}
	if box != nil {
		lv.setBox(box)
	}
	return lv
}

// setBox makes box the sandbox's VM and watches it: a VM that exits on its
// own fails the sandbox.
func (lv *live) setBox(box VM) {
	vmCtx, vmCancel := context.WithCancel(lv.ctx)
	lv.mu.Lock()
	lv.box, lv.vmCtx, lv.vmCancel = box, vmCtx, vmCancel
	lv.mu.Unlock()
	lv.s.idle.Touch(lv.id) // its idle time counts from its start, adoption or wake
	go lv.watch(box, vmCtx)
}

// dropBox ends the current VM's context and forgets the VM; its pumps end.
func (lv *live) dropBox() VM {
	lv.mu.Lock()
	box, cancel := lv.box, lv.vmCancel
	lv.box, lv.vmCtx, lv.vmCancel = nil, nil, nil
	lv.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return box
}

// vm returns the sandbox's VM and its context, or a conflict while it has
// none.
func (lv *live) vm() (VM, context.Context, error) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if lv.box == nil {
		return nil, nil, fmt.Errorf("sandbox %s has no running VM: %w", lv.id, errdefs.ErrConflict)
	}
	return lv.box, lv.vmCtx, nil
}

// vmBox returns the sandbox's VM, nil while it has none.
func (lv *live) vmBox() VM {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.box
}

// hasVM reports whether the sandbox holds a VM (for the host-wide cap).
func (lv *live) hasVM() bool {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.box != nil
}

// watch waits for box's VM to end or for vmCtx to end; an unexpected VM
// exit fails the sandbox with the reason.
func (lv *live) watch(box VM, vmCtx context.Context) {
	select {
	case <-vmCtx.Done():
		return
	case <-box.Done():
	}
	if vmCtx.Err() != nil {
		return // suspended, deleted or released meanwhile
	}
	s := lv.s
	s.mu.Lock()
	if s.live[lv.id] != lv {
		s.mu.Unlock()
		return // being deleted
	}
	delete(s.live, lv.id)
	s.mu.Unlock()
	s.idle.Forget(lv.id)
	failure := box.Failure()
	msg := "the sandbox VM exited"
	if failure != nil {
		msg = failure.Error()
	}
	s.log.Warn("sandbox VM exited", "sandbox", lv.id, "reason", msg)
	lv.cancel()
	s.cmds.Lost(lv.id, "the sandbox VM exited")
	box.Release() // its directory stays, for the console log, until deleted
	sb, err := s.st.GetSandbox(context.Background(), lv.id)
	if err != nil || sb.State == apiv1.StateDeleting || sb.State == apiv1.StateDeleted {
		return
	}
	from := sb.State
	sb.State = apiv1.StateFailed
	sb.LastError = &store.Error{Code: apiv1.CodeUnavailable, Message: msg}
	s.transition(sb, nil, from)
}

// release lets go of the sandbox and leaves its VM running.
func (lv *live) release() {
	lv.cancel()
	if box := lv.dropBox(); box != nil {
		box.Release()
	}
	lv.s.cmds.Close(lv.id, 5*time.Second)
}

// destroy stops the VM and removes the sandbox's files.
func (lv *live) destroy(ctx context.Context) error {
	lv.cancel()
	lv.s.cmds.EndOpen(lv.id, "the sandbox was deleted")
	box := lv.dropBox()
	var err error
	if box != nil {
		err = box.Destroy(ctx)
	} else {
		err = lv.s.rt.Remove(ctx, lv.id)
	}
	lv.s.cmds.Close(lv.id, 5*time.Second)
	return err
}

// getLive returns the sandbox this server looks after, or nil.
func (s *Service) getLive(id string) *live {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[id]
}
