package guest

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// DefaultModules returns the kernel modules the guest loads, in load order.
// Their dependencies are added ahead of them by ResolveModules.
func DefaultModules() []string {
	return []string{
		"virtio_ring", "virtio", "virtio_mmio",
		"virtio_blk", "virtio_console",
		"failover", "net_failover", "virtio_net",
		"virtio_rng",
	}
}

// Module is one kernel module chosen for the initramfs.
type Module struct {
	// Name is the canonical module name, with '_' for '-'.
	Name string
	// Path is the .ko file on the host.
	Path string
	// Depends are the canonical names of the modules it needs loaded first.
	Depends []string
}

// canonical returns a module name as the kernel compares them: '-' and '_'
// are the same character.
func canonical(name string) string {
	return strings.ReplaceAll(name, "-", "_")
}

// indexModules maps canonical module names to the .ko files under root.
func indexModules(root string) (map[string]string, error) {
	idx := make(map[string]string)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".ko") {
			idx[canonical(strings.TrimSuffix(d.Name(), ".ko"))] = path
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("index modules under %s: %w", root, err)
	}
	return idx, nil
}

// readModinfo returns the key=value pairs of the .modinfo section of a .ko
// file. Keys may repeat (alias=), so values are lists.
func readModinfo(path string) (map[string][]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("read module %s: no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read .modinfo of %s: %w", path, err)
	}
	info := make(map[string][]string)
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		info[k] = append(info[k], v)
	}
	return info, nil
}

// moduleDepends returns the canonical names listed in a module's depends=.
func moduleDepends(info map[string][]string) []string {
	var deps []string
	for _, v := range info["depends"] {
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d != "" {
				deps = append(deps, canonical(d))
			}
		}
	}
	return deps
}

// ResolveModules finds the wanted modules under root (a lib/modules/<release>
// directory), reads their dependencies from each file's .modinfo and returns
// them with all dependencies, in an order where every module follows the
// modules it depends on and otherwise keeps the order of wanted.
func ResolveModules(root string, wanted []string) ([]Module, error) {
	idx, err := indexModules(root)
	if err != nil {
		return nil, err
	}
	mods := make(map[string]Module)
	var load func(name string) error
	load = func(name string) error {
		if _, ok := mods[name]; ok {
			return nil
		}
		path, ok := idx[name]
		if !ok {
			return fmt.Errorf("module %s not found under %s", name, root)
		}
		info, err := readModinfo(path)
		if err != nil {
			return err
		}
		m := Module{Name: name, Path: path, Depends: moduleDepends(info)}
		mods[name] = m
		for _, d := range m.Depends {
			if err := load(d); err != nil {
				return fmt.Errorf("dependency of %s: %w", name, err)
			}
		}
		return nil
	}
	names := make([]string, len(wanted))
	for i, w := range wanted {
		names[i] = canonical(w)
		if err := load(names[i]); err != nil {
			return nil, err
		}
	}
	deps := make(map[string][]string, len(mods))
	for n, m := range mods {
		deps[n] = m.Depends
	}
	order, err := loadOrder(names, deps)
	if err != nil {
		return nil, err
	}
	out := make([]Module, len(order))
	for i, n := range order {
		out[i] = mods[n]
	}
	return out, nil
}

// loadOrder returns wanted and everything they depend on (per deps, keyed
// by canonical name) so that each module comes after its dependencies. It
// walks wanted in order, placing each module's dependencies (in their listed
// order) just before it, so the result is deterministic. A dependency cycle
// or a module missing from deps is an error.
func loadOrder(wanted []string, deps map[string][]string) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := make(map[string]int)
	var order []string
	var visit func(n string, path []string) error
	visit = func(n string, path []string) error {
		switch state[n] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(path, n), " -> "))
		}
		d, ok := deps[n]
		if !ok {
			return fmt.Errorf("module %s: unknown", n)
		}
		state[n] = visiting
		for _, dep := range d {
			if err := visit(dep, append(path, n)); err != nil {
				return err
			}
		}
		state[n] = done
		order = append(order, n)
		return nil
	}
	for _, w := range wanted {
		if err := visit(canonical(w), nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
