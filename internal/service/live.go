package service

import (
	"context"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
)

// live is a sandbox whose VM this server holds.
type live struct {
	s   *Service
	id  string
	box *sandbox.Sandbox

	// ctx is the sandbox's lifetime: processes' output is pumped under it.
	// It ends when the sandbox is deleted or released.
	ctx    context.Context
	cancel context.CancelFunc
	pumps  sync.WaitGroup // command pumps; each ends with its process or ctx

	mu   sync.Mutex          // guards cmds
	cmds map[string]*command // commands started in this sandbox, by ID
}

// adoptLive wraps a sandbox the runtime created or adopted, and watches its
// VM: a VM that exits on its own marks the sandbox failed.
func (s *Service) adoptLive(box *sandbox.Sandbox, sb store.Sandbox) *live {
	ctx, cancel := context.WithCancel(context.Background())
	lv := &live{s: s, id: sb.ID, box: box, ctx: ctx, cancel: cancel, cmds: map[string]*command{}}
	go lv.watch()
	return lv
}

// watch waits for the VM to end or the sandbox to be let go; an unexpected
// VM exit fails the sandbox with the reason.
func (lv *live) watch() {
	select {
	case <-lv.ctx.Done():
		return
	case <-lv.box.Machine().Done():
	}
	if lv.ctx.Err() != nil {
		return
	}
	s := lv.s
	s.mu.Lock()
	if s.live[lv.id] != lv {
		s.mu.Unlock()
		return // being deleted
	}
	delete(s.live, lv.id)
	s.mu.Unlock()
	failure := lv.box.Failure()
	msg := "the sandbox VM exited"
	if failure != nil {
		msg = failure.Error()
	}
	s.log.Warn("sandbox VM exited", "sandbox", lv.id, "reason", msg)
	lv.cancel()
	lv.pumps.Wait()
	lv.endAll("the sandbox VM exited")
	lv.box.Release() // its directory stays, for the console log, until deleted
	s.endCommands(lv.id, "the sandbox VM exited")
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
	lv.box.Release()
	lv.waitPumps(5 * time.Second)
	lv.closeLogs()
}

// destroy stops the VM and removes the sandbox's files.
func (lv *live) destroy(ctx context.Context) error {
	lv.cancel()
	lv.endAll("the sandbox was deleted")
	err := lv.box.Destroy(ctx)
	lv.waitPumps(5 * time.Second)
	lv.closeLogs()
	return err
}

func (lv *live) waitPumps(d time.Duration) {
	done := make(chan struct{})
	go func() { lv.pumps.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		lv.s.log.Warn("command output pumps did not end", "sandbox", lv.id)
	}
}

// endAll ends the stream of every command whose process can no longer be
// followed, so that its readers get an exit.
func (lv *live) endAll(reason string) {
	lv.mu.Lock()
	cmds := make([]*command, 0, len(lv.cmds))
	for _, c := range lv.cmds {
		cmds = append(cmds, c)
	}
	lv.mu.Unlock()
	for _, c := range cmds {
		c.end(reason)
	}
}

func (lv *live) closeLogs() {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	for _, c := range lv.cmds {
		c.closeLog()
	}
}

// getLive returns the held sandbox, or nil.
func (s *Service) getLive(id string) *live {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[id]
}
