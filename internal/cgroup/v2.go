package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// On cgroup v2 there is one hierarchy, and a controller works in a cgroup
// only when every ancestor enables it for its children in
// cgroup.subtree_control; a cgroup with processes of its own cannot (the
// root excepted). airlock's parent holds only groups, each holding one
// QEMU.

// v2Required are the controllers without which a sandbox cannot be
// limited; io is used where the host has it.
var v2Required = []string{"cpu", "memory", "pids"}

type v2Layout struct {
	mount  string // the cgroup2 mount: /sys/fs/cgroup
	parent string // absolute within the hierarchy: "/airlock/3f2a9c"
	mgr    *cgroup2.Manager
	io     bool // the io controller is enabled for the groups
}

func openV2(mount, parent string) (*v2Layout, error) {
	l := &v2Layout{mount: mount, parent: "/" + parent}
	root, err := cgroup2.Load("/", cgroup2.WithMountpoint(mount))
	if err != nil {
		return nil, err
	}
	avail, err := root.RootControllers()
	if err != nil {
		return nil, precondition("read the root cgroup's controllers", err)
	}
	var missing []string
	for _, c := range v2Required {
		if !slices.Contains(avail, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		what := "the " + missing[0] + " controller is"
		if len(missing) > 1 {
			what = "the " + strings.Join(missing, ", ") + " controllers are"
		}
		return nil, fmt.Errorf("%s not available: %s lists only %q (a kernel built without them, or a host that mounts them on cgroup v1): %w",
			what, path.Join(mount, "cgroup.controllers"), strings.Join(avail, " "), errdefs.ErrPrecondition)
	}
	dir := path.Join(mount, l.parent)
	existed := exists(dir, "")
	if l.mgr, err = cgroup2.NewManager(mount, l.parent, &cgroup2.Resources{}); err != nil {
		return nil, precondition("create the parent cgroup", err)
	}
	fail := func(err error) (*v2Layout, error) {
		if !existed {
			_ = os.Remove(dir)
		}
		return nil, err
	}
	want := v2Required
	l.io = slices.Contains(avail, "io")
	if l.io {
		want = append(slices.Clip(want), "io")
	}
	err = l.enable(want)
	if err != nil && l.io {
		// The I/O weight is not worth failing for.
		if l.enable(v2Required) == nil {
			l.io, err = false, nil
		}
	}
	if err != nil {
		return fail(l.explain(err))
	}
	if !exists(dir, "cpu.max") {
		return fail(fmt.Errorf("%s has no cpu.max: the kernel lacks CFS bandwidth control (CONFIG_CFS_BANDWIDTH), so CPU time cannot be limited: %w", dir, errdefs.ErrPrecondition))
	}
	return l, nil
}

// enable enables controllers in cgroup.subtree_control of the root, of
// each cgroup down to the parent, and of the parent itself.
func (l *v2Layout) enable(controllers []string) error {
	// ToggleControllers writes the subtree_control of every ancestor of
	// its manager's path, so a manager for a child of the parent (which
	// need not exist) writes the parent's too.
	child, err := cgroup2.Load(path.Join(l.parent, "child"), cgroup2.WithMountpoint(l.mount))
	if err != nil {
		return err
	}
	return child.ToggleControllers(controllers, cgroup2.Enable)
}

// explain turns a failure to enable the controllers into what to do: it
// names the first cgroup on the way down that does not enable one for its
// children, and why when it is because that cgroup has processes.
func (l *v2Layout) explain(err error) error {
	elems := strings.Split(strings.TrimPrefix(l.parent, "/"), "/")
	above := "/"
	for i := range len(elems) + 1 {
		var have []string
		if i < len(elems) {
			m, lerr := cgroup2.Load("/"+strings.Join(elems[:i+1], "/"), cgroup2.WithMountpoint(l.mount))
			if lerr != nil {
				break
			}
			if have, lerr = m.Controllers(); lerr != nil {
				break
			}
		}
		// Past the last element, have is empty: the parent itself failed
		// to enable them.
		for _, c := range v2Required {
			if slices.Contains(have, c) {
				continue
			}
			hint := ""
			if m, lerr := cgroup2.Load(above, cgroup2.WithMountpoint(l.mount)); above != "/" && lerr == nil {
				if procs, _ := m.Procs(false); len(procs) > 0 {
					hint = fmt.Sprintf(" (it has processes of its own, %v, and cgroup v2 enables controllers only below a cgroup without any: move them into a child cgroup)", procs)
				}
			}
			return fmt.Errorf("the %s controller is not enabled in %s%s: %w: %w", c, path.Join(l.mount, above, "cgroup.subtree_control"), hint, err, errdefs.ErrPrecondition)
		}
		if i < len(elems) {
			above = "/" + strings.Join(elems[:i+1], "/")
		}
	}
	return fmt.Errorf("enable the %s controllers in the cgroups down to %s: %w: %w", strings.Join(v2Required, ", "), path.Join(l.mount, l.parent), err, errdefs.ErrPrecondition)
}

func (l *v2Layout) dir(name string) string { return path.Join(l.mount, l.parent, name) }

func (l *v2Layout) create(name string, r Resources) (group, Resources, error) {
	var quota *int64 // nil: "max"
	if r.CPUQuotaUS != 0 {
		quota = &r.CPUQuotaUS
	}
	period := uint64(r.CPUPeriodUS)
	mem := r.MemoryBytes
	if mem == 0 {
		mem = math.MaxInt64 // memory.max takes no -1; this reads back as "max"
	}
	pids := r.Pids
	if pids == 0 {
		pids = -1 // "max"
	}
	res := &cgroup2.Resources{
		CPU:    &cgroup2.CPU{Max: cgroup2.NewCPUMax(quota, &period)},
		Memory: &cgroup2.Memory{Max: &mem},
		Pids:   &cgroup2.Pids{Max: pids},
	}
	if l.io {
		res.IO = &cgroup2.IO{} // enables io for the group; the weight comes next
	}
	m, err := l.mgr.NewChild(name, res)
	if err != nil {
		return nil, r, err
	}
	if exists(l.dir(name), "memory.swap.max") {
		// The limit covers swap too: a limited group swaps nothing.
		// memory.swap.max exists only where swap is accounted.
		swap := int64(0)
		if r.MemoryBytes == 0 {
			swap = math.MaxInt64
		}
		if err := m.Update(&cgroup2.Resources{Memory: &cgroup2.Memory{Swap: &swap}}); err != nil {
			return nil, r, err
		}
	}
	if r.IOWeight != 0 && !l.setWeight(m, name, r.IOWeight) {
		r.IOWeight = 0
	}
	return &v2Group{m: m}, r, nil
}

// setWeight sets io.weight (read by the iocost controller) and
// io.bfq.weight (by the BFQ scheduler), whichever exist; it reports
// whether one was set.
func (l *v2Layout) setWeight(m *cgroup2.Manager, name string, w uint16) bool {
	if !l.io {
		return false
	}
	set := false
	dir := l.dir(name)
	if exists(dir, "io.weight") {
		// cgroup2 writes only io.bfq.weight.
		set = os.WriteFile(path.Join(dir, "io.weight"), []byte(strconv.Itoa(int(w))), 0) == nil
	}
	if exists(dir, "io.bfq.weight") {
		bfq := &cgroup2.Resources{IO: &cgroup2.IO{BFQ: cgroup2.BFQ{Weight: uint16(weightOn(w, 1, 100, 1000))}}}
		set = m.Update(bfq) == nil || set
	}
	return set
}

func (l *v2Layout) load(name string) (group, Resources, error) {
	dir := l.dir(name)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, Resources{}, fmt.Errorf("no such cgroup: %w", errdefs.ErrNotFound)
	}
	m, err := cgroup2.Load(path.Join(l.parent, name), cgroup2.WithMountpoint(l.mount))
	if err != nil {
		return nil, Resources{}, err
	}
	r, err := l.readResources(dir)
	if err != nil {
		return nil, Resources{}, err
	}
	return &v2Group{m: m}, r, nil
}

// readResources reads back the limits of the group in dir, which cgroup2
// does not report (its stats hold only the memory and pids limits).
func (l *v2Layout) readResources(dir string) (Resources, error) {
	var r Resources
	cpu, err := readKnob(dir, "cpu.max") // "max 100000" or "20000 100000"
	if err != nil {
		return r, err
	}
	quota, period, _ := strings.Cut(cpu, " ")
	if quota != "max" {
		r.CPUQuotaUS, _ = strconv.ParseInt(quota, 10, 64)
	}
	r.CPUPeriodUS, _ = strconv.ParseInt(period, 10, 64)
	for _, k := range []struct {
		file string
		to   *int64
	}{{"memory.max", &r.MemoryBytes}, {"pids.max", &r.Pids}} {
		s, err := readKnob(dir, k.file)
		if err != nil {
			return r, err
		}
		if s != "max" {
			if *k.to, err = strconv.ParseInt(s, 10, 64); err != nil {
				return r, fmt.Errorf("%s: %w", k.file, err)
			}
		}
	}
	if s, err := readKnob(dir, "io.weight"); err == nil {
		w, _ := strconv.Atoi(lastField(firstLine(s)))
		r.IOWeight = uint16(w)
	} else if s, err := readKnob(dir, "io.bfq.weight"); err == nil {
		if w, _ := strconv.Atoi(lastField(firstLine(s))); w > 0 {
			r.IOWeight = weightFrom(w, 1, 100, 1000)
		}
	}
	return r, nil
}

// firstLine is s up to its first newline: a weight file may list
// per-device weights after the default.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func (l *v2Layout) list() ([]string, error) {
	return listDir(path.Join(l.mount, l.parent))
}

type v2Group struct {
	m *cgroup2.Manager
}

func (g *v2Group) add(pid int) error { return g.m.AddProc(uint64(pid)) }

func (g *v2Group) stats() (Stats, error) {
	m, err := g.m.StatFiltered(cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents | cgroup2.StatPids)
	if err != nil {
		return Stats{}, err
	}
	return Stats{
		CPUUsageNS:          m.GetCPU().GetUsageUsec() * 1000,
		CPUThrottledNS:      m.GetCPU().GetThrottledUsec() * 1000,
		CPUThrottledPeriods: m.GetCPU().GetNrThrottled(),
		MemoryBytes:         m.GetMemory().GetUsage(),
		MemoryPeakBytes:     m.GetMemory().GetMaxUsage(),
		Pids:                m.GetPids().GetCurrent(),
		OOMKills:            m.GetMemoryEvents().GetOomKill(),
	}, nil
}

func (g *v2Group) procs() ([]int, error) {
	ps, err := g.m.Procs(true)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pids := make([]int, len(ps))
	for i, p := range ps {
		pids[i] = int(p)
	}
	return pids, nil
}

// kill writes cgroup.kill, which kills every process in the group (the
// library falls back to signalling each on kernels before 5.14).
func (g *v2Group) kill([]int) error { return g.m.Kill() }

func (g *v2Group) remove() error {
	if err := g.m.Delete(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
