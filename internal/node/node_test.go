package node

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// TestPodStatus: each state of a sandbox's row is the Pod phase and
// readiness Kubernetes users read: made, pending; holding a VM or a
// snapshot here, running (ready only while running); ended, succeeded or
// failed with the row's reason.
func TestPodStatus(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	for _, tc := range []struct {
		state string
		phase corev1.PodPhase
		ready bool
	}{
		{apiv1.StateCreating, corev1.PodPending, false},
		{apiv1.StateRunning, corev1.PodRunning, true},
		{apiv1.StatePaused, corev1.PodRunning, false},
		{apiv1.StateSuspended, corev1.PodRunning, false},
		{apiv1.StateDeleting, corev1.PodRunning, false},
		{apiv1.StateDeleted, corev1.PodSucceeded, false},
		{apiv1.StateFailed, corev1.PodFailed, false},
	} {
		sb := store.Sandbox{ID: "sbx1", State: tc.state, TemplateDigest: "sha256:ab", CreatedAt: now, UpdatedAt: now}
		if tc.state == apiv1.StateFailed {
			sb.LastError = &store.Error{Code: "unavailable", Message: "the VM died"}
		}
		st := podStatus(sb, "10.0.0.5")
		ready := false
		for _, c := range st.Conditions {
			if c.Type == corev1.PodReady {
				ready = c.Status == corev1.ConditionTrue
			}
		}
		if st.Phase != tc.phase || ready != tc.ready || st.PodIP != "10.0.0.5" || len(st.ContainerStatuses) != 1 {
			t.Errorf("%s: phase %s, ready %v, ip %q; want %s, %v", tc.state, st.Phase, ready, st.PodIP, tc.phase, tc.ready)
		}
		if tc.state == apiv1.StateFailed && (st.Message != "the VM died" || st.ContainerStatuses[0].State.Terminated == nil) {
			t.Errorf("failed: message %q, container %+v", st.Message, st.ContainerStatuses[0].State)
		}
	}
}

// TestSandboxOf: only a Pod labelled with its own name is a sandbox's.
func TestSandboxOf(t *testing.T) {
	pod := func(name, label string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "airlock", Labels: map[string]string{cluster.LabelSandbox: label}}}
	}
	if id, err := sandboxOf(pod("sbx1", "sbx1")); err != nil || id != "sbx1" {
		t.Errorf("a sandbox pod: %q, %v", id, err)
	}
	for _, p := range []*corev1.Pod{pod("sbx1", ""), pod("sbx1", "sbx2"), {ObjectMeta: metav1.ObjectMeta{Name: "sbx1"}}} {
		if _, err := sandboxOf(p); err == nil || !strings.Contains(err.Error(), "is not a sandbox's") {
			t.Errorf("pod %s labelled %v: %v", p.Name, p.Labels, err)
		}
	}
}

// TestNewRefusesBadConfig: each missing or bad part is named.
func TestNewRefusesBadConfig(t *testing.T) {
	good := func() Config {
		return Config{Client: fake.NewClientset(), Service: &service.Service{}, Store: &store.Store{}, Namespace: "airlock", Name: "host-a",
			Capacity: Capacity{CPUs: 2, MemoryMiB: 4096, DiskMiB: 10240, Sandboxes: 8}, Address: "10.0.0.5", Port: 7701}
	}
	if _, err := New(good()); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no client", func(c *Config) { c.Client = nil }, "a client, a service and a store"},
		{"no name", func(c *Config) { c.Name = "" }, "a namespace and a node name"},
		{"bad address", func(c *Config) { c.Address = "host-a" }, "is not an IP address"},
		{"bad port", func(c *Config) { c.Port = 70000 }, "out of range"},
		{"no cpus", func(c *Config) { c.Capacity.CPUs = 0 }, "must be positive"},
		{"short lease", func(c *Config) { c.LeaseDuration = time.Second }, "under 4s"},
	} {
		c := good()
		tc.edit(&c)
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
