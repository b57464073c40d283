package service

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/store"
)

// maxLimit bounds any one limit: far above what a host holds, low enough
// that sums of them cannot overflow.
const maxLimit = 1 << 40

// LimitError is the refusal of something that would take a key, or the
// host, past a limit: 429 resource_exhausted with Details.
type LimitError struct {
	// Limit names the limit: a field of apiv1.Limits, or "memory_budget_mib"
	// for the host's.
	Limit string
	// Max is the limit, InUse what is held now, Requested what was asked.
	Max, InUse, Requested int64
	// Key is the key whose limit it is; "" for the host's.
	Key string
}

func (e *LimitError) Error() string {
	if e.Limit == "build_context_mib" {
		return fmt.Sprintf("a build context of key %s may be at most %d MiB (its limit build_context_mib), and this one is %d MiB or more: send a smaller context, or ask an admin for a higher limit: %v",
			e.Key, e.Max, e.Requested, errdefs.ErrExhausted)
	}
	if e.Key == "" {
		return fmt.Sprintf("this host's memory budget is %d MiB and its sandboxes hold %d MiB: %d MiB more does not fit (airlock serve --memory-budget); suspend or delete a sandbox and retry: %v",
			e.Max, e.InUse, e.Requested, errdefs.ErrExhausted)
	}
	return fmt.Sprintf("key %s's limit %s is %d and it holds %d: %d more would pass it; delete or suspend what it holds, or ask an admin for a higher limit: %v",
		e.Key, e.Limit, e.Max, e.InUse, e.Requested, errdefs.ErrExhausted)
}

func (e *LimitError) Is(target error) bool { return target == errdefs.ErrExhausted }

// Details is the error's details in the API's answer.
func (e *LimitError) Details() map[string]any {
	return map[string]any{"limit": e.Limit, "max": e.Max, "in_use": e.InUse, "requested": e.Requested}
}

// limitFields lists the fields of apiv1.Limits by their JSON names.
func limitFields(l *apiv1.Limits) []struct {
	name string
	v    **int64
} {
	return []struct {
		name string
		v    **int64
	}{
		{"sandboxes", &l.Sandboxes}, {"vcpus", &l.VCPUs}, {"memory_mib", &l.MemoryMiB}, {"disk_mib", &l.DiskMiB},
		{"suspended_mib", &l.SuspendedMiB}, {"checkpoints", &l.Checkpoints}, {"builds", &l.Builds},
		{"build_context_mib", &l.BuildContextMiB},
	}
}

// checkLimits refuses a negative or huge limit, naming it.
func checkLimits(field string, l *apiv1.Limits) error {
	if l == nil {
		return nil
	}
	for _, f := range limitFields(l) {
		if v := *f.v; v != nil && (*v < 0 || *v > maxLimit) {
			return fmt.Errorf("%s.%s %d is out of bounds: use 0 to %d, or leave it out for the default: %w", field, f.name, *v, int64(maxLimit), errdefs.ErrInvalid)
		}
	}
	return nil
}

// ParseLimits reads limits written NAME=N[,NAME=N…] (the CLI's and
// airlock serve --default-limits' form), names as in apiv1.Limits' JSON.
func ParseLimits(s string) (apiv1.Limits, error) {
	var l apiv1.Limits
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		found := false
		for _, f := range limitFields(&l) {
			if f.name == strings.TrimSpace(name) {
				n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
				if !ok || err != nil {
					return l, fmt.Errorf("limit %q: want NAME=N with N a whole number: %w", part, errdefs.ErrInvalid)
				}
				*f.v, found = &n, true
			}
		}
		if !found {
			return l, fmt.Errorf("limit %q: the limits are sandboxes, vcpus, memory_mib, disk_mib, suspended_mib, checkpoints, builds and build_context_mib: %w", fields.Truncate(name, 40), errdefs.ErrInvalid)
		}
	}
	return l, checkLimits("limits", &l)
}

// keyLimits are the limits in force for k: its own, and for a user key
// the server's defaults where it has none.
func (s *Service) keyLimits(k store.Key) (apiv1.Limits, error) {
	var l apiv1.Limits
	if len(k.Limits) > 0 {
		if err := json.Unmarshal(k.Limits, &l); err != nil {
			return l, fmt.Errorf("limits of key %s: %w", k.ID, err)
		}
	}
	if k.Role != apiv1.RoleAdmin {
		def := s.cfg.DefaultLimits
		defs, own := limitFields(&def), limitFields(&l)
		for i := range own {
			if *own[i].v == nil {
				*own[i].v = *defs[i].v
			}
		}
	}
	return l, nil
}

// limitsOf reads the limits in force for key id. A key that is gone (its
// sandboxes outlive it) has the defaults of a user key.
func (s *Service) limitsOf(ctx context.Context, id string) (apiv1.Limits, error) {
	k, err := s.st.GetKey(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		k = store.Key{ID: id, Role: apiv1.RoleUser}
	} else if err != nil {
		return apiv1.Limits{}, err
	}
	return s.keyLimits(k)
}

// want is what something asks of a key's limits, beside what it holds.
type want struct {
	sandboxes, vcpus, memoryMiB, diskMiB, suspendedMiB, builds int64
}

// within checks that u plus w passes none of l's limits.
func within(key string, l apiv1.Limits, u store.Usage, w want) error {
	for _, c := range []struct {
		name       string
		max        *int64
		inUse, add int64
	}{
		{"sandboxes", l.Sandboxes, u.Sandboxes, w.sandboxes},
		{"vcpus", l.VCPUs, u.VCPUs, w.vcpus},
		{"memory_mib", l.MemoryMiB, u.MemoryMiB, w.memoryMiB},
		{"disk_mib", l.DiskMiB, u.DiskMiB, w.diskMiB},
		{"suspended_mib", l.SuspendedMiB, u.SuspendedMiB, w.suspendedMiB},
		{"builds", l.Builds, u.Builds, w.builds},
	} {
		if c.max != nil && c.add > 0 && c.inUse+c.add > *c.max {
			return &LimitError{Limit: c.name, Max: *c.max, InUse: c.inUse, Requested: c.add, Key: key}
		}
	}
	return nil
}

// usageView is u as the API shows it.
func usageView(u store.Usage) *apiv1.Usage {
	return &apiv1.Usage{Sandboxes: u.Sandboxes, VCPUs: u.VCPUs, MemoryMiB: u.MemoryMiB, DiskMiB: u.DiskMiB,
		SuspendedMiB: u.SuspendedMiB, Builds: u.Builds, Checkpoints: u.Checkpoints}
}

// hostMemoryMiB is the host's RAM (MemTotal), 0 if unknown.
func hostMemoryMiB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			// A value that does not parse is 0: unknown, as documented.
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb >> 10
		}
	}
	return 0
}

// memoryHeld is the memory the VMs of this host hold or are being given:
// running and paused ones, creates admitted, wakes begun. s.mu is held.
func (s *Service) memoryHeld() int64 {
	var n int64
	for _, c := range s.creating {
		n += c.memoryMiB
	}
	for _, lv := range s.live {
		if box := lv.vmBox(); box != nil {
			n += int64(box.MemoryMiB())
		}
	}
	for _, m := range s.waking {
		n += m
	}
	return n
}

// fitsBudget refuses memoryMiB more when it would take the host's VMs past
// the memory budget. s.mu is held.
func (s *Service) fitsBudget(memoryMiB int64) error {
	if held := s.memoryHeld(); held+memoryMiB > s.cfg.MemoryBudgetMiB {
		return &LimitError{Limit: "memory_budget_mib", Max: s.cfg.MemoryBudgetMiB, InUse: held, Requested: memoryMiB}
	}
	return nil
}
