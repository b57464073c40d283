package service

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/timings"
)

// Runtime is what the service asks of the host's sandbox runtime: make,
// adopt, wake and remove sandboxes' VMs, keep warm pools, and look after
// what a sandbox leaves on disk while it has no VM. RuntimeOf makes one
// of *sandbox.Runtime, or of sandboxtest.Runtime, an in-memory one for
// tests.
//
// Beside these calls the service reads two things a runtime leaves in
// the data directory (Config.Dir): a sandbox's saved state
// (sandbox.SuspendedState) and its VM's PID file (vm.RunningPID).
type Runtime interface {
	// Create makes and starts a sandbox's VM (sandbox.Runtime.Create).
	Create(ctx context.Context, spec sandbox.Spec) (VM, error)
	// Adopt takes up the VM an earlier server left running.
	Adopt(ctx context.Context, id string, spec sandbox.Spec) (VM, error)
	// Wake restores a suspended sandbox's VM.
	Wake(ctx context.Context, id string) (VM, error)
	// Checkpoint makes checkpoint id of a VM this runtime handed out,
	// which runs on (sandbox.Runtime.Checkpoint).
	Checkpoint(ctx context.Context, box VM, id string) (sandbox.Checkpoint, error)
	// Rollback returns sandbox id to its checkpoint chkID in a new VM;
	// box is its VM, nil when it is suspended (sandbox.Runtime.Rollback).
	Rollback(ctx context.Context, id string, box VM, chkID string) (VM, error)
	RuntimeOps
}

// VMRuntime is a Runtime whose Create, Adopt and Wake return a VM type of
// its own, as *sandbox.Runtime's return *sandbox.Sandbox: RuntimeOf makes
// it a Runtime.
type VMRuntime[V VM] interface {
	Create(ctx context.Context, spec sandbox.Spec) (V, error)
	Adopt(ctx context.Context, id string, spec sandbox.Spec) (V, error)
	Wake(ctx context.Context, id string) (V, error)
	Checkpoint(ctx context.Context, box V, id string) (sandbox.Checkpoint, error)
	Rollback(ctx context.Context, id string, box V, chkID string) (V, error)
	RuntimeOps
}

// RuntimeOps are the calls of a Runtime that hand out no VM.
type RuntimeOps interface {
	// Remove removes a sandbox without a VM in this process: its
	// directory, and a VM an earlier server left.
	Remove(ctx context.Context, id string) error

	// Resolve fills a spec's defaults from its template and checks it.
	Resolve(spec sandbox.Spec) (sandbox.Spec, template.Template, error)
	// Fit does what Resolve does for a template known from elsewhere.
	Fit(spec sandbox.Spec, tpl template.Template) (sandbox.Spec, error)
	// Limits are the cgroup limits of a VM of that size, nil for none.
	Limits(vcpus, memoryMiB int) *cgroup.Resources
	// Templates is the runtime's template store: Config.Templates's
	// default.
	Templates() *template.Store

	// StartPools, Pools, StopPools, Claim, Unclaim and ShedPoolMember
	// keep the warm pools (sandbox.Runtime's of those names).
	StartPools(ctx context.Context, specs []sandbox.PoolSpec, room func() bool) error
	Pools() []sandbox.PoolStatus
	StopPools(ctx context.Context)
	Claim(spec sandbox.Spec) (string, bool)
	Unclaim(id string)
	ShedPoolMember(ctx context.Context) bool

	// ReclaimSnapshots removes the template snapshots keep does not keep.
	ReclaimSnapshots(keep func(digest string, current bool) bool) (int64, error)
	// SaveSuspendedDisk copies a suspended sandbox's disk to dst.
	SaveSuspendedDisk(ctx context.Context, id, dst string) error
	// SetNetworkRecord sets the egress policy of a sandbox without a VM.
	SetNetworkRecord(id string, p policy.Policy) error
	// EgressLog reads the egress log of a sandbox without a VM.
	EgressLog(id string, limit int) ([]gateway.Event, error)
	// CheckpointSuspended makes checkpoint chkID of suspended sandbox id
	// at rest (sandbox.Runtime.CheckpointSuspended).
	CheckpointSuspended(ctx context.Context, id, chkID string) (sandbox.Checkpoint, error)
	// RemoveCheckpoint removes a checkpoint's files unless a sandbox
	// stands on them, and says whether it did; Checkpoints lists those
	// on this host.
	RemoveCheckpoint(id string) (bool, error)
	Checkpoints() ([]string, error)
	// BuildTools are the image tools of a template build in dir. Template
	// builds need the real runtime's: a fake's refuse.
	BuildTools(dir string) (sandbox.ImageTools, func(), error)
}

// VM is a sandbox's running (or paused) VM that this process owns: what
// the service calls on a *sandbox.Sandbox. Exec, Attach and Agent hand
// out a session with the guest's agent.
type VM interface {
	// SandboxID, MemoryMiB and StepTimings read what the VM was made as.
	SandboxID() string
	MemoryMiB() int
	StepTimings() timings.Timings

	// Done is closed when the VM has ended; Exited says whether it has,
	// and Failure why (nil while it runs).
	Done() <-chan struct{}
	Exited() bool
	Failure() error

	// Agent is the session with the guest's agent, nil while it has none.
	Agent() *agentclient.Client
	Exec(ctx context.Context, req agentproto.ExecRequest, stdio agentclient.Stdio) (*agentclient.Process, error)
	Attach(ctx context.Context, id string, offset int64, stdio agentclient.Stdio) (*agentclient.Process, error)
	Wait(p *agentclient.Process) (agentproto.Exit, error)

	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Paused() bool
	// Suspend saves the VM's state to the sandbox's directory (where
	// sandbox.SuspendedState finds it) and ends the VM.
	Suspend(ctx context.Context) error
	// Destroy stops the VM and removes the sandbox; Release lets go of
	// it and leaves it running, for a later Runtime.Adopt.
	Destroy(ctx context.Context) error
	Release()

	SaveDisk(ctx context.Context, dst string) error
	SetNetwork(p policy.Policy) error
	EgressLog(limit int) ([]gateway.Event, error)
	DialGuest(ctx context.Context, port uint16) (net.Conn, error)
	VMMStats() (cgroup.Stats, error)
}

// Clock tells the service the time: when things happen, and when leases
// end. Config.Clock's default is the system's.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// RuntimeOf is rt as the service's Runtime: RuntimeOf(rt) of the host's
// *sandbox.Runtime in a server, of a sandboxtest.Runtime in tests.
func RuntimeOf[V VM](rt VMRuntime[V]) Runtime { return runtimeOf[V]{rt} }

// runtimeOf passes rt's VMs on as VMs: Go takes no V for a VM in the
// result of an interface's method.
type runtimeOf[V VM] struct{ VMRuntime[V] }

func (r runtimeOf[V]) Create(ctx context.Context, spec sandbox.Spec) (VM, error) {
	box, err := r.VMRuntime.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return box, nil
}

func (r runtimeOf[V]) Adopt(ctx context.Context, id string, spec sandbox.Spec) (VM, error) {
	box, err := r.VMRuntime.Adopt(ctx, id, spec)
	if err != nil {
		return nil, err
	}
	return box, nil
}

func (r runtimeOf[V]) Wake(ctx context.Context, id string) (VM, error) {
	box, err := r.VMRuntime.Wake(ctx, id)
	if err != nil {
		return nil, err
	}
	return box, nil
}

func (r runtimeOf[V]) Checkpoint(ctx context.Context, box VM, id string) (sandbox.Checkpoint, error) {
	v, ok := box.(V)
	if !ok {
		return sandbox.Checkpoint{}, fmt.Errorf("a VM of type %T is not this runtime's", box)
	}
	return r.VMRuntime.Checkpoint(ctx, v, id)
}

func (r runtimeOf[V]) Rollback(ctx context.Context, id string, box VM, chkID string) (VM, error) {
	var v V // nil: no VM
	if box != nil {
		var ok bool
		if v, ok = box.(V); !ok {
			return nil, fmt.Errorf("a VM of type %T is not this runtime's", box)
		}
	}
	nb, err := r.VMRuntime.Rollback(ctx, id, v, chkID)
	if err != nil {
		return nil, err
	}
	return nb, nil
}

var (
	_ VMRuntime[*sandbox.Sandbox] = (*sandbox.Runtime)(nil)
	_ VM                          = (*sandbox.Sandbox)(nil)
	_ Runtime                     = runtimeOf[*sandbox.Sandbox]{}
	_ Clock                       = systemClock{}
)
