package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

type fakeRegistry map[string]string

func (r fakeRegistry) ClusterNodes(context.Context) (map[string]string, error) { return r, nil }

// TestNodeWatchRegistration: a Node that labels itself an airlock node is
// not one until its agent registered it in the store, and a registered one
// is reached where the store says, not where its Node object says.
func TestNodeWatchRegistration(t *testing.T) {
	node := func(name, ip string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelNode: "true"}}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = 7701
		return n
	}
	client := fake.NewSimpleClientset(node("host-a", "10.0.0.5"), node("rogue", "10.0.0.66"))
	reg := fakeRegistry{"host-a": "http://10.0.0.5:7701"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := watchNodes(ctx, client, reg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if why := w.down("host-a", now); why != "" {
		t.Errorf("registered node down: %s", why)
	}
	if why := w.down("rogue", now); !strings.Contains(why, "never registered") {
		t.Errorf("a labelled, unregistered node: down %q", why)
	}
	if u, err := w.endpoint("host-a"); err != nil || u.String() != "http://10.0.0.5:7701" {
		t.Errorf("endpoint of host-a %v, %v", u, err)
	}
	if u, err := w.endpoint("rogue"); err == nil {
		t.Errorf("endpoint of the rogue node: %v", u)
	}
	// The Node object moves its address: the store's still counts.
	reg["host-a"] = "http://10.0.0.7:7701"
	w.mu.Lock()
	w.read = time.Time{}
	w.mu.Unlock()
	if u, _ := w.endpoint("host-a"); u.String() != "http://10.0.0.7:7701" {
		t.Errorf("endpoint after the registry changed: %v", u)
	}
}
