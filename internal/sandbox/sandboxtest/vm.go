package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/timings"
)

// VM is a sandbox's VM in the fake: a session with its guest's agent.
// It has the methods the service calls on a *sandbox.Sandbox.
type VM struct {
	rt      *Runtime
	g       *guest
	agent   *agentclient.Client
	timings timings.Timings

	endOnce sync.Once
	done    chan struct{} // closed when the VM ended: killed, suspended or destroyed

	mu      sync.Mutex // guards the fields below
	failure error      // why it was killed
	paused  bool
	ended   bool // suspended, destroyed or released: the VM is spent
}

// end ends the VM, with failure when it was killed.
func (v *VM) end(failure error) {
	v.mu.Lock()
	v.ended = true
	if v.failure == nil {
		v.failure = failure
	}
	v.mu.Unlock()
	v.agent.Close()
	v.endOnce.Do(func() { close(v.done) })
}

// SandboxID is the sandbox's ID.
func (v *VM) SandboxID() string { return v.g.id }

// MemoryMiB is the memory the sandbox was made with.
func (v *VM) MemoryMiB() int { return v.g.spec.MemoryMiB }

// StepTimings are the steps Create or Wake took.
func (v *VM) StepTimings() timings.Timings { return v.timings }

// Done is closed when the VM has ended.
func (v *VM) Done() <-chan struct{} { return v.done }

// Exited reports whether the VM has ended.
func (v *VM) Exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// Failure is why Kill ended the VM, nil otherwise.
func (v *VM) Failure() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.failure
}

// Agent is the session with the guest's agent.
func (v *VM) Agent() *agentclient.Client { return v.agent }

// session returns the agent session for a request, or a conflict while
// the VM is paused, as *sandbox.Sandbox's does.
func (v *VM) session() (*agentclient.Client, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.failure != nil:
		return nil, v.failure
	case v.ended:
		return nil, fmt.Errorf("sandbox %s has no VM: %w", v.g.id, errdefs.ErrConflict)
	case v.paused:
		return nil, fmt.Errorf("sandbox %s is paused: resume it first: %w", v.g.id, errdefs.ErrConflict)
	}
	return v.agent, nil
}

// explain turns a cut session into the VM's failure, when it was killed.
func (v *VM) explain(err error) error {
	if err == nil || !errors.Is(err, agentclient.ErrDisconnected) && !errors.Is(err, context.Canceled) {
		return err
	}
	if f := v.Failure(); f != nil {
		return f
	}
	return err
}

// Exec runs a process in the guest.
func (v *VM) Exec(ctx context.Context, req agentproto.ExecRequest, stdio agentclient.Stdio) (*agentclient.Process, error) {
	c, err := v.session()
	if err != nil {
		return nil, err
	}
	p, err := c.Exec(ctx, req, stdio)
	return p, v.explain(err)
}

// Attach joins process id in the guest from offset on.
func (v *VM) Attach(ctx context.Context, id string, offset int64, stdio agentclient.Stdio) (*agentclient.Process, error) {
	c, err := v.session()
	if err != nil {
		return nil, err
	}
	p, err := c.Attach(ctx, id, offset, stdio)
	return p, v.explain(err)
}

// Wait waits for p.
func (v *VM) Wait(p *agentclient.Process) (agentproto.Exit, error) {
	exit, err := p.Wait()
	return exit, v.explain(err)
}

// Pause marks the VM paused: requests are refused until Resume. The
// guest's processes keep running.
func (v *VM) Pause(ctx context.Context) error {
	if err := v.rt.step(ctx, StepPause); err != nil {
		return err
	}
	if _, err := v.session(); err != nil {
		return err
	}
	v.setPaused(true)
	return nil
}

// Resume ends a pause.
func (v *VM) Resume(ctx context.Context) error {
	if err := v.rt.step(ctx, StepResume); err != nil {
		return err
	}
	v.mu.Lock()
	ended := v.ended
	v.mu.Unlock()
	if ended {
		return fmt.Errorf("sandbox %s has no VM: %w", v.g.id, errdefs.ErrConflict)
	}
	v.setPaused(false)
	return nil
}

// setPaused sets the VM's pause and its guest's, which a later Adopt
// finds.
func (v *VM) setPaused(paused bool) {
	v.rt.mu.Lock()
	v.g.paused = paused
	v.rt.mu.Unlock()
	v.mu.Lock()
	v.paused = paused
	v.mu.Unlock()
}

// Paused reports whether the VM is paused.
func (v *VM) Paused() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.paused
}

// Suspend writes the sandbox's saved state (sandbox.StateName, which
// sandbox.SuspendedState finds) and ends the VM; the guest waits for
// Runtime.Wake. A failed suspend leaves the VM running.
func (v *VM) Suspend(ctx context.Context) error {
	if err := v.rt.step(ctx, StepSuspend); err != nil {
		return err
	}
	if _, err := v.session(); err != nil && !errors.Is(err, errdefs.ErrConflict) || v.Exited() {
		return fmt.Errorf("sandbox %s has no VM to suspend: %w", v.g.id, errdefs.ErrConflict)
	}
	state := filepath.Join(v.rt.dir.Sandbox(v.g.id), sandbox.StateName)
	if err := os.WriteFile(state, []byte("suspended"), 0o644); err != nil {
		return err
	}
	v.rt.mu.Lock()
	if v.g.vm == v {
		v.g.vm, v.g.suspended, v.g.paused = nil, true, false
	}
	v.rt.mu.Unlock()
	v.end(nil)
	return nil
}

// Destroy ends the guest and removes the sandbox's directory. An injected
// failure fails it after the guest ended, with the directory left.
func (v *VM) Destroy(ctx context.Context) error {
	v.rt.mu.Lock()
	if v.rt.guests[v.g.id] == v.g {
		delete(v.rt.guests, v.g.id)
	}
	delete(v.rt.network, v.g.id)
	v.rt.mu.Unlock()
	v.end(nil)
	v.g.stop()
	if err := v.rt.step(ctx, StepDestroy); err != nil {
		return err
	}
	return os.RemoveAll(v.rt.dir.Sandbox(v.g.id))
}

// Release lets go of the VM and leaves the guest for Runtime.Adopt. The
// VM's Done does not close: the VM goes on, without this process.
func (v *VM) Release() {
	v.rt.mu.Lock()
	if v.g.vm == v {
		v.g.vm = nil
	}
	v.rt.mu.Unlock()
	v.mu.Lock()
	v.ended = true
	v.mu.Unlock()
	v.agent.Close()
}

// SaveDisk writes a few bytes naming the sandbox to dst.
func (v *VM) SaveDisk(ctx context.Context, dst string) error {
	return os.WriteFile(dst, []byte("disk of "+v.g.id), 0o644)
}

// SetNetwork records p as the sandbox's egress policy (Runtime.Network).
func (v *VM) SetNetwork(p policy.Policy) error { return v.rt.SetNetworkRecord(v.g.id, p) }

// EgressLog is empty: the fake's sandboxes have no gateway.
func (v *VM) EgressLog(limit int) ([]gateway.Event, error) { return nil, nil }

// DialGuest refuses: the fake's sandboxes have no network.
func (v *VM) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	return nil, fmt.Errorf("sandboxtest VMs have no network: %w", errdefs.ErrUnavailable)
}

// VMMStats refuses: the fake's VMs have no cgroup.
func (v *VM) VMMStats() (cgroup.Stats, error) {
	return cgroup.Stats{}, fmt.Errorf("sandboxtest VMs have no cgroup: %w", errdefs.ErrNotFound)
}

// Clock is a clock that moves only when told (the service's Config.Clock).
type Clock struct {
	mu  sync.Mutex // guards now
	now time.Time
}

// NewClock returns a clock set to t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
