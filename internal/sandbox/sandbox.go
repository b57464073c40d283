// Package sandbox creates and destroys sandboxes: a VM with a
// copy-on-write disk over a template, and a session with the agent inside
// it. It is the runtime the CLI and the server share.
//
// A sandbox's VM is a clone of its template's snapshot (TemplateSnapshot):
// the template booted once, with its RAM in a file, and saved where its
// agent waits for init. A clone maps that file private, restores the saved
// device state with its own disk and sockets, and is initialised as a
// booted guest is (clock, fresh entropy, hostname, disk). A template with
// a start command and a readiness check has a warm snapshot instead,
// saved with its server up, whose clones are given their own identity
// and start nothing (warm.go). Snapshots live under the data directory's
// snapshots/, one per template, vCPU count and memory size, made on first
// use and kept: a clone's memory file (and a warm clone's disk layer)
// must outlive it, and nothing removes a usable snapshot. A snapshot that
// cannot be made or restored makes Create boot the VM from scratch, as
// Config.ColdBoot and Spec.ColdBoot ask for.
//
// Each sandbox has a directory under the data directory's sandboxes/,
// named by its ID, holding its disk, the VM's sockets, logs and pid file,
// and an owner lock: a flock held by the process that owns the sandbox
// (the one that created or adopted it) for as long as it runs, which the
// kernel drops when that process dies. A VM started with Spec.Detach
// outlives its owner, and two mechanisms share what is left behind:
//
//   - Runtime.Adopt is for the sandboxes a caller knows about (a server
//     restarting with its store). It takes the owner lock, adopts the VM if
//     its QEMU still runs, and opens a fresh session with the agent; if the
//     QEMU is gone it says why (vm.ErrNotRunning, ErrVMExited, with the
//     console) and leaves the directory for the caller to Remove once it
//     has recorded the failure. Runtime.Remove clears a sandbox the caller
//     gave up on, killing its QEMU if that still runs.
//   - Sweep, which New runs, is for what nobody knows about: it removes
//     directories that have no owner and whose QEMU is not running, and
//     never touches one whose QEMU is alive, whose lock is held or that
//     holds a saved state. So detached VMs wait, untouched, for Adopt or
//     Remove, and suspended sandboxes for Wake or Remove.
//
// A sandbox can be paused (Sandbox.Pause: its vCPUs stop, its memory
// stays) and resumed, or suspended (Sandbox.Suspend: its state is saved in
// its directory and its QEMU ends) and woken (Runtime.Wake, in this
// process or a later one). Create records the VM's configuration in the
// directory (RecordName) so that Wake can start the same VM to restore
// into.
package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/guest"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/timings"
	"github.com/airlockhq/airlock/internal/vm"
)

// Config configures a Runtime.
type Config struct {
	// Dir is the data directory.
	Dir datadir.Dir
	// Accel is "kvm", "tcg" or "auto" (the default: the cached verdict of
	// the probe, which runs on first use).
	Accel string
	// BootTimeout bounds a VM's boot to agent ready. Default 60 s.
	BootTimeout time.Duration
	// ColdBoot boots every sandbox from scratch instead of cloning its
	// template's snapshot (TemplateSnapshot). Default false: clones.
	ColdBoot bool
	// StartTimeout bounds how long Create waits for a template's start
	// command to answer on its ready port (template.Settings.ReadyPort).
	// Default 60 s.
	StartTimeout time.Duration
	// Network configures the sandboxes' gateways.
	Network NetworkConfig
	// Unjailed runs every QEMU unconfined, as this process's user, for
	// debugging only. Otherwise each runs in a jail of its own (vm.Jail)
	// as a user from UIDs, which needs root.
	Unjailed bool
	// UIDs is the range of jailed VMs' users; zero means vm.DefaultUIDs.
	UIDs vm.UIDRange
	// Log receives the runtime's diagnostics.
	Log *slog.Logger
}

// Runtime creates sandboxes.
type Runtime struct {
	cfg       Config
	log       *slog.Logger
	templates *template.Store
	accel     vm.Accel
	cpu       string            // the -cpu model under KVM
	cg        *cgroup.Hierarchy // the VMs' cgroups; nil when they run unjailed

	built atomic.Int64 // template snapshots this runtime made

	// chkUse is held shared by each create and rollback from a
	// checkpoint until it is done, by when the sandbox's record names
	// what it stands on, and exclusively by RemoveCheckpoint, which
	// leaves a checkpoint it cannot take it for to a later call.
	chkUse sync.RWMutex

	mu sync.Mutex // guards failedBuilds and pools
	// failedBuilds holds, per template snapshot, when and how this
	// runtime last failed to make it; another try waits for
	// snapshotRetryAfter, and creates boot meanwhile.
	failedBuilds map[snapshotKey]failedBuild
	// pools are the warm pools (StartPools).
	pools []*pool
}

// New checks that the host is set up and returns a runtime. With Accel
// "auto" it probes the accelerator once and caches the verdict.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 60 * time.Second
	}
	if err := guest.Check(cfg.Dir); err != nil {
		return nil, err
	}
	if cfg.UIDs == (vm.UIDRange{}) {
		cfg.UIDs = vm.DefaultUIDs
	}
	if !cfg.Unjailed {
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("jailed VMs need root (each QEMU runs as a user of its own): run as root, or turn the jail off for debugging: %w", errdefs.ErrPrecondition)
		}
		if err := cfg.UIDs.Check(); err != nil {
			return nil, err
		}
	}
	r := &Runtime{cfg: cfg, log: cfg.Log, templates: template.Open(cfg.Dir)}
	if !cfg.Unjailed {
		h, err := cgroup.Open(cgroupParent(cfg.Dir))
		if err != nil {
			return nil, fmt.Errorf("jailed VMs need cgroups (or turn the jail off for debugging): %w", err)
		}
		r.cg = h
	}
	Sweep(cfg.Dir, cfg.Log)
	r.removePoolLeftovers(ctx)
	if r.cg != nil {
		r.sweepCgroups()
	}
	switch cfg.Accel {
	case "kvm", "tcg":
		r.accel = vm.Accel(cfg.Accel)
	case "", "auto":
		a, err := ProbeAccel(ctx, cfg.Dir, cfg.Log, false)
		if err != nil {
			return nil, err
		}
		r.accel, r.cpu = a.Accel, a.CPU
	default:
		return nil, fmt.Errorf("accelerator %q is not kvm, tcg or auto: %w", cfg.Accel, errdefs.ErrInvalid)
	}
	return r, nil
}

// Accel is the accelerator sandboxes run with.
func (r *Runtime) Accel() vm.Accel { return r.accel }

// CPU is the -cpu model sandboxes run with under KVM ("" means host).
func (r *Runtime) CPU() string { return r.cpu }

// Jailed reports whether the runtime's VMs run jailed.
func (r *Runtime) Jailed() bool { return !r.cfg.Unjailed }

// jail returns the jail of the VM whose files are in dir, as the user
// want names when that is still free (a sandbox woken again keeps its
// user), or nil when the runtime's VMs run unjailed.
func (r *Runtime) jail(dir string, want *vm.Jail) (*vm.Jail, error) {
	if r.cfg.Unjailed {
		return nil, nil
	}
	w := 0
	if want != nil {
		w = want.UID
	}
	uids := r.cfg.UIDs
	if uids == (vm.UIDRange{}) {
		uids = vm.DefaultUIDs
	}
	uid, err := uids.AllocateUID(dir, w)
	if err != nil {
		return nil, err
	}
	j := &vm.Jail{UID: uid, GID: uid}
	if r.accel == vm.AccelKVM {
		// The group that may open /dev/kvm, unless anyone may.
		if fi, err := os.Stat("/dev/kvm"); err == nil && fi.Mode().Perm()&0o006 != 0o006 {
			j.Groups = []int{int(fi.Sys().(*syscall.Stat_t).Gid)}
		}
	}
	return j, nil
}

// jailStep gives the sandbox's VM its jail.
func (r *Runtime) jailStep(sb *Sandbox, cfg *vm.Config) step {
	return step{"jail vm", func(context.Context) error {
		var err error
		cfg.Jail, err = r.jail(sb.Dir, nil)
		return err
	}, nil}
}

// removeDir removes a sandbox's directory and frees what the host kept
// for it: its jail's user.
func removeDir(dir string) error {
	err := os.RemoveAll(dir)
	vm.ReleaseUID(dir)
	return err
}

// Templates is the template store.
func (r *Runtime) Templates() *template.Store { return r.templates }

// Spec is what a sandbox is made of. Zero values take the template's
// defaults.
type Spec struct {
	// ID names the sandbox; empty means a fresh NewID. It must satisfy
	// ValidID and not be in use.
	ID        string `json:"id"`
	Template  string `json:"template"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memory_mib"`
	DiskMiB   int    `json:"disk_mib"`
	// Env is the default environment of every command.
	Env map[string]string `json:"env,omitempty"`
	// Detach lets the VM outlive this process.
	Detach bool `json:"detach,omitempty"`
	// ColdBoot boots the VM from scratch instead of cloning the template's
	// snapshot, as Config.ColdBoot does for every sandbox.
	ColdBoot bool `json:"cold_boot,omitempty"`
	// Network is the egress policy of the sandbox's gateway; nil denies
	// all egress. It must be valid (policy.Policy.Validate).
	Network *policy.Policy `json:"network,omitempty"`
	// NoStart skips the template's start command (a template build's
	// sandbox runs steps, not the template's server).
	NoStart bool `json:"no_start,omitempty"`
	// AuxPort gives the VM vm.Config.AuxPort, for the bench. It needs
	// ColdBoot: a clone has its template snapshot's devices.
	AuxPort bool `json:"aux_port,omitempty"`
	// Checkpoint makes the sandbox from that checkpoint (Runtime.Checkpoint)
	// instead of its template's snapshot: its memory, processes and disk
	// as they were, with the sandbox's own identity. Template, VCPUs and
	// MemoryMiB must be the checkpoint's (CheckpointSpec).
	Checkpoint string `json:"checkpoint,omitempty"`
}

// Limits bound what one sandbox may ask for, to protect the host.
type Limits struct {
	MaxVCPUs     int
	MinMemoryMiB int
	MaxMemoryMiB int
	MaxDiskMiB   int
}

// HostLimits derives the per-sandbox bounds from this host: no more vCPUs
// than host CPUs, no more memory than half the host's.
func HostLimits() Limits {
	l := Limits{MaxVCPUs: runtime.NumCPU(), MinMemoryMiB: 128, MaxMemoryMiB: 8192, MaxDiskMiB: 256 << 10}
	if mem := hostMemoryMiB(); mem > 0 {
		l.MaxMemoryMiB = mem / 2
	}
	return l
}

func hostMemoryMiB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
			return kb / 1024
		}
	}
	return 0
}

// Resolve fills in spec's defaults from its template (default "base") and
// checks its bounds against HostLimits, as Create does first. Bounds that
// are exceeded are errdefs.ErrInvalid; an unknown template is
// errdefs.ErrNotFound.
func (r *Runtime) Resolve(spec Spec) (Spec, template.Template, error) {
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

// Fit fills what spec leaves unset from tpl's defaults and checks the
// result against the host's limits, as Resolve does for a template the
// runtime's store holds: for a template known from elsewhere, such as a
// cluster's catalogue.
func (r *Runtime) Fit(spec Spec, tpl template.Template) (Spec, error) {
	if spec.VCPUs == 0 {
		spec.VCPUs = tpl.VCPUs
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = tpl.MemoryMiB
	}
	if spec.DiskMiB == 0 {
		spec.DiskMiB = tpl.DiskMiB
	}
	l := HostLimits()
	minDisk := minDiskMiB(tpl)
	var errs []string
	if spec.VCPUs < 1 || spec.VCPUs > l.MaxVCPUs {
		errs = append(errs, fmt.Sprintf("vcpus %d is out of bounds: use 1 to %d", spec.VCPUs, l.MaxVCPUs))
	}
	if spec.MemoryMiB < l.MinMemoryMiB || spec.MemoryMiB > l.MaxMemoryMiB {
		errs = append(errs, fmt.Sprintf("memory %d MiB is out of bounds: use %d to %d", spec.MemoryMiB, l.MinMemoryMiB, l.MaxMemoryMiB))
	}
	if spec.DiskMiB < minDisk || spec.DiskMiB > l.MaxDiskMiB {
		errs = append(errs, fmt.Sprintf("disk %d MiB is out of bounds: template %s needs %d to %d", spec.DiskMiB, tpl.Ref(), minDisk, l.MaxDiskMiB))
	}
	if spec.AuxPort && !spec.ColdBoot && !r.cfg.ColdBoot {
		errs = append(errs, "an aux port needs a cold boot")
	}
	if len(errs) > 0 {
		return spec, fmt.Errorf("%s: %w", strings.Join(errs, "; "), errdefs.ErrInvalid)
	}
	return spec, nil
}

// Sandbox is a sandbox whose VM runs (or is paused) and that this process
// owns.
type Sandbox struct {
	ID       string
	Dir      string
	Spec     Spec
	Template template.Template
	Init     agentproto.InitResult
	// Snapshot is the directory of the template snapshot the sandbox's VM
	// was cloned from; empty when it booted. Create, Wake and Adopt set it.
	Snapshot string
	// Warm is true when that snapshot is warm: the template's server came
	// with the clone, running, and its start command never ran in the
	// sandbox. Create, Wake and Adopt set it.
	Warm bool
	// Timings break down how long Create or Wake took, step by step, in
	// the order the steps ran; a part of the guest's init is "init guest:
	// <part>". Empty after Adopt.
	Timings timings.Timings

	log *slog.Logger
	vm  *vm.Machine

	// life serialises Pause, Resume, Suspend and Reconnect.
	life sync.Mutex

	mu sync.Mutex // guards the fields below
	// agent is the session with the agent, which Reconnect and Resume
	// replace; nil while the sandbox is paused after an Adopt, which
	// cannot reach the agent of a paused guest.
	agent     *agentclient.Client
	paused    bool // the vCPUs are stopped (Pause, or found so by Adopt)
	suspended bool // Suspend saved the sandbox and ended its VM
	replaced  bool // Rollback ended its VM for another
	// gw is the sandbox's gateway, with its CA and egress log; nil when
	// the VM has no network device, or it is suspended.
	gw     *gateway.Gateway
	ca     *mitm.CA
	events *gateway.Log

	owner *os.File // holds the directory's owner lock while this process owns it

	cgMu sync.Mutex    // held while the cgroup is read or removed
	cg   *cgroup.Group // the VM's cgroup; nil when unjailed or removed

	releaseOnce sync.Once
	released    chan struct{} // closed by Release; ends watch
}

// NewID returns a fresh sandbox ID: "sbx" and 20 lowercase letters and digits.
func NewID() string { return ids.New("sbx") }

// maxIDLen bounds a sandbox ID, which names its directory and is part of
// its socket paths.
const maxIDLen = 63

// ValidID reports whether id can name a sandbox: "sbx" followed by
// lowercase letters and digits, at most 63 bytes in all.
func ValidID(id string) bool {
	rest, ok := strings.CutPrefix(id, "sbx")
	if !ok || rest == "" || len(id) > maxIDLen {
		return false
	}
	for _, c := range rest {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// step is one part of a start, with the undo that reverses it.
type step struct {
	name string
	do   func(ctx context.Context) error
	undo func()
}

// runSteps runs steps in order, recording each one's duration in t when t
// is not nil; on a failure it undoes the completed ones in reverse and
// returns the failure.
func runSteps(ctx context.Context, steps []step, t *timings.Timings) error {
	for i, s := range steps {
		began := time.Now()
		err := s.do(ctx)
		if t != nil {
			t.Add(s.name, time.Since(began))
		}
		if err != nil {
			for j := i - 1; j >= 0; j-- {
				if steps[j].undo != nil {
					steps[j].undo()
				}
			}
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// Create starts a new sandbox, as a clone of its template's snapshot
// (TemplateSnapshot, made first if need be) unless Config.ColdBoot or
// Spec.ColdBoot asks for a boot from scratch. A clone that cannot be made
// (the snapshot cannot be made or restored) is logged as a warning and
// the sandbox booted instead. On failure nothing of it is left behind. A
// Spec.ID that is not ValidID is errdefs.ErrInvalid; one whose directory
// exists is errdefs.ErrConflict, unless it is a warm pool member that
// Claim took: the sandbox is then made of it (finishPooled).
func (r *Runtime) Create(ctx context.Context, spec Spec) (*Sandbox, error) {
	if spec.ID == "" {
		spec.ID = NewID()
	} else if !ValidID(spec.ID) {
		return nil, invalidID(spec.ID)
	}
	if spec.Checkpoint != "" {
		return r.fromCheckpoint(ctx, spec)
	}
	if sb, _ := r.takeClaimed(spec.ID); sb != nil {
		spec, _, err := r.Resolve(spec)
		if err != nil {
			sb.Destroy(context.WithoutCancel(ctx))
			return nil, err
		}
		return r.finishPooled(ctx, sb, spec)
	}
	spec, tpl, err := r.Resolve(spec)
	if err != nil {
		return nil, err
	}
	var failed timings.Timings // a clone that failed before the boot
	if !r.cfg.ColdBoot && !spec.ColdBoot {
		began := time.Now()
		sb, err := r.clone(ctx, spec, tpl)
		if err == nil {
			return r.started(ctx, sb, spec)
		}
		if ctx.Err() != nil || errors.Is(err, errdefs.ErrConflict) {
			return nil, fmt.Errorf("create sandbox: %w", err)
		}
		r.log.Warn("cloning the template snapshot failed: booting the sandbox instead", "sandbox", spec.ID, "err", err)
		failed.Add("failed clone", time.Since(began))
	}
	sb, err := r.boot(ctx, spec, tpl)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	sb.Timings = append(failed, sb.Timings...)
	return r.started(ctx, sb, spec)
}

// started runs the template's start command in a created sandbox
// (startTemplate) and destroys the sandbox if it does not come up. A
// clone of a warm snapshot came with its server running: nothing starts.
func (r *Runtime) started(ctx context.Context, sb *Sandbox, spec Spec) (*Sandbox, error) {
	if spec.NoStart || sb.Warm {
		return sb, nil
	}
	began := time.Now()
	err := r.startTemplate(ctx, sb, r.startTimeout())
	if tpl := sb.Template; tpl.StartCmd != "" || tpl.ReadyPort != 0 {
		sb.Timings.Add("start template's server", time.Since(began))
	}
	if err != nil {
		if derr := sb.Destroy(context.WithoutCancel(ctx)); derr != nil {
			r.log.Warn("destroying a sandbox whose start command failed", "sandbox", sb.ID, "err", derr)
		}
		return nil, fmt.Errorf("create sandbox: template %s: %w", sb.Template.Ref(), err)
	}
	return sb, nil
}

// boot creates the sandbox of a resolved spec by booting its VM.
func (r *Runtime) boot(ctx context.Context, spec Spec, tpl template.Template) (*Sandbox, error) {
	sb := newSandbox(spec.ID, r.cfg.Dir.Sandbox(spec.ID), spec, r.log)
	sb.Template = tpl
	overlay := filepath.Join(sb.Dir, diskName)
	cfg := vm.Config{
		Kernel: r.cfg.Dir.Kernel(), Initramfs: r.cfg.Dir.Initramfs(), Accel: r.accel, CPU: r.cpu,
		VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB, Disk: overlay, Backing: []string{tpl.Image}, Dir: sb.Dir, Detach: spec.Detach,
		NetMAC: gateway.GuestMAC, AuxPort: spec.AuxPort,
	}
	if r.accel == vm.AccelTCG {
		cfg.TSCKHz = vm.HostTSCKHz()
	}
	steps := []step{
		r.dirStep(sb),
		r.jailStep(sb, &cfg),
		r.cgroupStep(sb, &cfg),
		{"create disk", func(ctx context.Context) error {
			return createOverlay(ctx, tpl.Image, overlay, spec.DiskMiB)
		}, nil},
		recordStep(sb, &cfg, nil),
		{"boot vm", func(ctx context.Context) error {
			m, err := vm.Start(ctx, cfg, sb.log)
			if err != nil {
				return err
			}
			sb.vm = m
			return nil
		}, func() { sb.vm.Stop(context.Background()) }},
		r.gatewayStep(sb, &cfg),
		linkStep(sb),
		{"connect to agent", func(ctx context.Context) error {
			c, err := ConnectAgent(ctx, sb.vm, r.cfg.BootTimeout)
			sb.agent = c
			return err
		}, func() { sb.agent.Close() }},
		initStep(sb),
	}
	if err := runSteps(ctx, steps, &sb.Timings); err != nil {
		return nil, err
	}
	sb.Timings.Split("init guest", sb.Init.Timings)
	go sb.watch()
	return sb, nil
}

// diskName is a sandbox's disk in its directory.
const diskName = "disk.qcow2"

// dirStep creates the sandbox's directory and takes its owner lock.
func (r *Runtime) dirStep(sb *Sandbox) step {
	return step{"create sandbox directory", func(context.Context) error {
		if err := os.MkdirAll(r.cfg.Dir.Sandboxes(), 0o755); err != nil {
			return err
		}
		if err := os.Mkdir(sb.Dir, 0o700); err != nil {
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("sandbox %s already exists: %w", sb.ID, errdefs.ErrConflict)
			}
			return err
		}
		lock, err := lockOwner(sb.Dir)
		if err != nil {
			os.RemoveAll(sb.Dir) // this step's undo runs only once it succeeded
			return err
		}
		sb.owner = lock
		return nil
	}, func() { removeDir(sb.Dir); sb.owner.Close() }}
}

// recordStep records the sandbox's spec (its template by digest), the
// configuration its VM starts with and the disk layer its disk is an
// overlay of (layer, when not nil: see record.Layer), for Wake.
func recordStep(sb *Sandbox, cfg *vm.Config, layer *string) step {
	return step{"record vm config", func(context.Context) error {
		spec := sb.Spec
		if sb.Template.Digest != "" {
			spec.Template = sb.Template.Digest
		}
		rec := record{Spec: spec, VM: *cfg}
		if sb.cg != nil {
			res := sb.cg.Resources()
			rec.Limits = &res
		}
		if layer != nil {
			rec.Layer = *layer
		}
		return writeRecord(sb.Dir, rec)
	}, nil}
}

// initStep initialises the guest: the host's clock, fresh entropy, the
// sandbox's ID as hostname, its environment, and its root disk mounted and
// grown to the disk's size.
func initStep(sb *Sandbox) step {
	return step{"init guest", func(ctx context.Context) error {
		entropy := make([]byte, 64)
		rand.Read(entropy)
		res, err := sb.agent.Init(ctx, agentproto.InitRequest{
			Hostname: sb.ID, TimeUnixNano: time.Now().UnixNano(), Entropy: entropy,
			Env: sb.Spec.Env, RootDevice: "/dev/vda", Network: sb.guestNetwork(),
		})
		sb.Init = res
		for _, w := range res.Warnings {
			sb.log.Warn("the guest's init went on without something", "warning", w)
		}
		return sb.explain(err)
	}, nil}
}

// createOverlay makes a qcow2 disk of sizeMiB (0: the image's size)
// backed by the read-only template image: nothing is copied.
func createOverlay(ctx context.Context, base, path string, sizeMiB int) error {
	size := int64(sizeMiB) << 20
	if size == 0 {
		fi, err := os.Stat(base)
		if err != nil {
			return err
		}
		size = fi.Size()
	}
	return qemuImgCreate(ctx, base, "raw", path, size)
}

// qemuImgCreate makes a qcow2 disk at path of size bytes over backing, an
// image of format fmt, with mode 0600: a disk is for its VM's user alone
// (vm.Start gives it to that user). The size is given and -u set, so
// qemu-img does not open the backing image, whose header (a warm layer's)
// a VM may have written; the backing name and format are the server's.
func qemuImgCreate(ctx context.Context, backing, format, path string, size int64) error {
	bin, err := toolPath("qemu-img")
	if err != nil {
		return err
	}
	args := []string{"create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", format, path, strconv.FormatInt(size, 10)}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return os.Chmod(path, 0o600)
}

// ConnectAgent waits for the guest agent of m and opens a session with it,
// giving up when the VM exits or the boot timeout passes; the error then
// quotes the VM's console.
func ConnectAgent(ctx context.Context, m *vm.Machine, timeout time.Duration) (*agentclient.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", m.AgentSocket())
	if err != nil {
		return nil, bootError(m, err)
	}
	c, err := agentclient.Handshake(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, bootError(m, err)
	}
	return c, nil
}

// bootError explains a failed boot with what the VM printed.
func bootError(m *vm.Machine, err error) error {
	if m.Exited() {
		return fmt.Errorf("the VM exited while booting (%v): console:\n%s", m.ExitError(), m.ConsoleTail(2000))
	}
	return fmt.Errorf("the agent did not answer: %w; console:\n%s", err, m.ConsoleTail(2000))
}

// newSandbox returns the Sandbox value Create and Adopt fill in.
func newSandbox(id, dir string, spec Spec, log *slog.Logger) *Sandbox {
	return &Sandbox{ID: id, Dir: dir, Spec: spec, log: log.With("sandbox", id), released: make(chan struct{})}
}

// watch notices a VM that ends on its own and ends the agent session, so
// nothing waits on a link whose other end is gone. It returns then, or
// when the sandbox is released or suspended.
func (s *Sandbox) watch() {
	select {
	case <-s.vm.Done():
	case <-s.released:
		return
	}
	s.closeAgent()
	s.closeGateway()
	s.dropCgroup()
}

// closeAgent ends the session with the agent, if there is one.
func (s *Sandbox) closeAgent() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent != nil {
		s.agent.Close()
	}
}

// explain turns an error from the agent link into one that says why the
// VM went away, quoting the end of its console.
func (s *Sandbox) explain(err error) error {
	// A stream cut by the VM's end fails as disconnected, or as cancelled
	// when the context of the VM's lifetime it runs under ended first.
	if err == nil || !errors.Is(err, agentclient.ErrDisconnected) && !errors.Is(err, context.Canceled) {
		return err
	}
	select {
	case <-s.vm.Done():
	case <-time.After(3 * time.Second):
		return err
	}
	return s.Failure()
}

// Failure describes why the VM stopped, or nil while it runs.
func (s *Sandbox) Failure() error {
	if !s.vm.Exited() {
		return nil
	}
	what := "the sandbox VM exited unexpectedly"
	if s.vm.GuestPanicked() {
		what = "the sandbox's guest kernel panicked"
	}
	if e := s.vm.ExitError(); e != nil {
		what += " (" + e.Error() + ")"
	}
	return fmt.Errorf("%s: %w; console tail:\n%s", what, ErrVMExited, s.vm.ConsoleTail(3000))
}

// ErrVMExited marks operations that failed because the VM is gone.
var ErrVMExited = errors.New("vm exited")

// Agent is the session with the sandbox's agent. It is nil while a
// sandbox that Adopt found paused has not been resumed: the agent of a
// paused guest cannot answer, so the session is opened by Resume. While
// the sandbox is paused, requests on the session wait until it resumes
// (or their context ends).
func (s *Sandbox) Agent() *agentclient.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent
}

// session returns the agent session for a request, or a conflict while
// the sandbox is paused or suspended.
func (s *Sandbox) session() (*agentclient.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.suspended:
		return nil, fmt.Errorf("sandbox %s is suspended: wake it first: %w", s.ID, errdefs.ErrConflict)
	case s.paused:
		return nil, fmt.Errorf("sandbox %s is paused: resume it first: %w", s.ID, errdefs.ErrConflict)
	case s.agent == nil:
		return nil, fmt.Errorf("sandbox %s has no session with its agent: %w", s.ID, errdefs.ErrUnavailable)
	}
	return s.agent, nil
}

// Machine is the sandbox's VM.
func (s *Sandbox) Machine() *vm.Machine { return s.vm }

// Exec runs a process in the sandbox; errors caused by the VM going away
// are explained with its console. A paused or suspended sandbox is
// errdefs.ErrConflict.
func (s *Sandbox) Exec(ctx context.Context, req agentproto.ExecRequest, stdio agentclient.Stdio) (*agentclient.Process, error) {
	c, err := s.session()
	if err != nil {
		return nil, err
	}
	p, err := c.Exec(ctx, req, stdio)
	return p, s.explain(err)
}

// Attach joins process id, which an Exec started (perhaps over an earlier
// session, before the sandbox was released and adopted), and streams its
// output from offset on to stdio; see agentclient.Client.Attach. Errors
// caused by the VM going away are explained with its console.
func (s *Sandbox) Attach(ctx context.Context, id string, offset int64, stdio agentclient.Stdio) (*agentclient.Process, error) {
	c, err := s.session()
	if err != nil {
		return nil, err
	}
	p, err := c.Attach(ctx, id, offset, stdio)
	return p, s.explain(err)
}

// Wait waits for p and explains a lost VM.
func (s *Sandbox) Wait(p *agentclient.Process) (agentproto.Exit, error) {
	exit, err := p.Wait()
	return exit, s.explain(err)
}

// Reconnect replaces the session with the agent by a new one, as a host
// process that lost its connection (or restarted) does. Processes in the
// sandbox keep running; streams of the old session end.
func (s *Sandbox) Reconnect(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if _, err := s.session(); errors.Is(err, errdefs.ErrConflict) {
		return err
	}
	s.closeAgent()
	c, err := ConnectAgent(ctx, s.vm, 30*time.Second)
	if err != nil {
		return fmt.Errorf("reconnect to sandbox %s: %w", s.ID, err)
	}
	s.mu.Lock()
	s.agent = c
	s.mu.Unlock()
	return nil
}

// Release lets go of the sandbox without stopping it: the session with the
// agent and the VM's QMP connection are closed, the owner lock is dropped,
// and the VM (started with Spec.Detach) keeps running for a later
// Runtime.Adopt. The Sandbox must not be used afterwards.
func (s *Sandbox) Release() {
	s.releaseOnce.Do(func() {
		close(s.released)
		s.closeAgent()
		s.closeGateway()
		s.vm.Release()
		s.owner.Close()
	})
}

// Destroy stops the VM and removes everything the sandbox had on the host.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.closeAgent()
	s.closeGateway()
	s.vm.Stop(ctx)
	s.dropCgroup()
	err := removeDir(s.Dir)
	s.owner.Close()
	if err != nil {
		return fmt.Errorf("remove sandbox %s: %w", s.ID, err)
	}
	return nil
}
