package cluster

import (
	"context"
	"errors"
	"fmt"
	coordinationv1 "k8s.io/api/coordination/v1"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airlockhq/airlock/internal/kubetest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }

const ns = "default"

// fast are timings for tests: a leader that cannot renew stops within
// 1.5 s, another takes over 2 s after its last renewal.
func fast(cfg Config) Config {
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod, cfg.Resync =
		2*time.Second, 1500*time.Millisecond, 250*time.Millisecond, 300*time.Millisecond
	return cfg
}

// setup starts a control plane with deploy.Base applied, and a store on a
// fresh PostgreSQL database.
func setup(t *testing.T, users ...string) (*kubetest.ControlPlane, kubernetes.Interface, *store.Store) {
	t.Helper()
	pg := testenv.SharedPostgres(t)
	cp := kubetest.Start(t, users...)
	cp.ApplyBase(t)
	// No kube-controller-manager here to make the namespace's default
	// service account.
	cp.MustKubectl(t, "", "create", "serviceaccount", "default")
	st, err := store.OpenPostgres(context.Background(), pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return cp, clientFor(t, cp.RestConfig()), st
}

func clientFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func insertRow(t *testing.T, st *store.Store, id, state string, vcpus, memMiB int) {
	t.Helper()
	sb := store.Sandbox{ID: id, Owner: "key1", State: state, TemplateRef: "base:latest",
		TemplateDigest: "sha256:" + fmt.Sprintf("%064x", len(id)), VCPUs: vcpus, MemoryMiB: memMiB, DiskMiB: 1024}
	op := store.Operation{ID: "op" + id, Kind: "create", TargetID: id, Owner: "key1", Status: "pending"}
	if err := st.InsertSandbox(context.Background(), sb, op); err != nil {
		t.Fatal(err)
	}
}

func setState(t *testing.T, st *store.Store, id, state string) {
	t.Helper()
	sb, err := st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	sb.State = state
	if err := st.UpdateSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
}

// addNode registers an airlock node as `airlock node` will: in the store,
// and as a Node labelled, tainted for sandbox Pods only, with capacity.
// The not-ready taint the apiserver adds at create is dropped here,
// standing in for kube-controller-manager.
func addNode(t *testing.T, c kubernetes.Interface, st *store.Store, name, cpu, mem string) {
	t.Helper()
	ctx := context.Background()
	if st != nil {
		if err := st.RegisterClusterNode(ctx, name, "http://127.0.0.1:1"); err != nil {
			t.Fatal(err)
		}
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"), corev1.ResourcePods: resource.MustParse("110"),
	}
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"airlock.dev/node": "true", "type": "virtual-kubelet"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: "virtual-kubelet.io/provider", Value: "airlock", Effect: corev1.TaintEffectNoSchedule}}
	if n, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Status.Capacity, n.Status.Allocatable = capacity, capacity
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "Test", Message: "ready"}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func start(t *testing.T, cfg Config) (*Controller, context.CancelFunc) {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return c, stop
}

func getPod(c kubernetes.Interface, id string) (*corev1.Pod, error) {
	return c.CoreV1().Pods(ns).Get(context.Background(), id, metav1.GetOptions{})
}

// podBound waits for the Pod of id to be bound and returns its node.
func podBound(t *testing.T, c kubernetes.Interface, id string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testenv.Eventually(t, 20*time.Second, "pod of "+id+" bound", func() (bool, string) {
		p, err := getPod(c, id)
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return p.Spec.NodeName != "", fmt.Sprintf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	return pod
}

// TestControllerPlacesSandboxes: rows become Pods that kube-scheduler
// binds by requests and capacity across two airlock nodes; each bound
// node is recorded in its row; a Pod deleted behind the controller's back
// comes back on the node its sandbox is on; a row that says deleted or
// failed has no Pod; a Pod of a sandbox the store does not know is left
// alone and reported.
func TestControllerPlacesSandboxes(t *testing.T) {
	cp, c, st := setup(t)
	ctx := context.Background()
	addNode(t, c, st, "host-a", "2", "4Gi")
	addNode(t, c, st, "host-b", "12", "16Gi")
	cp.StartScheduler(t)

	insertRow(t, st, "sbxsmall", "running", 1, 512)
	insertRow(t, st, "sbxbig", "creating", 4, 4096)
	insertRow(t, st, "sbxgone", "deleted", 1, 512)
	insertRow(t, st, "sbxfailed", "failed", 1, 512)
	stranger := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stranger", Labels: map[string]string{LabelSandbox: "sbxstranger"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, stranger, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ctl, _ := start(t, fast(Config{Client: c, Store: st, Namespace: ns, Identity: "one", Registry: reg}))

	big := podBound(t, c, "sbxbig")
	if big.Spec.NodeName != "host-b" {
		t.Errorf("a 4-vCPU sandbox was bound to %s; only host-b has room for 4 CPUs and the overhead", big.Spec.NodeName)
	}
	if big.Spec.RuntimeClassName == nil || *big.Spec.RuntimeClassName != RuntimeClass || big.Spec.Overhead == nil ||
		*big.Spec.TerminationGracePeriodSeconds != 1 || big.Labels[LabelSandbox] != "sbxbig" {
		t.Errorf("pod spec: runtime class %v, overhead %v, grace %v, labels %v", big.Spec.RuntimeClassName,
			big.Spec.Overhead, big.Spec.TerminationGracePeriodSeconds, big.Labels)
	}
	if req := big.Spec.Containers[0].Resources.Requests; req.Cpu().Value() != 4 || req.Memory().Value() != 4<<30 {
		t.Errorf("pod requests %v, want 4 CPUs and 4Gi", req)
	}
	small := podBound(t, c, "sbxsmall")
	testenv.Eventually(t, 10*time.Second, "nodes recorded in the rows", func() (bool, string) {
		nodes, err := st.SandboxNodes(ctx)
		return err == nil && nodes["sbxbig"] == "host-b" && nodes["sbxsmall"] == small.Spec.NodeName && len(nodes) == 2,
			fmt.Sprint(nodes, err)
	})
	for _, id := range []string{"sbxgone", "sbxfailed"} {
		if _, err := getPod(c, id); !apierrors.IsNotFound(err) {
			t.Errorf("pod of a %s sandbox: %v, want none", id, err)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the stranger reported", func() (bool, string) {
		u := ctl.Unknown()
		return slices.Equal(u, []string{"sbxstranger"}), fmt.Sprint(u)
	})
	if _, err := getPod(c, "stranger"); err != nil {
		t.Errorf("the pod of an unknown sandbox was not left alone: %v", err)
	}

	// By capacity: another 4-vCPU sandbox fits only on host-b, and one of
	// 16 fits nowhere and stays pending, bound to no node.
	insertRow(t, st, "sbxbig2", "creating", 4, 1024)
	insertRow(t, st, "sbxhuge", "creating", 16, 1024)
	ctl.Poke()
	if p := podBound(t, c, "sbxbig2"); p.Spec.NodeName != "host-b" {
		t.Errorf("the second 4-vCPU sandbox was bound to %s", p.Spec.NodeName)
	}
	testenv.Eventually(t, 20*time.Second, "the 16-vCPU pod unschedulable", func() (bool, string) {
		p, err := getPod(c, "sbxhuge")
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return p.Spec.NodeName == "", cond.Message
			}
		}
		return false, fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})

	// A Pod removed behind the controller's back (forced, as a node that
	// confirmed it would) comes back on the sandbox's node.
	zero := int64(0)
	if err := c.CoreV1().Pods(ns).Delete(ctx, "sbxsmall", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the pod of sbxsmall made again", func() (bool, string) {
		p, err := getPod(c, "sbxsmall")
		if err != nil {
			return false, err.Error()
		}
		return p.UID != small.UID && p.Spec.NodeName == small.Spec.NodeName, fmt.Sprintf("uid %s node %q", p.UID, p.Spec.NodeName)
	})
	// Made bound: kube-scheduler, which records PodScheduled, had no say.
	if p, err := getPod(c, "sbxsmall"); err == nil {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled {
				t.Errorf("the pod made again went through the scheduler: %+v", cond)
			}
		}
	}

	// The row decides the end: deleted, the Pod is deleted (bound, it
	// waits for its node to confirm); failed, an unbound one is gone.
	setState(t, st, "sbxbig", "deleted")
	setState(t, st, "sbxhuge", "failed")
	ctl.Poke()
	testenv.Eventually(t, 10*time.Second, "the pods of ended sandboxes deleted", func() (bool, string) {
		p, err := getPod(c, "sbxbig")
		_, herr := getPod(c, "sbxhuge")
		return err == nil && p.DeletionTimestamp != nil && apierrors.IsNotFound(herr), fmt.Sprint(err, herr)
	})
	if p, err := getPod(c, "sbxbig2"); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the pod of a live sandbox: %v, %v", p, err)
	}

	// Five Pods made (sbxsmall twice), three bound nodes recorded, two
	// deleted, one stranger, and no pass failed.
	want := map[string]float64{"airlock_cluster_leading{}": 1, "airlock_cluster_unknown_pods{}": 1,
		"airlock_cluster_pod_changes_total{change=created}": 5, "airlock_cluster_pod_changes_total{change=bound}": 3,
		"airlock_cluster_pod_changes_total{change=deleted}": 2, "airlock_cluster_pass_failures_total{}": 0,
		"airlock_cluster_unreachable_nodes{}": 0}
	if got := testenv.Gather(t, reg); !maps.Equal(got, want) {
		t.Errorf("metrics %v, want %v", got, want)
	}
}

// cutLink is a controller's way to the apiserver, which the test cuts. It
// counts the requests cut off, and the requests on Leases that went
// through, so that the test sees the controller try.
type cutLink struct {
	cut          atomic.Bool
	refused      atomic.Int64
	leaseThrough atomic.Int64
}

// cutTransport fails every request while its link is cut: a controller
// whose apiserver is out of reach.
type cutTransport struct {
	rt   http.RoundTripper
	link *cutLink
}

func (c cutTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.link.cut.Load() {
		c.link.refused.Add(1)
		return nil, errors.New("cut off by the test")
	}
	resp, err := c.rt.RoundTrip(r)
	if err == nil && strings.Contains(r.URL.Path, "/leases/") {
		c.link.leaseThrough.Add(1)
	}
	return resp, err
}

func holder(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	l, err := c.CoordinationV1().Leases(ns).Get(context.Background(), DefaultLease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return fmt.Sprint(err)
	}
	return *l.Spec.HolderIdentity
}

// TestControllerFailover: a controller that starts with the apiserver out
// of reach leads once it is back; of two controllers one leads; cut off from the
// apiserver it stops, and the other takes over and carries on; one that
// leaves gives the Lease up at once; a controller started after rows
// changed while none ran makes the Pods they want and removes the ones
// they do not.
func TestControllerFailover(t *testing.T) {
	cp, c, st := setup(t)
	link := &cutLink{}
	cut := &link.cut
	cfgA := cp.RestConfig()
	cfgA.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return cutTransport{rt, link} }
	// a starts with the apiserver out of reach, and retries until it is
	// back.
	cut.Store(true)
	a, _ := start(t, fast(Config{Client: clientFor(t, cfgA), Store: st, Namespace: ns, Identity: "a"}))
	testenv.Eventually(t, 10*time.Second, "a trying the apiserver, out of reach", func() (bool, string) {
		n := link.refused.Load()
		return n >= 3, fmt.Sprintf("%d requests", n)
	})
	if a.Leading() {
		t.Fatal("a leads without reaching the apiserver")
	}
	cut.Store(false)
	testenv.Eventually(t, 10*time.Second, "a leading", func() (bool, string) { return a.Leading(), holder(t, c) })
	b, stopB := start(t, fast(Config{Client: c, Store: st, Namespace: ns, Identity: "b"}))

	insertRow(t, st, "sbxone", "creating", 1, 512)
	testenv.Eventually(t, 10*time.Second, "the pod of sbxone", func() (bool, string) {
		_, err := getPod(c, "sbxone")
		return err == nil, fmt.Sprint(err)
	})
	if b.Leading() || holder(t, c) != "a" {
		t.Fatalf("b leads (%v) or the lease is held by %q, with a leading", b.Leading(), holder(t, c))
	}

	cut.Store(true)
	testenv.Eventually(t, 10*time.Second, "b leading after a was cut off", func() (bool, string) {
		return b.Leading() && !a.Leading() && holder(t, c) == "b", fmt.Sprintf("a %v b %v holder %s", a.Leading(), b.Leading(), holder(t, c))
	})
	insertRow(t, st, "sbxtwo", "creating", 1, 512)
	testenv.Eventually(t, 10*time.Second, "the pod of sbxtwo, made by b", func() (bool, string) {
		_, err := getPod(c, "sbxtwo")
		return err == nil, fmt.Sprint(err)
	})
	// Back in reach, a reads the Lease again (twice, so that it has acted
	// on one answer at least), and finds b holding it.
	seen := link.leaseThrough.Load()
	cut.Store(false)
	testenv.Eventually(t, 10*time.Second, "a reading the Lease, back in reach", func() (bool, string) {
		n := link.leaseThrough.Load() - seen
		return n >= 2, fmt.Sprintf("%d requests on the Lease", n)
	})
	if a.Leading() || holder(t, c) != "b" {
		t.Errorf("back in reach, a took the lease from a live b: a %v, holder %s", a.Leading(), holder(t, c))
	}

	// b leaves and gives the lease up: a takes over without waiting for
	// it to expire. Then a is cut off again, and no controller runs.
	stopB()
	if h := holder(t, c); h != "" && h != "a" {
		t.Errorf("b left the lease held by %q, not given up", h)
	}
	testenv.Eventually(t, 5*time.Second, "a leading after b left", func() (bool, string) { return a.Leading(), holder(t, c) })
	cut.Store(true)
	testenv.Eventually(t, 5*time.Second, "a no longer leading", func() (bool, string) { return !a.Leading(), "" })

	// While none runs: sbxone ends, sbxthree is created.
	setState(t, st, "sbxone", "deleted")
	insertRow(t, st, "sbxthree", "creating", 1, 512)
	start(t, fast(Config{Client: c, Store: st, Namespace: ns, Identity: "c"}))
	testenv.Eventually(t, 15*time.Second, "c's first pass", func() (bool, string) {
		_, err1 := getPod(c, "sbxone")
		_, err3 := getPod(c, "sbxthree")
		return apierrors.IsNotFound(err1) && err3 == nil, fmt.Sprint(err1, err3)
	})
	if _, err := getPod(c, "sbxtwo"); err != nil {
		t.Errorf("the pod of a live sandbox after the restart: %v", err)
	}
}

// TestControllerRBAC: the controller does its work as the service account
// deploy/controller-rbac.yaml grants, and that account can do no more:
// no Secrets, nothing outside its namespace, no nodes.
func TestControllerRBAC(t *testing.T) {
	const sa = "system:serviceaccount:airlock:airlock-server"
	cp, admin, st := setup(t, sa)
	cp.MustKubectl(t, "", "create", "serviceaccount", "default", "-n", "airlock")
	c := clientFor(t, cp.ConfigAs(t, sa))
	ctx := context.Background()
	ctl, _ := start(t, fast(Config{Client: c, Store: st, Namespace: "airlock", Identity: "rbac"}))
	insertRow(t, st, "sbxrbac", "creating", 1, 512)
	testenv.Eventually(t, 10*time.Second, "the pod of sbxrbac in namespace airlock", func() (bool, string) {
		_, err := admin.CoreV1().Pods("airlock").Get(ctx, "sbxrbac", metav1.GetOptions{})
		return err == nil && ctl.Leading(), fmt.Sprint(err, " leading ", ctl.Leading())
	})
	setState(t, st, "sbxrbac", "deleted")
	ctl.Poke()
	testenv.Eventually(t, 10*time.Second, "the pod of sbxrbac deleted", func() (bool, string) {
		_, err := admin.CoreV1().Pods("airlock").Get(ctx, "sbxrbac", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})

	// The router finds the nodes through them, read only.
	if _, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list nodes as %s: %v", sa, err)
	}
	for what, err := range map[string]error{
		"list secrets": func() error { _, err := c.CoreV1().Secrets("airlock").List(ctx, metav1.ListOptions{}); return err }(),
		"list pods of default": func() error {
			_, err := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
			return err
		}(),
		"delete a node": func() error { return c.CoreV1().Nodes().Delete(ctx, "host-x", metav1.DeleteOptions{}) }(),
		"update a pod": func() error {
			_, err := c.CoreV1().Pods("airlock").Update(ctx, podFor(store.Sandbox{ID: "sbxx", VCPUs: 1, MemoryMiB: 1}, "airlock", ""), metav1.UpdateOptions{})
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as %s: %v, want forbidden", what, sa, err)
		}
	}
}

// TestNewRefusesBadConfig: New says what is wrong with a configuration
// the leader election could not run with.
func TestNewRefusesBadConfig(t *testing.T) {
	c := clientFor(t, &rest.Config{Host: "http://127.0.0.1:1"})
	st, err := store.Open(t.TempDir() + "/airlock.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ok := Config{Client: c, Store: st, Namespace: ns, Identity: "x"}
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"no client":    {Config{Store: st, Namespace: ns, Identity: "x"}, "a client and a store"},
		"no store":     {Config{Client: c, Namespace: ns, Identity: "x"}, "a client and a store"},
		"no namespace": {Config{Client: c, Store: st, Identity: "x"}, "a namespace and an identity"},
		"no identity":  {Config{Client: c, Store: st, Namespace: ns}, "a namespace and an identity"},
		"lease shorter than the renew deadline": {func() Config {
			cfg := ok
			cfg.LeaseDuration = 5 * time.Second
			return cfg
		}(), "the lease must outlast the renew deadline"},
		"renew deadline within a retry period": {func() Config {
			cfg := ok
			cfg.RetryPeriod = 9 * time.Second
			return cfg
		}(), "retry periods"},
		"negative resync": {func() Config {
			cfg := ok
			cfg.Resync = -time.Second
			return cfg
		}(), "resync must not be negative"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	if _, err := New(ok); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// TestControllerMarksDeadNodes: a Node whose Lease is not renewed within
// its duration is tainted unreachable, so that kube-scheduler places new
// sandboxes elsewhere, and untainted once it is renewed; a Node without a
// Lease is left alone; a Node with airlock's label whose agent never
// registered it in the store is tainted too.
func TestControllerMarksDeadNodes(t *testing.T) {
	_, c, st := setup(t)
	ctx := context.Background()
	addNode(t, c, st, "host-a", "2", "4Gi")
	addNode(t, c, st, "host-b", "2", "4Gi")
	addNode(t, c, nil, "host-c", "2", "4Gi")
	secs := int32(4)
	stale := metav1.NewMicroTime(time.Now().Add(-time.Minute))
	lease, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "host-a"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr("host-a"), LeaseDurationSeconds: &secs, RenewTime: &stale},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	start(t, fast(Config{Client: c, Store: st, Namespace: ns, Identity: "one", Registry: reg}))
	tainted := func(name string) bool {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool {
			return tn.Key == TaintUnreachable && tn.Effect == corev1.TaintEffectNoSchedule
		})
	}
	testenv.Eventually(t, 10*time.Second, "host-a and the unregistered host-c tainted, counted", func() (bool, string) {
		n := testenv.Gather(t, reg)["airlock_cluster_unreachable_nodes{}"]
		return tainted("host-a") && tainted("host-c") && n == 2, fmt.Sprint("unreachable nodes ", n)
	})
	if tainted("host-b") {
		t.Error("host-b, with no lease, was tainted")
	}

	// Renewed: back. The lease lasts a minute, so that a slow controller
	// still sees it fresh.
	fresh, minute := metav1.NewMicroTime(time.Now()), int32(60)
	lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds = &fresh, &minute
	if _, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "host-a untainted", func() (bool, string) { return !tainted("host-a"), "" })
}

func ptr[T any](v T) *T { return &v }
