package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/vm"
)

// Files in a template snapshot's directory.
const (
	// snapshotMemName is the guest's RAM: the template VM's memory file.
	snapshotMemName = "mem"
	// snapshotStateName is the template VM's device state, saved with
	// x-ignore-shared: the RAM is in snapshotMemName, not here.
	snapshotStateName = "state.mig"
	// snapshotRecordName records how the snapshot was made (JSON).
	snapshotRecordName = "snapshot.json"
	// snapshotBrokenName marks a snapshot that a clone could not be
	// restored from; it says why. The next use makes the snapshot again.
	snapshotBrokenName = "broken"
	// snapshotDiskName is the template VM's throwaway disk, removed once
	// its state is saved. A warm snapshot keeps its disk instead, under a
	// name of each making (layerName).
	snapshotDiskName = "disk.qcow2"
)

// Names in the snapshots directory beside the snapshots themselves: the
// lock of each snapshot (<name>.lock), and the directory a snapshot is made
// in (.build-<short>-<random>) or an old one is moved to on its way out
// (.old-<short>-<random>). What a build left when its process died is
// removed by the next build of the same snapshot, under its lock, or by
// Sweep once nobody holds that lock.
const (
	snapshotLockSuffix  = ".lock"
	snapshotBuildPrefix = ".build-"
	snapshotOldPrefix   = ".old-"
)

// snapshotLockPoll is how often a snapshot's lock is tried while another
// holds it.
const snapshotLockPoll = 20 * time.Millisecond

// snapshotAttempts bounds how often one use of a snapshot makes it before
// giving up: another process may break it again between its making and
// its use.
const snapshotAttempts = 2

// snapshotRetryAfter is how long a runtime that failed to make a snapshot
// waits before it tries again: a try costs a boot.
const snapshotRetryAfter = time.Minute

// failedBuild is a failure to make a snapshot.
type failedBuild struct {
	at  time.Time
	err error
}

// TemplateSnapshot is a template's VM saved at the point where its agent
// waits for init, before the guest has touched its disk; or, warm, once
// the guest was initialised like a sandbox and the template's start
// command is up (see warm.go). A sandbox is created as a clone of it
// (Runtime.Create) rather than booted: a QEMU with the same command line
// but the sandbox's own directory and disk, its RAM mapped private from
// MemFile and its devices restored from StateFile. A snapshot fixes the
// vCPU count and memory size: there is one per template, vCPU count and
// memory size that was asked for (and, warm, per start settings), in the
// data directory's snapshots/<digest hex>-<vcpus>c-<memory>m[-w<start>]/,
// made on first use and then kept.
type TemplateSnapshot struct {
	// Dir is the snapshot's directory.
	Dir string
	// MemFile is the guest's RAM. The template VM mapped it shared, so its
	// RAM is in the file; each clone maps it private (copy on write), so
	// pages no clone writes are shared between all of them. Running
	// clones map it, and a suspended clone's wake maps it again by name,
	// so it must outlive every sandbox cloned from it.
	MemFile string
	// StateFile is the template VM's device state, saved without RAM
	// (x-ignore-shared); a few tens of KB.
	StateFile string
	// VM is the configuration the template VM ran with (MemoryFile being
	// MemFile, Dir being the snapshot's directory). A clone starts QEMU
	// with it but its own Dir and Disk (Disk is empty here: a cold
	// snapshot's disk is gone, a warm one's is Disk below), MemoryShared
	// off and Incoming on.
	VM vm.Config
	// Warm is true for a snapshot taken with the template's start command
	// up; Disk is then its disk layer, the qcow2 image the template VM
	// wrote, which every clone's disk is an overlay of and which is never
	// written again. DiskMiB is its size, the least a clone's disk can be.
	// A cold snapshot has neither: a clone's disk is an overlay of the
	// template image.
	Warm    bool
	Disk    string
	DiskMiB int
	// Backing is the chain under Disk, nearest first; nil means the
	// template image alone, as for a warm snapshot. A checkpoint's
	// (checkpointSnapshot) is the checkpointed sandbox's chain.
	Backing []string
}

// chain is the backing chain of a clone's disk of the snapshot, whose
// template image is image.
func (s TemplateSnapshot) chain(image string) []string {
	if s.Disk == "" {
		return []string{image}
	}
	if s.Backing != nil {
		return append([]string{s.Disk}, s.Backing...)
	}
	return []string{s.Disk, image}
}

// snapshotRecord is what snapshotRecordName holds.
type snapshotRecord struct {
	// Template is the template's digest; VCPUs and MemoryMiB the VM's.
	Template  string `json:"template"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memory_mib"`
	// Origin identifies the boot artifacts and QEMU binary the snapshot
	// was made with (snapshotOrigin); a snapshot of others is made again.
	Origin string `json:"origin"`
	// VM is TemplateSnapshot.VM.
	VM vm.Config `json:"vm"`
	// StateBytes is the size of the state file.
	StateBytes int64 `json:"state_bytes"`
	// ID tells this making of the snapshot from others.
	ID      string    `json:"id"`
	BuiltAt time.Time `json:"built_at"`
	// BuildMillis is how long the making took, in milliseconds.
	BuildMillis int64 `json:"build_ms"`
	// Warm records a warm snapshot: Start is the warmStartID of the
	// template it was made with (the key's), Disk the file name of its
	// disk layer in the directory and DiskMiB that layer's size.
	Warm    bool   `json:"warm,omitempty"`
	Start   string `json:"start,omitempty"`
	Disk    string `json:"disk,omitempty"`
	DiskMiB int    `json:"disk_mib,omitempty"`
}

// snapshotKey names a template snapshot.
type snapshotKey struct {
	digest    string // "sha256:<hex>"
	vcpus     int
	memoryMiB int
	// warm is the warmStartID of a warm snapshot's template, "" for a
	// cold snapshot: a template's start settings can change without its
	// image, and a warm snapshot holds what its start command did.
	warm string
}

// newSnapshotKey names the snapshot a sandbox of the resolved spec is
// cloned from: warm when startsWarm says so.
func newSnapshotKey(tpl template.Template, spec Spec) (snapshotKey, error) {
	hexDigest, ok := strings.CutPrefix(tpl.Digest, "sha256:")
	if !ok || len(hexDigest) != 64 {
		return snapshotKey{}, fmt.Errorf("template %s has no digest to name its snapshot by: %w", tpl.Ref(), errdefs.ErrPrecondition)
	}
	k := snapshotKey{digest: tpl.Digest, vcpus: spec.VCPUs, memoryMiB: spec.MemoryMiB}
	if startsWarm(spec, tpl) {
		k.warm = warmStartID(tpl)
	}
	return k, nil
}

// name is the snapshot's directory name: the digest's 64 hex digits and
// then tail.
func (k snapshotKey) name() string {
	return strings.TrimPrefix(k.digest, "sha256:") + k.tail()
}

// short names the snapshot in its build directories, which hold the
// template VM's sockets and so need a short path: the first 16 hex
// digits of the digest and then tail.
func (k snapshotKey) short() string {
	return strings.TrimPrefix(k.digest, "sha256:")[:16] + k.tail()
}

// tail is what follows the digest in the snapshot's names.
func (k snapshotKey) tail() string {
	t := fmt.Sprintf("-%dc-%dm", k.vcpus, k.memoryMiB)
	if k.warm != "" {
		t += "-w" + k.warm
	}
	return t
}

// snapshotsRoot is the snapshots directory as an absolute path: a VM's
// memory file is named by one.
func (r *Runtime) snapshotsRoot() string {
	if p, err := filepath.Abs(r.cfg.Dir.Snapshots()); err == nil {
		return p
	}
	return r.cfg.Dir.Snapshots()
}

// snapshotDir is the directory of the snapshot named by k.
func (r *Runtime) snapshotDir(k snapshotKey) string {
	return filepath.Join(r.snapshotsRoot(), k.name())
}

func (r *Runtime) snapshotLock(k snapshotKey) string {
	return filepath.Join(r.snapshotsRoot(), k.name()+snapshotLockSuffix)
}

// TemplateSnapshot returns the template snapshot for spec, whose template,
// vCPU count and memory size are resolved as Create resolves them: the
// warm one when a sandbox of spec would start warm (startsWarm). It is
// made first when there is none, or the one there is incomplete, marked
// broken, or made with other boot artifacts, QEMU or accelerator; that
// takes one boot of the template. Concurrent calls, in this process or
// others, make it once: the others wait for it.
func (r *Runtime) TemplateSnapshot(ctx context.Context, spec Spec) (TemplateSnapshot, error) {
	spec, tpl, err := r.Resolve(spec)
	if err != nil {
		return TemplateSnapshot{}, err
	}
	h, err := r.acquireSnapshot(ctx, tpl, spec)
	if err != nil {
		return TemplateSnapshot{}, err
	}
	h.release()
	return h.snap, nil
}

// PrepareSnapshots makes the template snapshots of specs that are missing
// or unusable, one after the other, so that the first sandboxes of those
// specs start as clones.
func (r *Runtime) PrepareSnapshots(ctx context.Context, specs ...Spec) error {
	var errs []error
	for _, spec := range specs {
		if _, err := r.TemplateSnapshot(ctx, spec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// heldSnapshot is a usable snapshot that cannot be replaced until release
// is called: a clone holds it from before its QEMU maps the memory file
// until its state is restored, so that file and state are of one making.
type heldSnapshot struct {
	snap    TemplateSnapshot
	key     snapshotKey
	id      string // snapshotRecord.ID
	release func()
}

// acquireSnapshot returns the snapshot for tpl and spec's vCPUs and memory,
// made first if needed, held under a shared lock.
func (r *Runtime) acquireSnapshot(ctx context.Context, tpl template.Template, spec Spec) (heldSnapshot, error) {
	key, err := newSnapshotKey(tpl, spec)
	if err != nil {
		return heldSnapshot{}, err
	}
	origin, err := r.snapshotOrigin()
	if err != nil {
		return heldSnapshot{}, fmt.Errorf("template snapshot %s: %w", key.name(), err)
	}
	if err := os.MkdirAll(r.snapshotsRoot(), 0o755); err != nil {
		return heldSnapshot{}, err
	}
	for attempt := 0; ; attempt++ {
		lock, err := lockFile(ctx, r.snapshotLock(key), unix.LOCK_SH)
		if err != nil {
			return heldSnapshot{}, fmt.Errorf("template snapshot %s: %w", key.name(), err)
		}
		snap, rec, err := r.loadSnapshot(key, origin)
		if err == nil {
			return heldSnapshot{snap: snap, key: key, id: rec.ID, release: func() { lock.Close() }}, nil
		}
		lock.Close()
		if attempt == snapshotAttempts {
			return heldSnapshot{}, fmt.Errorf("template snapshot %s is unusable after it was made: %w", key.name(), err)
		}
		if err := r.recentBuildFailure(key); err != nil {
			return heldSnapshot{}, err
		}
		if err := r.makeSnapshot(ctx, key, tpl, origin); err != nil {
			if ctx.Err() == nil {
				r.buildFailed(key, err)
			}
			return heldSnapshot{}, fmt.Errorf("make template snapshot %s: %w", key.name(), err)
		}
	}
}

// buildFailed records that the snapshot of key could not be made, or
// that a clone found it unusable after it was made, so that it is not
// made again for snapshotRetryAfter.
func (r *Runtime) buildFailed(key snapshotKey, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failedBuilds == nil {
		r.failedBuilds = make(map[snapshotKey]failedBuild)
	}
	r.failedBuilds[key] = failedBuild{time.Now(), err}
}

// recentBuildFailure returns the failure to make the snapshot of key if it
// is more recent than snapshotRetryAfter.
func (r *Runtime) recentBuildFailure(key snapshotKey) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.failedBuilds[key]
	if !ok {
		return nil
	}
	if ago := time.Since(f.at); ago < snapshotRetryAfter {
		return fmt.Errorf("making template snapshot %s failed %s ago, and is tried again after %s: %w", key.name(), ago.Round(time.Second), snapshotRetryAfter, f.err)
	}
	delete(r.failedBuilds, key)
	return nil
}

// snapshotOrigin identifies what a snapshot is made with and restored by:
// the guest kernel and initramfs, whose code is in its RAM, and the QEMU
// binary, whose device state format the state file is in. Each is named
// by its size and modification time, which every replacement changes.
func (r *Runtime) snapshotOrigin() (string, error) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", fmt.Errorf("qemu-system-x86_64 is not installed: run `airlock setup` as root: %w", errdefs.ErrPrecondition)
	}
	var parts []string
	for _, f := range []string{r.cfg.Dir.Kernel(), r.cfg.Dir.Initramfs(), qemu} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		parts = append(parts, fmt.Sprintf("%s:%d:%d", filepath.Base(f), fi.Size(), fi.ModTime().UnixNano()))
	}
	return strings.Join(parts, " "), nil
}

// loadSnapshot returns the snapshot named by key if it is usable: whole,
// not marked broken, and made with origin and this runtime's accelerator.
// Otherwise the error says why not.
func (r *Runtime) loadSnapshot(key snapshotKey, origin string) (TemplateSnapshot, snapshotRecord, error) {
	dir := r.snapshotDir(key)
	rec, err := readSnapshotRecord(dir)
	if err != nil {
		return TemplateSnapshot{}, rec, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, snapshotBrokenName)); err == nil {
		return TemplateSnapshot{}, rec, fmt.Errorf("it is marked broken: %s", strings.TrimSpace(string(b)))
	}
	switch {
	case rec.Template != key.digest || rec.VCPUs != key.vcpus || rec.MemoryMiB != key.memoryMiB:
		return TemplateSnapshot{}, rec, fmt.Errorf("its record is of %s with %d vcpus and %d MiB", rec.Template, rec.VCPUs, rec.MemoryMiB)
	case rec.Warm != (key.warm != "") || rec.Start != key.warm:
		return TemplateSnapshot{}, rec, fmt.Errorf("its record is of a snapshot warm %v (start %q), not %q", rec.Warm, rec.Start, key.warm)
	case rec.Origin != origin:
		return TemplateSnapshot{}, rec, errors.New("the boot artifacts or QEMU changed since it was made")
	case rec.VM.NetMAC != gateway.GuestMAC:
		return TemplateSnapshot{}, rec, errors.New("it was made without the network device sandboxes have")
	case rec.VM.Accel != r.accel || rec.VM.CPU != r.cpu:
		return TemplateSnapshot{}, rec, fmt.Errorf("it was made for accelerator %s (cpu %q)", rec.VM.Accel, rec.VM.CPU)
	}
	snap := TemplateSnapshot{
		Dir:       dir,
		MemFile:   filepath.Join(dir, snapshotMemName),
		StateFile: filepath.Join(dir, snapshotStateName),
		VM:        rec.VM,
		Warm:      rec.Warm,
	}
	if rec.Warm {
		if !isLayerName(rec.Disk) || rec.DiskMiB <= 0 {
			return TemplateSnapshot{}, rec, fmt.Errorf("its record names disk layer %q of %d MiB", rec.Disk, rec.DiskMiB)
		}
		snap.Disk, snap.DiskMiB = filepath.Join(dir, rec.Disk), rec.DiskMiB
		if fi, err := os.Stat(snap.Disk); err != nil || !fi.Mode().IsRegular() {
			return TemplateSnapshot{}, rec, fmt.Errorf("its disk layer %s is missing", rec.Disk)
		}
	}
	if fi, err := os.Stat(snap.MemFile); err != nil || fi.Size() != int64(key.memoryMiB)<<20 {
		return TemplateSnapshot{}, rec, fmt.Errorf("its memory file is missing or not %d MiB", key.memoryMiB)
	}
	// The record names the memory file by the path of the runtime that made
	// it; another runtime may reach the same directory by another path (a
	// data directory that links the snapshots of another).
	if !sameFile(snap.VM.MemoryFile, snap.MemFile) {
		return TemplateSnapshot{}, rec, fmt.Errorf("its record names memory file %s", snap.VM.MemoryFile)
	}
	snap.VM.MemoryFile = snap.MemFile
	if fi, err := os.Stat(snap.StateFile); err != nil || fi.Size() != rec.StateBytes || fi.Size() == 0 {
		return TemplateSnapshot{}, rec, fmt.Errorf("its state file is missing or not the %d bytes recorded", rec.StateBytes)
	}
	return snap, rec, nil
}

func readSnapshotRecord(dir string) (snapshotRecord, error) {
	var rec snapshotRecord
	b, err := os.ReadFile(filepath.Join(dir, snapshotRecordName))
	if errors.Is(err, os.ErrNotExist) {
		return rec, errors.New("there is none")
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read %s: %w", snapshotRecordName, err)
	}
	return rec, nil
}

// makeSnapshot makes the snapshot named by key under its exclusive lock,
// unless another maker did while this one waited for the lock.
func (r *Runtime) makeSnapshot(ctx context.Context, key snapshotKey, tpl template.Template, origin string) error {
	lock, err := lockFile(ctx, r.snapshotLock(key), unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer lock.Close()
	_, _, why := r.loadSnapshot(key, origin)
	if why == nil {
		return nil
	}
	log := r.log.With("snapshot", key.name())
	log.Info("making template snapshot", "template", tpl.Ref(), "why", why)
	r.clearSnapshotLeftovers(key)
	start := time.Now()
	rec, err := r.buildSnapshot(ctx, key, tpl, origin)
	if err != nil {
		return err
	}
	r.built.Add(1)
	log.Info("template snapshot made", "took", time.Since(start).Round(time.Millisecond), "state_bytes", rec.StateBytes)
	return nil
}

// clearSnapshotLeftovers removes what interrupted builds and replacements
// of the snapshot named by key left in the snapshots directory. The caller
// holds the snapshot's exclusive lock, so none of them is in use.
func (r *Runtime) clearSnapshotLeftovers(key snapshotKey) {
	clearSnapshotLeftovers(r.cfg.Dir, key.short(), r.log)
}

func clearSnapshotLeftovers(dir datadir.Dir, short string, log *slog.Logger) {
	for _, prefix := range []string{snapshotBuildPrefix, snapshotOldPrefix} {
		// The random part is digits (os.MkdirTemp's); the warm snapshot
		// of the same template, vCPUs and memory goes on with "-w".
		dirs, _ := filepath.Glob(filepath.Join(dir.Snapshots(), prefix+short+"-[0-9]*"))
		for _, d := range dirs {
			if err := os.RemoveAll(d); err != nil {
				log.Warn("remove the leftovers of a template snapshot", "dir", d, "err", err)
			} else {
				log.Info("removed the leftovers of a template snapshot", "dir", filepath.Base(d))
			}
		}
	}
}

// sweepSnapshots removes what builds and replacements of template
// snapshots left behind when their process died, for every snapshot whose
// lock nobody holds. Snapshots themselves stay.
func sweepSnapshots(dir datadir.Dir, log *slog.Logger) {
	locks, _ := filepath.Glob(filepath.Join(dir.Snapshots(), "*"+snapshotLockSuffix))
	for _, p := range locks {
		name := strings.TrimSuffix(filepath.Base(p), snapshotLockSuffix)
		if len(name) <= 64 { // <64 hex digits>-<vcpus>c-<memory>m
			continue
		}
		lock, err := tryLock(p, unix.LOCK_EX)
		if err != nil {
			continue // in use
		}
		clearSnapshotLeftovers(dir, name[:16]+name[64:], log)
		lock.Close()
	}
}

// buildSnapshot boots the template once with its RAM in a file, with the
// devices a sandbox has, waits until its agent answers (and so waits for
// init), saves its state without RAM, stops it, and moves the snapshot
// into place. For a warm snapshot the guest is first initialised like a
// sandbox and the template's start command started and found ready
// (warmSteps), and the disk the template VM wrote is kept. All of it
// happens in a build directory, renamed into place last, so the
// snapshot's directory is whole or absent.
func (r *Runtime) buildSnapshot(ctx context.Context, key snapshotKey, tpl template.Template, origin string) (snapshotRecord, error) {
	start := time.Now()
	root := r.snapshotsRoot()
	final := r.snapshotDir(key)
	log := r.log.With("snapshot", key.name())
	idb := make([]byte, 8)
	rand.Read(idb)
	id := hex.EncodeToString(idb)
	warm := key.warm != ""
	diskMiB := 0 // the template image's size
	if warm {
		diskMiB = warmDiskMiB(tpl)
	}
	var build string
	var cfg vm.Config
	var m *vm.Machine
	var agent *agentclient.Client
	// The template VM as a sandbox, for a warm snapshot's gateway, init
	// and start command.
	tvm := newSandbox(warmHostname, "", Spec{}, log)
	tvm.Template = tpl
	var rec snapshotRecord
	steps := []step{
		{"create build directory", func(context.Context) error {
			d, err := os.MkdirTemp(root, snapshotBuildPrefix+key.short()+"-")
			if err != nil {
				return err
			}
			build, tvm.Dir = d, d
			disk := snapshotDiskName
			if warm {
				disk = layerName(id)
			}
			cfg = vm.Config{
				Kernel: r.cfg.Dir.Kernel(), Initramfs: r.cfg.Dir.Initramfs(), Accel: r.accel, CPU: r.cpu,
				VCPUs: key.vcpus, MemoryMiB: key.memoryMiB, Dir: build,
				// A cold snapshot's guest does not touch its disk
				// before init; the device must be there all the same,
				// as in a sandbox.
				Disk:       filepath.Join(build, disk),
				Backing:    []string{tpl.Image},
				MemoryFile: filepath.Join(build, snapshotMemName), MemoryShared: true,
				// The network device too: a clone's gateway connects
				// to it, and the guest configures it at init.
				NetMAC: gateway.GuestMAC,
			}
			if r.accel == vm.AccelTCG {
				cfg.TSCKHz = vm.HostTSCKHz()
			}
			cfg.Jail, err = r.jail(build, nil)
			return err
		}, func() { removeDir(build) }},
		{"create disk", func(ctx context.Context) error {
			// A cold snapshot's at the template's own size, the smallest
			// a sandbox's disk is: a clone grows its disk, and the guest
			// learns of it. A warm one's at warmDiskMiB.
			return createOverlay(ctx, tpl.Image, cfg.Disk, diskMiB)
		}, nil},
		{"boot template vm", func(ctx context.Context) error {
			cg, err := r.vmCgroup(&cfg)
			if err != nil {
				return err
			}
			tvm.cg = cg
			m, err = vm.Start(ctx, cfg, log)
			tvm.vm = m
			if err != nil {
				tvm.dropCgroup()
			}
			return err
		}, func() { m.Stop(context.Background()); tvm.dropCgroup() }},
	}
	if warm {
		steps = append(steps, step{"start gateway", func(ctx context.Context) error {
			// Spec.Network is nil: egress is denied.
			if err := r.startGateway(ctx, tvm, cfg.NetMAC); err != nil {
				return err
			}
			return tvm.linkUp(ctx)
		}, func() { tvm.closeGateway() }})
	}
	steps = append(steps, step{"connect to agent", func(ctx context.Context) error {
		var err error
		if agent, err = ConnectAgent(ctx, m, r.cfg.BootTimeout); err != nil {
			return err
		}
		pong, err := agent.Ping(ctx)
		if err == nil && pong.Initialized {
			err = errors.New("the agent says it is initialised")
		}
		if err != nil {
			agent.Close()
			return err
		}
		tvm.mu.Lock()
		tvm.agent = agent
		tvm.mu.Unlock()
		return nil
	}, func() { agent.Close() }})
	if warm {
		steps = append(steps, r.warmSteps(tvm)...)
	}
	steps = append(steps,
		step{"save state", func(ctx context.Context) error {
			return m.SaveState(ctx, filepath.Join(build, snapshotStateName), true)
		}, nil},
		step{"stop template vm", func(ctx context.Context) error {
			agent.Close()
			tvm.closeGateway()
			m.Stop(ctx)
			tvm.dropCgroup()
			// What the template VM wrote goes back to root: its user
			// is handed to another VM next.
			if cfg.Jail != nil {
				for _, f := range []string{cfg.MemoryFile, cfg.Disk} {
					if err := os.Chown(f, 0, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
						return err
					}
				}
				vm.ReleaseUID(build)
			}
			// The guest's RAM reached the file through the shared
			// mapping; make it durable before the snapshot is in place.
			return syncFile(cfg.MemoryFile)
		}, nil},
	)
	if warm {
		steps = append(steps, step{"keep disk layer", func(context.Context) error {
			// The placeholder's gateway CA and egress log are of no use
			// to anyone, and its key must not outlive it.
			for _, p := range []string{gatewayDirName, EgressLogName} {
				if err := os.RemoveAll(filepath.Join(build, p)); err != nil {
					return err
				}
			}
			// The layer under every clone's disk: never written again.
			if err := os.Chmod(cfg.Disk, 0o444); err != nil {
				return err
			}
			return syncFile(cfg.Disk)
		}, nil})
	} else {
		steps = append(steps, step{"remove throwaway disk", func(context.Context) error {
			return os.Remove(cfg.Disk)
		}, nil})
	}
	steps = append(steps,
		step{"record snapshot", func(context.Context) error {
			fi, err := os.Stat(filepath.Join(build, snapshotStateName))
			if err != nil {
				return err
			}
			vmc := cfg
			vmc.Dir, vmc.Disk, vmc.MemoryFile = final, "", filepath.Join(final, snapshotMemName)
			vmc.Jail = nil // each clone has its own
			rec = snapshotRecord{
				Template: key.digest, VCPUs: key.vcpus, MemoryMiB: key.memoryMiB, Origin: origin,
				VM: vmc, StateBytes: fi.Size(), ID: id,
				BuiltAt: time.Now().UTC(), BuildMillis: time.Since(start).Milliseconds(),
			}
			if warm {
				rec.Warm, rec.Start, rec.Disk, rec.DiskMiB = true, key.warm, filepath.Base(cfg.Disk), diskMiB
			}
			b, err := json.MarshalIndent(rec, "", "  ")
			if err != nil {
				return err
			}
			return atomicfile.WriteBytes(filepath.Join(build, snapshotRecordName), append(b, '\n'), 0o644)
		}, nil},
		step{"move snapshot into place", func(context.Context) error {
			return r.replaceSnapshot(key, build, final)
		}, nil},
	)
	if err := runSteps(ctx, steps, nil); err != nil {
		return rec, err
	}
	return rec, nil
}

// replaceSnapshot moves the directory build to final, where an old
// snapshot may be. The two are exchanged in one step where the filesystem
// can, so that final always holds a memory file: a suspended clone's wake
// maps it by name (and, restoring all of its RAM from its own state, needs
// only a file of the right size there). The old snapshot is then removed.
// Running clones of it are unharmed: they map its memory file, which the
// kernel keeps while it is mapped; and a clone being restored holds the
// snapshot's shared lock, which the caller's exclusive one excludes. The
// disk layers of the old warm snapshot that sandboxes still stand on go
// into the new one first (carryLayers).
func (r *Runtime) replaceSnapshot(key snapshotKey, build, final string) error {
	if err := r.carryLayers(final, build); err != nil {
		return err
	}
	err := unix.Renameat2(unix.AT_FDCWD, build, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		// The old snapshot is now at build.
		if err := os.RemoveAll(build); err != nil {
			r.log.Warn("remove the replaced template snapshot", "dir", build, "err", err)
		}
	case errors.Is(err, unix.ENOENT):
		if err := os.Rename(build, final); err != nil {
			return err
		}
	default:
		// A filesystem that cannot exchange: move the old one aside first.
		old, err := os.MkdirTemp(r.snapshotsRoot(), snapshotOldPrefix+key.short()+"-")
		if err != nil {
			return err
		}
		if err := os.Rename(final, filepath.Join(old, "snapshot")); err != nil && !errors.Is(err, os.ErrNotExist) {
			os.Remove(old)
			return err
		}
		if err := os.Rename(build, final); err != nil {
			return err
		}
		if err := os.RemoveAll(old); err != nil {
			r.log.Warn("remove the replaced template snapshot", "dir", old, "err", err)
		}
	}
	syncFile(r.snapshotsRoot()) // the renames reach the disk; best effort, as the new snapshot is in place
	return nil
}

// breakSnapshot marks the snapshot of h broken, so that its next use makes
// it again, unless it has been made again since h was taken.
func (r *Runtime) breakSnapshot(h heldSnapshot, why error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := r.log.With("snapshot", h.key.name())
	lock, err := lockFile(ctx, r.snapshotLock(h.key), unix.LOCK_EX)
	if err != nil {
		log.Warn("mark the template snapshot broken", "err", err)
		return
	}
	defer lock.Close()
	if rec, err := readSnapshotRecord(h.snap.Dir); err != nil || rec.ID != h.id {
		return
	}
	msg := strings.Join(strings.Fields(why.Error()), " ")
	if err := atomicfile.WriteBytes(filepath.Join(h.snap.Dir, snapshotBrokenName), []byte(msg+"\n"), 0o644); err != nil {
		log.Warn("mark the template snapshot broken", "err", err)
		return
	}
	log.Warn("template snapshot marked broken: its next use makes it again", "why", msg)
}

// lockFile takes a flock of kind how (unix.LOCK_SH or unix.LOCK_EX) on path,
// which is created if missing, waiting for it until ctx ends. Closing the
// returned file releases the lock.
func lockFile(ctx context.Context, path string, how int) (*os.File, error) {
	for {
		f, err := tryLock(path, how)
		if !errors.Is(err, errLocked) {
			return f, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(snapshotLockPoll):
		}
	}
}

// errLocked is tryLock's error for a lock that another holds.
var errLocked = errors.New("locked by another")

// tryLock is lockFile without the wait: a lock that another holds is
// errLocked.
func tryLock(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	err = unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
	if err == nil {
		return f, nil
	}
	f.Close()
	if errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
		return nil, fmt.Errorf("lock %s: %w", path, errLocked)
	}
	return nil, fmt.Errorf("lock %s: %w", path, err)
}

// syncFile flushes the file or directory at path to disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// sameFile reports whether paths a and b name the same existing file.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}
