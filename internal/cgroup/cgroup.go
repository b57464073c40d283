// Package cgroup puts each sandbox's VMM (its QEMU process) into a cgroup
// of its own, with limits on CPU time, memory, processes and I/O weight,
// on a cgroup v2 (unified) host and on a cgroup v1 (legacy or hybrid)
// host alike. The cgroup filesystem is driven through
// github.com/containerd/cgroups/v3; docs/hardening.md ("Cgroups")
// describes the layout and how each limit is chosen.
//
// A Hierarchy is opened once for a parent path, such as "airlock/3f2a9c",
// relative to the root of each cgroup hierarchy (/sys/fs/cgroup on v2,
// /sys/fs/cgroup/<controller> on v1). Its groups, one per sandbox, are
// named by the sandbox's ID and live directly under the parent.
package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Resources are the limits of one sandbox's VMM.
type Resources struct {
	// CPUQuotaUS is the CPU time in microseconds the group may use per
	// CPUPeriodUS, across all CPUs (2 × the period is two CPUs); 0 means
	// unlimited. At least 1000 when set.
	CPUQuotaUS int64
	// CPUPeriodUS is the period of CPUQuotaUS in microseconds, 1000 to
	// 1000000; 0 means the kernel's default, 100000.
	CPUPeriodUS int64
	// MemoryBytes is the hard limit on the group's memory: anonymous
	// memory, page cache and kernel memory charged to it, and swap where
	// the kernel accounts it (v2 gives a limited group no swap; v1 bounds
	// memory and swap together). Past it the kernel reclaims what it can,
	// then its OOM killer acts within the group. 0 means unlimited.
	MemoryBytes int64
	// Pids is the most processes and threads the group may have; 0 means
	// unlimited.
	Pids int64
	// IOWeight is the group's share of block I/O against its siblings, on
	// cgroup v2's io.weight scale: 1 to 10000, default 100. 0 leaves the
	// default. Where the host has no weight knob the group is made without
	// one and Group.Resources reports 0.
	IOWeight uint16
}

// Default values of the kernel's knobs.
const (
	// DefaultCPUPeriodUS is the kernel's default CFS bandwidth period.
	DefaultCPUPeriodUS = 100000
	// DefaultIOWeight is the default weight of cgroup v2's io.weight, and
	// of io.bfq.weight and v1's blkio.bfq.weight.
	DefaultIOWeight = 100
)

// What ForVM adds to a VM's own vCPUs and memory. The memory was
// measured with QEMU 7.2 (Debian 12) under TCG, microvm with airlock's
// devices, on a 24 GiB host, as resident memory outside guest RAM
// (docs/hardening.md, "Cgroups", has the table):
//
//   - Idle: 36 MiB for a bare QEMU, 63 MiB for a 1-vCPU clone and
//     134 MiB for a cold-booted one (22 and 42 MiB of it TCG's
//     translation cache).
//   - Busy (builds, Python, hashing files, the guest's page cache dropped
//     so that code keeps landing at new addresses), 1 vCPU and 512 MiB:
//     319 MiB after about 11 minutes, 1205 MiB after 20 and steady from
//     then on, 1022 MiB of it the translation cache, full; 2 vCPUs and
//     1 GiB: 704 MiB after 8 minutes, 564 MiB of it the cache. QEMU 7.2
//     gives the cache an eighth of host RAM, at most 1 GiB, whatever the
//     guest's size; a full cache is flushed and reused, its pages staying
//     resident. Beside the full cache, 183 MiB, mostly its bookkeeping
//     (the hash of translated blocks, per-page descriptors, the vCPUs'
//     software TLBs).
//
// So a TCG VM with QEMU's default cache was seen to use guest + 1205 MiB.
// airlock caps the cache at TCGCacheMiB, and a TCG VM gets guest + 768.
const (
	// vmmOverheadMiB covers QEMU apart from TCG: over twice the most seen
	// outside the cache and its bookkeeping, and page cache of the disk
	// image (charged to the group, reclaimed before anything is killed).
	vmmOverheadMiB = 256
	// TCGCacheMiB is the size of the TCG translation cache airlock gives
	// QEMU (-accel tcg,tb-size, internal/vm), a quarter of QEMU 7.2's
	// default of up to 1 GiB (DEFAULT_CODE_GEN_BUFFER_SIZE), which a busy
	// guest was seen to fill.
	TCGCacheMiB = 256
	// tcgBookkeepingMiB covers what grows with the cache: 183 MiB with
	// QEMU's own at its fullest.
	tcgBookkeepingMiB = 256
	// ioThreadCPUPercent is the share of one CPU the quota grants beyond
	// the vCPUs: QEMU's main loop and I/O threads (virtio queues, the
	// qcow2 disk, the console and sockets) run beside the vCPU threads and
	// must not starve a guest whose vCPUs use their whole share.
	ioThreadCPUPercent = 25
	// maxPids bounds QEMU's threads: one per vCPU, the main loop, the RCU
	// thread, and a worker pool of up to 64 for block I/O. It is never
	// reached by a working QEMU and stops a compromised one from forking
	// without end.
	maxPids = 256
)

// ForVM returns the resources of a VM with vcpus virtual CPUs and
// memoryMiB of guest RAM, under TCG when tcg is true and under KVM
// otherwise: a CPU quota of vcpus CPUs plus a quarter of one for QEMU's
// own threads; guest memory plus 256 MiB for QEMU, and under TCG 512 MiB
// more for the translation cache and its bookkeeping; 256 processes; the
// default I/O weight.
// The memory limit is deliberately loose: it bounds a runaway QEMU, and an
// OOM kill of a working sandbox costs far more than spare headroom.
func ForVM(vcpus, memoryMiB int, tcg bool) Resources {
	vcpus = max(vcpus, 1)
	overhead := vmmOverheadMiB
	if tcg {
		overhead += TCGCacheMiB + tcgBookkeepingMiB
	}
	return Resources{
		CPUQuotaUS:  int64(vcpus*100+ioThreadCPUPercent) * DefaultCPUPeriodUS / 100,
		CPUPeriodUS: DefaultCPUPeriodUS,
		MemoryBytes: int64(max(memoryMiB, 0)+overhead) << 20,
		Pids:        maxPids,
		IOWeight:    DefaultIOWeight,
	}
}

// validate checks r and fills in the default period of a quota.
func (r Resources) validate() (Resources, error) {
	var errs []error
	if r.CPUQuotaUS < 0 || r.CPUPeriodUS < 0 || r.MemoryBytes < 0 || r.Pids < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	if r.CPUQuotaUS > 0 && r.CPUQuotaUS < 1000 {
		errs = append(errs, fmt.Errorf("cpu quota %d µs is under the kernel's least, 1000", r.CPUQuotaUS))
	}
	if r.CPUPeriodUS != 0 && (r.CPUPeriodUS < 1000 || r.CPUPeriodUS > 1000000) {
		errs = append(errs, fmt.Errorf("cpu period %d µs is not within 1000 to 1000000", r.CPUPeriodUS))
	}
	if r.IOWeight > 10000 {
		errs = append(errs, fmt.Errorf("io weight %d is over 10000", r.IOWeight))
	}
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("cgroup resources: %w: %w", err, errdefs.ErrInvalid)
	}
	if r.CPUPeriodUS == 0 {
		r.CPUPeriodUS = DefaultCPUPeriodUS
	}
	return r, nil
}

// Stats are a group's usage, read from its controllers' files.
type Stats struct {
	// CPUUsageNS is the CPU time the group has used, in nanoseconds.
	CPUUsageNS uint64
	// CPUThrottledNS is how long the group's threads waited, in total,
	// because its quota was spent; CPUThrottledPeriods is in how many
	// periods that happened.
	CPUThrottledNS      uint64
	CPUThrottledPeriods uint64
	// MemoryBytes is the memory charged to the group now.
	MemoryBytes uint64
	// MemoryPeakBytes is the most memory ever charged to it (v1's
	// memory.max_usage_in_bytes, v2's memory.peak); 0 where the kernel
	// does not keep it.
	MemoryPeakBytes uint64
	// Pids is the number of processes and threads in the group.
	Pids uint64
	// OOMKills counts the processes the OOM killer killed in the group
	// (v1's oom_kill in memory.oom_control, v2's memory.events).
	OOMKills uint64
}

// Hierarchy is where one airlock server's cgroups live: a parent path in
// the v2 unified hierarchy, or in each v1 hierarchy airlock uses (on a
// legacy host or a hybrid one, whose controllers are on v1).
type Hierarchy struct {
	parent  string // validated, relative, e.g. "airlock/3f2a9c"
	version int
	layout  layout
}

// layout is one cgroup version's way of making groups under parent.
type layout interface {
	create(name string, r Resources) (group, Resources, error)
	load(name string) (group, Resources, error)
	list() ([]string, error)
}

// group is one cgroup made by a layout.
type group interface {
	add(pid int) error
	stats() (Stats, error)
	// procs lists the processes in the group; an absent group has none.
	procs() ([]int, error)
	// kill sends SIGKILL to pids, the group's processes.
	kill(pids []int) error
	// remove removes the group, which has no processes; an absent group
	// is no error.
	remove() error
}

// cgroupRoot is where the kernel's cgroup filesystems are mounted, as
// cgroups.Mode expects them.
const cgroupRoot = "/sys/fs/cgroup"

// Open detects the host's cgroup layout and makes parent ready for
// groups: it creates parent in each hierarchy the groups need and, on v2,
// enables the cpu, memory and pids controllers (and io, where available)
// in cgroup.subtree_control from the root down to parent. A host that
// cannot limit CPU, memory and processes is errdefs.ErrPrecondition, with
// what to do; one without an I/O weight knob is not: its groups have none.
func Open(parent string) (*Hierarchy, error) {
	if err := validParent(parent); err != nil {
		return nil, err
	}
	var (
		l   layout
		v   int
		err error
	)
	switch cgroups.Mode() {
	case cgroups.Unified:
		v = 2
		l, err = openV2(cgroupRoot, parent)
	case cgroups.Legacy, cgroups.Hybrid:
		v = 1
		l, err = openV1(cgroupRoot, parent)
	default:
		return nil, fmt.Errorf("open cgroups: no cgroup filesystem is mounted at %s (mount cgroup2 there, or run on a host with systemd, which does): %w", cgroupRoot, errdefs.ErrPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("open cgroups (v%d) under %s: %w", v, parent, err)
	}
	return &Hierarchy{parent: parent, version: v, layout: l}, nil
}

// Version is the cgroup version the groups are made on: 1 or 2.
func (h *Hierarchy) Version() int { return h.version }

// Create makes the group name (one path element: a sandbox's ID) under
// the parent with the limits r, or rewrites the limits of the group of
// that name that exists. A bad name or bad limits are errdefs.ErrInvalid,
// and make nothing.
func (h *Hierarchy) Create(name string, r Resources) (*Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	r, err := r.validate()
	if err != nil {
		return nil, err
	}
	g, applied, err := h.layout.create(name, r)
	if err != nil {
		return nil, precondition("create cgroup "+path.Join(h.parent, name), err)
	}
	return &Group{path: path.Join(h.parent, name), res: applied, g: g}, nil
}

// Load finds the existing group name, as a restarted server does for a
// QEMU it adopts; its Resources are read back from the controllers. A
// group that is absent, or missing from a hierarchy it needs, is
// errdefs.ErrNotFound (Create makes it whole).
func (h *Hierarchy) Load(name string) (*Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	g, r, err := h.layout.load(name)
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", path.Join(h.parent, name), err)
	}
	return &Group{path: path.Join(h.parent, name), res: r, g: g}, nil
}

// List returns the names of the groups under the parent, sorted, for a
// sweep of groups whose sandbox is gone.
func (h *Hierarchy) List() ([]string, error) {
	names, err := h.layout.list()
	if err != nil {
		return nil, fmt.Errorf("list cgroups under %s: %w", h.parent, err)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Group is one sandbox's cgroup.
type Group struct {
	path string
	res  Resources
	g    group
}

// Path is the group's path relative to the root of each hierarchy, such
// as "airlock/3f2a9c/sbx…": /proc/PID/cgroup shows it with a leading "/".
func (g *Group) Path() string { return g.path }

// Resources are the limits applied to the group.
func (g *Group) Resources() Resources { return g.res }

// Add moves the process pid, with all its threads, into the group. Its
// children and threads to come are born in it.
func (g *Group) Add(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("add process %d to cgroup %s: %w", pid, g.path, errdefs.ErrInvalid)
	}
	if err := g.g.add(pid); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			err = fmt.Errorf("no such process: %w", errdefs.ErrNotFound)
		}
		return fmt.Errorf("add process %d to cgroup %s: %w", pid, g.path, err)
	}
	return nil
}

// Stats reads the group's usage.
func (g *Group) Stats() (Stats, error) {
	s, err := g.g.stats()
	if err != nil {
		return Stats{}, fmt.Errorf("read stats of cgroup %s: %w", g.path, err)
	}
	return s, nil
}

// Processes lists the processes in the group.
func (g *Group) Processes() ([]int, error) {
	pids, err := g.g.procs()
	if err != nil {
		return nil, fmt.Errorf("list processes of cgroup %s: %w", g.path, err)
	}
	return pids, nil
}

// killTimeout bounds how long Delete waits for killed processes to leave
// the group.
const killTimeout = 5 * time.Second

// Delete removes the group. Processes still in it are killed first
// (SIGKILL, then a wait of at most five seconds for them to go). A group
// that is already gone is no error.
func (g *Group) Delete() error {
	deadline := time.Now().Add(killTimeout)
	for {
		pids, err := g.g.procs()
		if err != nil {
			return fmt.Errorf("delete cgroup %s: %w", g.path, err)
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("delete cgroup %s: processes %v are still in it %v after SIGKILL: %w", g.path, pids, killTimeout, errdefs.ErrUnavailable)
		}
		if err := g.g.kill(pids); err != nil {
			return fmt.Errorf("delete cgroup %s: %w", g.path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		err := g.g.remove()
		if err == nil {
			return nil
		}
		// A process that has just exited may keep the group busy for a
		// moment.
		if time.Now().After(deadline) {
			return fmt.Errorf("delete cgroup %s: %w", g.path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// maxName bounds a group's name: a sandbox ID is 23 bytes.
const maxName = 128

// validName accepts one path element of letters, digits, '-' and '_'.
// No dot: it keeps "." and "..", and names like cgroup.procs or
// memory.max that are the controllers' own files, out.
func validName(name string) error {
	if name == "" || len(name) > maxName || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) >= 0 {
		return fmt.Errorf("cgroup name %q is not 1 to %d letters, digits, '-' or '_': %w", name, maxName, errdefs.ErrInvalid)
	}
	return nil
}

// validParent accepts a relative path of at most 8 valid names.
func validParent(parent string) error {
	elems := strings.Split(parent, "/")
	if len(elems) > 8 {
		return fmt.Errorf("cgroup parent %q has more than 8 elements: %w", parent, errdefs.ErrInvalid)
	}
	for _, e := range elems {
		if err := validName(e); err != nil {
			return fmt.Errorf("cgroup parent %q: %w", parent, err)
		}
	}
	return nil
}

// precondition explains a failure to make or write a cgroup that comes
// from the host's setup rather than from airlock.
func precondition(what string, err error) error {
	switch {
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: %w: airlock must run as root (or be given a delegated cgroup subtree): %w", what, err, errdefs.ErrPrecondition)
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%s: %w: the cgroup filesystem is mounted read-only (in a container, run it with a writable cgroup namespace): %w", what, err, errdefs.ErrPrecondition)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// weightOn maps w from io.weight's scale (1..100..10000) onto another
// with the given least, default and greatest values, linearly on each
// side of the default so that the defaults meet (as systemd maps IOWeight
// onto io.bfq.weight).
func weightOn(w uint16, least, def, most int) int {
	v := int(w)
	if v <= DefaultIOWeight {
		return least + (v-1)*(def-least)/(DefaultIOWeight-1)
	}
	return def + (v-DefaultIOWeight)*(most-def)/(10000-DefaultIOWeight)
}

// weightFrom is the inverse of weightOn, rounded to the nearest, for a
// group whose weight is read back.
func weightFrom(v, least, def, most int) uint16 {
	if v <= def {
		return uint16(1 + ((v-least)*(DefaultIOWeight-1)+(def-least)/2)/(def-least))
	}
	return uint16(DefaultIOWeight + ((v-def)*(10000-DefaultIOWeight)+(most-def)/2)/(most-def))
}

// readKnob reads a one-line control file.
func readKnob(dir, file string) (string, error) {
	b, err := os.ReadFile(path.Join(dir, file))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// exists reports whether the file dir/file exists.
func exists(dir, file string) bool {
	_, err := os.Stat(path.Join(dir, file))
	return err == nil
}

// lastField is the last space-separated field of s: a weight file reads
// "100" or "default 100".
func lastField(s string) string {
	if i := strings.LastIndexByte(s, ' '); i >= 0 {
		return s[i+1:]
	}
	return s
}

// listDir returns the names of the groups in the cgroup directory dir;
// a missing dir has none. The library has no call that lists a group's
// children.
func listDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && validName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	return names, nil
}
