// Package sandboxtest is an in-memory sandbox runtime for tests of what
// drives sandboxes (internal/service), without VMs. Its Runtime has the
// methods the service asks of *sandbox.Runtime (service.VMRuntime), and
// its VM those of *sandbox.Sandbox (service.VM); service.RuntimeOf makes
// it the service's runtime.
//
// A sandbox's guest is the real guest agent (internal/agent), run in
// this process as on a host in tests: commands run as this process's
// user, in its filesystem, and a host session reaches the agent through
// an in-memory port, as it reaches a VM's through its virtio-serial port.
// The guest outlives its VM as a real VM outlives its server: a released
// VM's guest waits for Adopt, a suspended one's for Wake (its processes
// keep running, where a real guest's are frozen), and the new session
// attaches to the same processes and their output.
//
// Each step can be made to fail (Fail) or to wait (Hold), and Kill ends a
// VM as a crash does. Clock is a clock a test moves by hand.
//
// Lifetimes: a guest's agent serves until the sandbox is destroyed,
// removed or killed, or Close. A Runtime is closed with the test
// (New registers Close with t.Cleanup).
package sandboxtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/timings"
)

// Step is a step of the runtime that a test can make fail or wait.
type Step string

// The steps: Create's two (before anything is made, then the guest's
// boot and init), and one per other call.
const (
	StepCreate  Step = "create"
	StepBoot    Step = "boot"
	StepAdopt   Step = "adopt"
	StepWake    Step = "wake"
	StepSuspend Step = "suspend"
	StepPause   Step = "pause"
	StepResume  Step = "resume"
	StepDestroy Step = "destroy"
	StepRemove  Step = "remove"
	// StepCheckpoint is Checkpoint's, StepRollback Rollback's.
	StepCheckpoint Step = "checkpoint"
	StepRollback   Step = "rollback"
)

// Runtime is an in-memory sandbox runtime. Make it with New.
type Runtime struct {
	dir       datadir.Dir
	templates *template.Store

	mu      sync.Mutex        // guards the fields below
	guests  map[string]*guest // sandboxes with a guest, by ID
	fail    map[Step]error    // steps that fail, with the error
	holds   map[Step]*hold    // steps that wait
	calls   map[Step]int      // how often each step ran
	network map[string]policy.Policy
	// checkpoints are the checkpoints made, by ID, with the spec of the
	// sandbox each is of. A sandbox made from one is a new guest: the
	// fake keeps no memory or disk to carry over.
	checkpoints map[string]sandbox.Spec
	closed      bool
}

// New returns a runtime whose sandboxes' directories and templates are
// under dir (the service's Config.Dir), closed when t ends.
func New(t testing.TB, dir datadir.Dir) *Runtime {
	r := &Runtime{
		dir:       dir,
		templates: template.Open(dir),
		guests:    map[string]*guest{},
		fail:      map[Step]error{},
		holds:     map[Step]*hold{},
		calls:     map[Step]int{},
		network:   map[string]policy.Policy{},

		checkpoints: map[string]sandbox.Spec{},
	}
	t.Cleanup(r.Close)
	return r
}

// Close ends every guest.
func (r *Runtime) Close() {
	r.mu.Lock()
	r.closed = true
	gs := make([]*guest, 0, len(r.guests))
	for id, g := range r.guests {
		gs = append(gs, g)
		delete(r.guests, id)
	}
	r.mu.Unlock()
	for _, g := range gs {
		g.stop()
	}
}

// AddTemplate stores a template image (a few bytes, not a filesystem: no
// VM reads it) with settings and tags it name:latest.
func (r *Runtime) AddTemplate(name string, settings template.Settings) (template.Template, error) {
	dir, err := r.templates.TempDir("sandboxtest")
	if err != nil {
		return template.Template{}, err
	}
	defer os.RemoveAll(dir)
	img := filepath.Join(dir, "disk.ext4")
	if err := os.WriteFile(img, []byte(name+" "+rand.Text()), 0o644); err != nil {
		return template.Template{}, err
	}
	t, err := r.templates.PutImage(context.Background(), img, settings)
	if err != nil {
		return template.Template{}, err
	}
	return r.templates.Tag(name, template.DefaultTag, t.Digest)
}

// Fail makes every later run of step fail with err, until Fail(step, nil).
func (r *Runtime) Fail(step Step, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.fail, step)
		return
	}
	r.fail[step] = err
}

// Hold makes the next runs of step wait, until release is called or their
// context ends (they then fail with its error). entered is closed when
// the first of them starts waiting.
func (r *Runtime) Hold(step Step) (entered <-chan struct{}, release func()) {
	h := &hold{entered: make(chan struct{}), open: make(chan struct{})}
	r.mu.Lock()
	r.holds[step] = h
	r.mu.Unlock()
	return h.entered, func() {
		r.mu.Lock()
		if r.holds[step] == h {
			delete(r.holds, step)
		}
		r.mu.Unlock()
		h.release()
	}
}

// Calls is how often step has run.
func (r *Runtime) Calls(step Step) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[step]
}

// Guest states, as State reports them.
const (
	Running   = "running"   // a VM of this process runs it
	Released  = "released"  // its VM was let go, and waits for Adopt
	Suspended = "suspended" // saved, and waits for Wake
	Gone      = ""          // no guest: never made, removed or killed
)

// State says what is left of sandbox id's guest.
func (r *Runtime) State(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.guests[id]
	switch {
	case g == nil:
		return Gone
	case g.suspended:
		return Suspended
	case g.vm == nil:
		return Released
	}
	return Running
}

// Kill ends sandbox id's VM as a crash does: its Done closes, its Failure
// gives reason (wrapping sandbox.ErrVMExited), and its guest is gone; a
// released one is then not found by Adopt.
func (r *Runtime) Kill(id, reason string) {
	r.mu.Lock()
	g := r.guests[id]
	delete(r.guests, id)
	r.mu.Unlock()
	if g == nil {
		return
	}
	g.stop()
	if vm := r.owner(g); vm != nil {
		vm.end(fmt.Errorf("%s: %w", reason, sandbox.ErrVMExited))
	}
}

// step counts a run of step and returns its injected failure, after any
// hold on it is released.
func (r *Runtime) step(ctx context.Context, step Step) error {
	r.mu.Lock()
	r.calls[step]++
	h := r.holds[step]
	err := r.fail[step]
	r.mu.Unlock()
	if h != nil {
		if err := h.wait(ctx); err != nil {
			return err
		}
		r.mu.Lock()
		err = r.fail[step]
		r.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}

// Create makes a sandbox's guest and connects a VM to it.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (*VM, error) {
	var t timings.Timings
	began := time.Now()
	if err := r.step(ctx, StepCreate); err != nil {
		return nil, err
	}
	if spec.ID == "" {
		spec.ID = sandbox.NewID()
	} else if !sandbox.ValidID(spec.ID) {
		return nil, fmt.Errorf("sandbox ID %q is not valid: %w", spec.ID, errdefs.ErrInvalid)
	}
	if spec.Checkpoint != "" {
		r.mu.Lock()
		_, ok := r.checkpoints[spec.Checkpoint]
		r.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("checkpoint %s is not on this host: %w", spec.Checkpoint, errdefs.ErrNotFound)
		}
	}
	dir := r.dir.Sandbox(spec.ID)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("sandbox %s exists: %w", spec.ID, errdefs.ErrConflict)
		}
		return nil, err
	}
	t.Add("make directory", time.Since(began))
	began = time.Now()
	g, err := r.boot(ctx, spec)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	vm, err := r.connect(ctx, g, true)
	if err != nil {
		g.stop()
		os.RemoveAll(dir)
		return nil, err
	}
	t.Add("boot and init guest", time.Since(began))
	vm.timings = t
	return vm, nil
}

// boot starts sandbox spec.ID's guest: an agent serving on a new port.
func (r *Runtime) boot(ctx context.Context, spec sandbox.Spec) (*guest, error) {
	if err := r.step(ctx, StepBoot); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("the runtime is closed: %w", errdefs.ErrUnavailable)
	}
	if r.guests[spec.ID] != nil {
		return nil, fmt.Errorf("sandbox %s has a guest: %w", spec.ID, errdefs.ErrConflict)
	}
	sctx, cancel := context.WithCancel(context.Background())
	g := &guest{id: spec.ID, spec: spec, port: &port{}, cancel: cancel, served: make(chan struct{})}
	a := agent.New(agent.Config{})
	go func() {
		defer close(g.served)
		// The fake ends a guest by cancelling sctx; Serve's error then
		// says only that, and a guest that fails otherwise shows in the
		// test as an agent that does not answer.
		_ = a.Serve(sctx, g.port, time.Millisecond)
	}()
	r.guests[spec.ID] = g
	return g, nil
}

// connect opens a session with g's agent and makes it g's VM; init
// initialises the guest, as a new VM's first session does.
func (r *Runtime) connect(ctx context.Context, g *guest, init bool) (*VM, error) {
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := agentclient.Handshake(hctx, g.port.connect())
	if err != nil {
		return nil, fmt.Errorf("connect to the agent of %s: %w", g.id, err)
	}
	if init {
		if _, err := c.Init(hctx, agentproto.InitRequest{Env: g.spec.Env}); err != nil {
			c.Close()
			return nil, err
		}
	}
	vm := &VM{rt: r, g: g, agent: c, done: make(chan struct{})}
	r.mu.Lock()
	g.vm, g.suspended = vm, false
	vm.paused = g.paused
	r.mu.Unlock()
	return vm, nil
}

// Adopt connects a new VM to the guest a released VM left.
func (r *Runtime) Adopt(ctx context.Context, id string, spec sandbox.Spec) (*VM, error) {
	if err := r.step(ctx, StepAdopt); err != nil {
		return nil, err
	}
	r.mu.Lock()
	g := r.guests[id]
	r.mu.Unlock()
	switch {
	case g == nil:
		return nil, fmt.Errorf("sandbox %s: no VM runs: %w", id, sandbox.ErrVMExited)
	case g.suspended:
		return nil, fmt.Errorf("sandbox %s is suspended: %w", id, errdefs.ErrConflict)
	case r.owner(g) != nil:
		return nil, fmt.Errorf("sandbox %s is owned by a VM of this process: %w", id, errdefs.ErrConflict)
	}
	return r.connect(ctx, g, false)
}

// Wake connects a new VM to the guest Suspend left, and removes the saved
// state.
func (r *Runtime) Wake(ctx context.Context, id string) (*VM, error) {
	if err := r.step(ctx, StepWake); err != nil {
		return nil, err
	}
	r.mu.Lock()
	g := r.guests[id]
	r.mu.Unlock()
	if g == nil || !g.suspended {
		return nil, fmt.Errorf("sandbox %s is not suspended: %w", id, errdefs.ErrNotFound)
	}
	vm, err := r.connect(ctx, g, false)
	if err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(r.dir.Sandbox(id), sandbox.StateName))
	vm.timings.Add("restore", 0)
	return vm, nil
}

// Remove ends sandbox id's guest, if any, and removes its directory.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if err := r.step(ctx, StepRemove); err != nil {
		return err
	}
	r.mu.Lock()
	g := r.guests[id]
	delete(r.guests, id)
	delete(r.network, id)
	r.mu.Unlock()
	if g != nil {
		g.stop()
	}
	return os.RemoveAll(r.dir.Sandbox(id))
}

// Resolve fills in spec's defaults from its template (default "base") as
// sandbox.Runtime.Resolve does.
func (r *Runtime) Resolve(spec sandbox.Spec) (sandbox.Spec, template.Template, error) {
	if spec.Template == "" {
		spec.Template = "base"
	}
	tpl, err := r.templates.Resolve(spec.Template)
	if err != nil {
		return spec, tpl, err
	}
	spec, err = r.Fit(spec, tpl)
	return spec, tpl, err
}

// Fit is sandbox.Runtime.Fit: the bounds are the host's, which a runtime
// of no configuration checks as well as any.
func (r *Runtime) Fit(spec sandbox.Spec, tpl template.Template) (sandbox.Spec, error) {
	return new(sandbox.Runtime).Fit(spec, tpl)
}

// Limits are none: the fake's VMs run in no cgroup.
func (r *Runtime) Limits(vcpus, memoryMiB int) *cgroup.Resources { return nil }

// Templates is the store AddTemplate adds to.
func (r *Runtime) Templates() *template.Store { return r.templates }

// StartPools refuses warm pools, which the fake does not keep.
func (r *Runtime) StartPools(ctx context.Context, specs []sandbox.PoolSpec, room func() bool) error {
	if len(specs) > 0 {
		return fmt.Errorf("sandboxtest keeps no warm pools: %w", errdefs.ErrInvalid)
	}
	return nil
}

// Pools is empty.
func (r *Runtime) Pools() []sandbox.PoolStatus { return nil }

// StopPools does nothing.
func (r *Runtime) StopPools(ctx context.Context) {}

// Claim finds no pool member.
func (r *Runtime) Claim(spec sandbox.Spec) (string, bool) { return "", false }

// Unclaim does nothing.
func (r *Runtime) Unclaim(id string) {}

// ShedPoolMember has none to shed.
func (r *Runtime) ShedPoolMember(ctx context.Context) bool { return false }

// ReclaimSnapshots has none to reclaim.
func (r *Runtime) ReclaimSnapshots(keep func(digest string, current bool) bool) (int64, error) {
	return 0, nil
}

// SaveSuspendedDisk writes a few bytes naming the sandbox to dst.
func (r *Runtime) SaveSuspendedDisk(ctx context.Context, id, dst string) error {
	return os.WriteFile(dst, []byte("disk of "+id), 0o644)
}

// SetNetworkRecord records p as sandbox id's egress policy (Network).
func (r *Runtime) SetNetworkRecord(id string, p policy.Policy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.network[id] = p
	return nil
}

// Network is the egress policy last set for sandbox id, on its VM or not.
func (r *Runtime) Network(id string) (policy.Policy, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.network[id]
	return p, ok
}

// EgressLog is empty: the fake's sandboxes have no gateway.
func (r *Runtime) EgressLog(id string, limit int) ([]gateway.Event, error) { return nil, nil }

// Checkpoint records checkpoint id of box's sandbox.
func (r *Runtime) Checkpoint(ctx context.Context, box *VM, id string) (sandbox.Checkpoint, error) {
	if err := r.step(ctx, StepCheckpoint); err != nil {
		return sandbox.Checkpoint{}, err
	}
	if !sandbox.ValidCheckpointID(id) {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint ID %q is not valid: %w", id, errdefs.ErrInvalid)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.checkpoints[id]; ok {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint %s exists: %w", id, errdefs.ErrConflict)
	}
	r.checkpoints[id] = box.g.spec
	return sandbox.Checkpoint{ID: id, Dir: r.dir.Checkpoint(id), Sandbox: box.g.id, Spec: box.g.spec, SizeBytes: 1 << 20}, nil
}

// CheckpointSuspended records checkpoint id of suspended sandbox sbxID.
func (r *Runtime) CheckpointSuspended(ctx context.Context, sbxID, id string) (sandbox.Checkpoint, error) {
	if err := r.step(ctx, StepCheckpoint); err != nil {
		return sandbox.Checkpoint{}, err
	}
	if !sandbox.ValidCheckpointID(id) {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint ID %q is not valid: %w", id, errdefs.ErrInvalid)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.guests[sbxID]
	if g == nil || !g.suspended {
		return sandbox.Checkpoint{}, fmt.Errorf("sandbox %s is not suspended: %w", sbxID, errdefs.ErrConflict)
	}
	if _, ok := r.checkpoints[id]; ok {
		return sandbox.Checkpoint{}, fmt.Errorf("checkpoint %s exists: %w", id, errdefs.ErrConflict)
	}
	r.checkpoints[id] = g.spec
	return sandbox.Checkpoint{ID: id, Dir: r.dir.Checkpoint(id), Sandbox: sbxID, Spec: g.spec, SizeBytes: 1 << 20}, nil
}

// Rollback gives sandbox id a new guest in place of its VM (box) or its
// saved state, for its own checkpoint chkID, as sandbox.Runtime.Rollback
// does: the fake carries no memory or disk over. An injected failure
// fails it before anything changes.
func (r *Runtime) Rollback(ctx context.Context, id string, box *VM, chkID string) (*VM, error) {
	if err := r.step(ctx, StepRollback); err != nil {
		return nil, err
	}
	if !sandbox.ValidCheckpointID(chkID) {
		return nil, fmt.Errorf("checkpoint ID %q is not valid: %w", chkID, errdefs.ErrInvalid)
	}
	r.mu.Lock()
	spec, ok := r.checkpoints[chkID]
	g := r.guests[id]
	if ok && spec.ID == id && g != nil {
		delete(r.guests, id)
	}
	r.mu.Unlock()
	switch {
	case !ok:
		return nil, fmt.Errorf("checkpoint %s is not on this host: %w", chkID, errdefs.ErrNotFound)
	case spec.ID != id:
		return nil, fmt.Errorf("checkpoint %s is of another sandbox: %w", chkID, errdefs.ErrInvalid)
	case g == nil:
		return nil, fmt.Errorf("sandbox %s has no guest: %w", id, errdefs.ErrNotFound)
	}
	if box != nil {
		box.end(nil)
	}
	g.stop()
	if err := os.Remove(filepath.Join(r.dir.Sandbox(id), sandbox.StateName)); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	ng, err := r.boot(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, sandbox.ErrVMExited)
	}
	vm, err := r.connect(ctx, ng, true)
	if err != nil {
		ng.stop()
		return nil, fmt.Errorf("%w: %w", err, sandbox.ErrVMExited)
	}
	return vm, nil
}

// RemoveCheckpoint forgets checkpoint id.
func (r *Runtime) RemoveCheckpoint(id string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.checkpoints, id)
	return true, nil
}

// Checkpoints lists the checkpoints made and not removed.
func (r *Runtime) Checkpoints() ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.checkpoints {
		out = append(out, id)
	}
	return out, nil
}

// BuildTools refuses: template builds need the real runtime.
func (r *Runtime) BuildTools(dir string) (sandbox.ImageTools, func(), error) {
	return sandbox.ImageTools{}, nil, fmt.Errorf("sandboxtest builds no templates: %w", errdefs.ErrPrecondition)
}

// guest is a sandbox's guest: an agent serving on a port.
type guest struct {
	id     string
	spec   sandbox.Spec
	port   *port
	cancel context.CancelFunc // ends the agent's Serve
	served chan struct{}      // closed when Serve has returned

	// vm and suspended are guarded by the runtime's mu.
	vm        *VM  // the VM connected to it; nil once released or suspended
	suspended bool // Suspend saved it
	paused    bool // Pause stopped it: Adopt finds it so
}

// owner is the VM connected to g, nil for none.
func (r *Runtime) owner(g *guest) *VM {
	r.mu.Lock()
	defer r.mu.Unlock()
	return g.vm
}

// stop ends the agent's Serve and waits for it.
func (g *guest) stop() {
	g.cancel()
	g.port.disconnect()
	<-g.served
}

// hold is a step that waits (Runtime.Hold).
type hold struct {
	enterOnce sync.Once
	entered   chan struct{}
	openOnce  sync.Once
	open      chan struct{}
}

func (h *hold) wait(ctx context.Context) error {
	h.enterOnce.Do(func() { close(h.entered) })
	select {
	case <-h.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *hold) release() { h.openOnce.Do(func() { close(h.open) }) }
