package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"syscall"

	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// On cgroup v1 each controller has a hierarchy of its own, mounted at
// /sys/fs/cgroup/<controller> (cpu and cpuacct often together, with the
// two names linked to one mount). A group is a directory of the same path
// in each hierarchy it uses: cpu (the CFS quota), memory, pids, and
// cpuacct (CPU usage) and blkio (an I/O weight) where the host has them.

// v1Required are the controllers without which a sandbox cannot be
// limited.
var v1Required = []cgroup1.Name{cgroup1.Cpu, cgroup1.Memory, cgroup1.Pids}

// Weight knobs of v1's blkio controller: CFQ's (gone since Linux 5.0) and
// BFQ's.
const (
	blkioWeight    = "blkio.weight"     // 10..1000, default 500
	blkioBFQWeight = "blkio.bfq.weight" // 1..1000, default 100
)

// memswLimit is v1's limit on memory and swap together.
const memswLimit = "memory.memsw.limit_in_bytes"

type v1Layout struct {
	root       string // where the hierarchies are mounted: /sys/fs/cgroup
	parent     string // absolute within each hierarchy: "/airlock/3f2a9c"
	subsystems []cgroup1.Subsystem
	weightKnob string // blkioWeight, blkioBFQWeight, or "" for none
}

func openV1(root, parent string) (*v1Layout, error) {
	l := &v1Layout{root: root, parent: "/" + parent}
	mounted := func(n cgroup1.Name) bool {
		var st unix.Statfs_t
		return unix.Statfs(path.Join(root, string(n)), &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC
	}
	for _, n := range v1Required {
		if !mounted(n) {
			return nil, fmt.Errorf("the %s controller is not mounted at %s (mount -t cgroup -o %s cgroup %s): %w",
				n, path.Join(root, string(n)), n, path.Join(root, string(n)), errdefs.ErrPrecondition)
		}
	}
	l.subsystems = []cgroup1.Subsystem{
		cgroup1.NewCpu(root),
		// Only the usage airlock reports is read: swap and kernel-memory
		// files are missing on some kernels, and not needed.
		cgroup1.NewMemory(root, cgroup1.IgnoreModules("memsw", "kmem", "kmem.tcp")),
		cgroup1.NewPids(root),
	}
	if mounted(cgroup1.Cpuacct) {
		l.subsystems = append(l.subsystems, cgroup1.NewCpuacct(root))
	}
	blkio := mounted(cgroup1.Blkio)
	if blkio {
		l.subsystems = append(l.subsystems, cgroup1.NewBlkio(root))
	}
	// Making the parent in every hierarchy proves they are writable.
	existed := exists(l.dir(cgroup1.Memory, l.parent), "")
	pcg, err := cgroup1.New(cgroup1.StaticPath(l.parent), &specs.LinuxResources{}, cgroup1.WithHierarchy(l.hierarchy))
	if err != nil {
		return nil, precondition("create the parent cgroup", err)
	}
	if cpu := l.dir(cgroup1.Cpu, l.parent); !exists(cpu, "cpu.cfs_quota_us") {
		if !existed {
			_ = pcg.Delete()
		}
		return nil, fmt.Errorf("%s has no cpu.cfs_quota_us: the kernel lacks CFS bandwidth control (CONFIG_CFS_BANDWIDTH), so CPU time cannot be limited: %w", cpu, errdefs.ErrPrecondition)
	}
	if blkio {
		// The weight files exist in every cgroup but the root, so the
		// parent shows which one this kernel has.
		dir := l.dir(cgroup1.Blkio, l.parent)
		for _, knob := range []string{blkioWeight, blkioBFQWeight} {
			if exists(dir, knob) {
				l.weightKnob = knob
				break
			}
		}
		if l.weightKnob == "" {
			// No weight to set: groups are not made in blkio at all.
			l.subsystems = l.subsystems[:len(l.subsystems)-1]
			_ = os.Remove(dir) // fails, harmlessly, if it holds groups
		}
	}
	return l, nil
}

// hierarchy is the cgroup1.Hierarchy of the controllers airlock uses.
func (l *v1Layout) hierarchy() ([]cgroup1.Subsystem, error) { return l.subsystems, nil }

// dir is the directory of the cgroup p (absolute within the hierarchy) in
// controller n's hierarchy.
func (l *v1Layout) dir(n cgroup1.Name, p string) string {
	return path.Join(l.root, string(n), p)
}

func (l *v1Layout) create(name string, r Resources) (group, Resources, error) {
	p := path.Join(l.parent, name)
	quota, mem := r.CPUQuotaUS, r.MemoryBytes
	if quota == 0 {
		quota = -1
	}
	if mem == 0 {
		mem = -1
	}
	period := uint64(r.CPUPeriodUS)
	spec := &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &mem},
		Pids:   &specs.LinuxPids{Limit: &r.Pids},
	}
	weight := 0
	if r.IOWeight != 0 {
		switch l.weightKnob {
		case blkioWeight:
			w := uint16(weightOn(r.IOWeight, 10, 500, 1000))
			spec.BlockIO = &specs.LinuxBlockIO{Weight: &w}
			weight = int(w)
		case blkioBFQWeight:
			weight = weightOn(r.IOWeight, 1, 100, 1000)
		}
	}
	if weight == 0 {
		r.IOWeight = 0
	}
	memDir := l.dir(cgroup1.Memory, p)
	existed := exists(memDir, "")
	// The limit covers swap too (memory.memsw.limit_in_bytes, where swap
	// is accounted), which must never be under memory.limit_in_bytes: it
	// is lifted before the limit is written and set to it afterwards.
	// cgroup1 writes the two in a fixed order, which fails when a limit
	// is raised.
	memsw := existed && exists(memDir, memswLimit)
	var err error
	if memsw {
		err = os.WriteFile(path.Join(memDir, memswLimit), []byte("-1"), 0)
	}
	var cg cgroup1.Cgroup
	if err == nil {
		cg, err = cgroup1.New(cgroup1.StaticPath(p), spec, cgroup1.WithHierarchy(l.hierarchy))
	}
	if err == nil && exists(memDir, memswLimit) {
		err = os.WriteFile(path.Join(memDir, memswLimit), []byte(strconv.FormatInt(mem, 10)), 0)
	}
	if err == nil && r.Pids == 0 {
		// cgroup1 writes only a positive limit, so it could not lift one.
		err = os.WriteFile(path.Join(l.dir(cgroup1.Pids, p), "pids.max"), []byte("max"), 0)
	}
	if err != nil {
		if !existed {
			if cg, lerr := cgroup1.Load(cgroup1.StaticPath(p), cgroup1.WithHierarchy(l.hierarchy)); lerr == nil {
				_ = cg.Delete() // it is new and empty
			}
		}
		return nil, r, err
	}
	if l.weightKnob == blkioBFQWeight && weight != 0 {
		// cgroup1 knows only CFQ's blkio.weight. The weight is not worth
		// failing for.
		if os.WriteFile(path.Join(l.dir(cgroup1.Blkio, p), blkioBFQWeight), []byte(strconv.Itoa(weight)), 0) != nil {
			r.IOWeight = 0
		}
	}
	return &v1Group{l: l, cg: cg}, r, nil
}

func (l *v1Layout) load(name string) (group, Resources, error) {
	p := path.Join(l.parent, name)
	cg, err := cgroup1.Load(cgroup1.StaticPath(p), cgroup1.WithHierarchy(l.hierarchy))
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil, Resources{}, fmt.Errorf("no such cgroup: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, Resources{}, err
	}
	for _, n := range v1Required {
		if !exists(l.dir(n, p), "") {
			return nil, Resources{}, fmt.Errorf("it is missing from the %s hierarchy: %w", n, errdefs.ErrNotFound)
		}
	}
	r, err := l.readResources(p)
	if err != nil {
		return nil, Resources{}, err
	}
	return &v1Group{l: l, cg: cg}, r, nil
}

// readResources reads back the limits of the cgroup p, which cgroup1 does
// not report (its stats hold only the memory and pids limits).
func (l *v1Layout) readResources(p string) (Resources, error) {
	var r Resources
	knobs := []struct {
		n    cgroup1.Name
		file string
		to   *int64
	}{
		{cgroup1.Cpu, "cpu.cfs_quota_us", &r.CPUQuotaUS},
		{cgroup1.Cpu, "cpu.cfs_period_us", &r.CPUPeriodUS},
		{cgroup1.Memory, "memory.limit_in_bytes", &r.MemoryBytes},
		{cgroup1.Pids, "pids.max", &r.Pids},
	}
	for _, k := range knobs {
		s, err := readKnob(l.dir(k.n, p), k.file)
		if err != nil {
			return r, err
		}
		if s == "max" {
			continue
		}
		if *k.to, err = strconv.ParseInt(s, 10, 64); err != nil {
			return r, fmt.Errorf("%s: %w", k.file, err)
		}
	}
	if r.CPUQuotaUS < 0 {
		r.CPUQuotaUS = 0
	}
	// Unlimited memory reads as the largest page-aligned int64.
	if r.MemoryBytes >= 1<<62 {
		r.MemoryBytes = 0
	}
	if l.weightKnob != "" {
		s, err := readKnob(l.dir(cgroup1.Blkio, p), l.weightKnob)
		if err == nil {
			w, _ := strconv.Atoi(lastField(s))
			switch {
			case w == 0:
			case l.weightKnob == blkioWeight:
				r.IOWeight = weightFrom(w, 10, 500, 1000)
			default:
				r.IOWeight = weightFrom(w, 1, 100, 1000)
			}
		}
	}
	return r, nil
}

func (l *v1Layout) list() ([]string, error) {
	var names []string
	for _, s := range l.subsystems {
		n, err := listDir(l.dir(s.Name(), l.parent))
		if err != nil {
			return nil, err
		}
		names = append(names, n...)
	}
	return names, nil
}

type v1Group struct {
	l  *v1Layout
	cg cgroup1.Cgroup
}

func (g *v1Group) add(pid int) error { return g.cg.AddProc(uint64(pid)) }

func (g *v1Group) stats() (Stats, error) {
	m, err := g.cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return Stats{}, err
	}
	var s Stats
	if c := m.GetCPU(); c != nil {
		s.CPUUsageNS = c.GetUsage().GetTotal()
		s.CPUThrottledNS = c.GetThrottling().GetThrottledTime()
		s.CPUThrottledPeriods = c.GetThrottling().GetThrottledPeriods()
	}
	s.MemoryBytes = m.GetMemory().GetUsage().GetUsage()
	s.MemoryPeakBytes = m.GetMemory().GetUsage().GetMax()
	s.OOMKills = m.GetMemoryOomControl().GetOomKill()
	s.Pids = m.GetPids().GetCurrent()
	return s, nil
}

func (g *v1Group) procs() ([]int, error) {
	seen := map[int]bool{}
	var pids []int
	for _, s := range g.cg.Subsystems() {
		ps, err := g.cg.Processes(s.Name(), true)
		if errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return nil, nil
		}
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			if !seen[p.Pid] {
				seen[p.Pid] = true
				pids = append(pids, p.Pid)
			}
		}
	}
	return pids, nil
}

// kill signals each process: v1 has no cgroup.kill.
func (g *v1Group) kill(pids []int) error {
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill process %d: %w", pid, err)
		}
	}
	return nil
}

func (g *v1Group) remove() error {
	if err := g.cg.Delete(); err != nil && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return err
	}
	return nil
}
