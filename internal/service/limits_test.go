package service

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

func TestParseLimits(t *testing.T) {
	l, err := ParseLimits(" sandboxes=5, memory_mib=4096,build_context_mib=0")
	if err != nil || *l.Sandboxes != 5 || *l.MemoryMiB != 4096 || *l.BuildContextMiB != 0 || l.VCPUs != nil {
		t.Fatalf("ParseLimits = %+v, %v", l, err)
	}
	if l, err := ParseLimits(""); err != nil || l != (apiv1.Limits{}) {
		t.Fatalf("ParseLimits(\"\") = %+v, %v", l, err)
	}
	for _, bad := range []string{"sandboxes", "sandboxes=x", "sandboxes=-1", "nope=1", "vcpus=1.5", "disk_mib=99999999999999999", "memory_mib=" + strings.Repeat("9", 30)} {
		if _, err := ParseLimits(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseLimits(%q) = %v, want invalid", bad, err)
		}
	}
}

// TestWithin: each limit refuses what passes it, names itself and what is
// held; nothing asked of a limit never trips it, even one already passed.
func TestWithin(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	l := apiv1.Limits{Sandboxes: n(2), VCPUs: n(4), MemoryMiB: n(1024), DiskMiB: n(4096), SuspendedMiB: n(512), Builds: n(0)}
	u := store.Usage{Sandboxes: 1, VCPUs: 2, MemoryMiB: 512, DiskMiB: 2048, Builds: 0}
	if err := within("k", l, u, want{sandboxes: 1, vcpus: 2, memoryMiB: 512, diskMiB: 2048}); err != nil {
		t.Fatalf("a create that fits exactly: %v", err)
	}
	for _, tc := range []struct {
		w     want
		limit string
	}{
		{want{sandboxes: 2}, "sandboxes"},
		{want{vcpus: 3}, "vcpus"},
		{want{memoryMiB: 513}, "memory_mib"},
		{want{diskMiB: 2049}, "disk_mib"},
		{want{suspendedMiB: 513}, "suspended_mib"},
		{want{builds: 1}, "builds"},
	} {
		var le *LimitError
		if err := within("k", l, u, tc.w); !errors.As(err, &le) || le.Limit != tc.limit || !errors.Is(err, errdefs.ErrExhausted) {
			t.Errorf("%+v: %v, want %s", tc.w, err, tc.limit)
		}
	}
	over := store.Usage{Sandboxes: 9}
	if err := within("k", l, over, want{vcpus: 1}); err != nil {
		t.Errorf("a key over its sandboxes limit asking only vCPUs: %v", err)
	}
}

// TestKeyLimitsDefaults: a user key takes the server's defaults where it
// has none of its own; an admin key only its own.
func TestKeyLimitsDefaults(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	s := &Service{cfg: Config{DefaultLimits: apiv1.Limits{Sandboxes: n(3), VCPUs: n(8)}}}
	user, err := s.keyLimits(store.Key{ID: "key1", Role: apiv1.RoleUser, Limits: []byte(`{"vcpus":2}`)})
	if err != nil || *user.Sandboxes != 3 || *user.VCPUs != 2 {
		t.Fatalf("user limits %+v, %v", user, err)
	}
	admin, err := s.keyLimits(store.Key{ID: "key2", Role: apiv1.RoleAdmin, Limits: []byte(`{"builds":1}`)})
	if err != nil || admin.Sandboxes != nil || *admin.Builds != 1 {
		t.Fatalf("admin limits %+v, %v", admin, err)
	}
}
