package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/digest"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/kubetest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

const (
	clusterNS  = "airlock"
	nodeUser   = "system:serviceaccount:airlock:airlock-node"
	serverUser = "system:serviceaccount:airlock:airlock-server"
)

// testCluster is a control plane with kube-scheduler and deploy.Base applied,
// and a PostgreSQL store whose migrations and admin key a first server
// made (and stopped).
type testCluster struct {
	cp       *kubetest.ControlPlane
	kc       kubernetes.Interface
	storeURL string
	key      string // the admin key
	owner    string // its ID
	tpl      apiv1.Template
	token    string            // the internal token
	tls      string            // the cluster TLS: node and server under it
	asServer *http.Client      // calls a node as an API replica does
	keys     map[string][]byte // every server's and node's secrets key and E2B token key
}

func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	pg := testenv.SharedPostgres(t)
	cp := kubetest.Start(t, nodeUser, serverUser)
	cp.StartScheduler(t)
	cp.ApplyBase(t)
	// No kube-controller-manager here to make the namespace's default
	// service account, which Pod admission looks up.
	cp.MustKubectl(t, "", "-n", clusterNS, "create", "serviceaccount", "default")
	c := &testCluster{cp: cp, kc: kubernetes.NewForConfigOrDie(cp.RestConfig()), storeURL: pg.NewDatabase(t)}

	first := newServerEnv(t, []string{"AIRLOCK_STORE=" + c.storeURL})
	c.key = first.key
	var keys apiv1.List[apiv1.Key]
	first.must(t, 200, "GET", "/v1/keys", c.key, nil, &keys)
	first.must(t, 200, "GET", "/v1/templates/tiny", c.key, nil, &c.tpl)
	first.stop(syscall.SIGTERM)
	c.owner = keys.Items[0].ID
	tok := make([]byte, 32)
	rand.Read(tok)
	c.token = hex.EncodeToString(tok)
	c.keys = map[string][]byte{"secrets.key": make([]byte, 32), "e2b-token.key": make([]byte, 32)}
	for _, k := range c.keys {
		rand.Read(k)
	}
	c.tls = filepath.Join(t.TempDir(), "tls")
	if err := clustertls.Generate(c.tls, time.Hour); err != nil {
		t.Fatal(err)
	}
	c.asServer = c.clientAs(t, "server", clustertls.RoleNode)
	return c
}

// clientAs is an HTTP client with the certificate of the cluster TLS in
// sub (node or server) that calls peers of role over TLS.
func (c *testCluster) clientAs(t *testing.T, sub, role string) *http.Client {
	t.Helper()
	id, err := clustertls.Load(filepath.Join(c.tls, sub), map[string]string{"node": clustertls.RoleNode, "server": clustertls.RoleServer}[sub])
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: id.Transport(role)}
}

// node starts an `airlock node` of the cluster, as the node agent's
// service account.
func (c *testCluster) node(t *testing.T, name string, args ...string) *server {
	t.Helper()
	return c.startNode(t, name, args)
}

// bareNode starts an `airlock node` of the cluster whose data directory
// has no templates or snapshots of its own to start with.
func (c *testCluster) bareNode(t *testing.T, name string, args ...string) *server {
	t.Helper()
	return c.ownNode(t, name, nil, args...)
}

// ownNode starts an `airlock node` of the cluster whose data directory
// has templates and snapshots of its own: at first only the templates
// named, linked from the shared data directory. What it builds or
// fetches then is its own.
func (c *testCluster) ownNode(t *testing.T, name string, templates []string, args ...string) *server {
	t.Helper()
	own := func(home string) error {
		for _, d := range []string{"templates", "snapshots"} {
			if err := os.Remove(filepath.Join(home, d)); err != nil {
				return err
			}
			if err := os.Mkdir(filepath.Join(home, d), 0o755); err != nil {
				return err
			}
		}
		mine, shared := template.Open(datadir.Dir{Root: home}), template.Open(dataDir())
		for _, ref := range templates {
			if _, err := mine.Link(shared, ref); err != nil {
				return err
			}
		}
		return nil
	}
	return c.startNode(t, name, args, own)
}

func (c *testCluster) startNode(t *testing.T, name string, args []string, prepare ...func(home string) error) *server {
	t.Helper()
	n := c.launch(t, "node", append([]string{"--name", name, "--kubeconfig", c.cp.KubeconfigAs(t, nodeUser),
		"--lease-duration", "4s", "--cluster-tls", filepath.Join(c.tls, "node")}, args...), prepare...)
	n.header = http.Header{api.NodeTokenHeader: {c.token}}
	n.url, n.client = "https://"+n.addr, c.asServer
	return n
}

// replica starts an `airlock serve --cluster kubernetes` of the cluster,
// as the servers' service account.
func (c *testCluster) replica(t *testing.T, args ...string) *server {
	t.Helper()
	internal, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	r := c.launch(t, "", append([]string{"--cluster", "kubernetes", "--kubeconfig", c.cp.KubeconfigAs(t, serverUser),
		"--cluster-tls", filepath.Join(c.tls, "server"), "--internal-listen", internal}, args...))
	r.internal = "https://" + internal
	return r
}

// launch runs an airlock command of the cluster (command "" for serve)
// on a data directory of its own, with the store, the internal token and
// the cluster's keys, until the test ends. prepare, if given, changes the
// data directory first.
func (c *testCluster) launch(t *testing.T, command string, args []string, prepare ...func(home string) error) *server {
	t.Helper()
	home, err := newHome()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prepare {
		if err := p(home); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(home, "node.token")
	if err := os.WriteFile(tokenFile, []byte(c.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, k := range c.keys {
		if err := os.WriteFile(filepath.Join(home, name), k, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &server{home: home, addr: addr, url: "http://" + addr, key: c.key, command: command,
		args: append([]string{"--store", c.storeURL, "--namespace", clusterNS, "--token-file", tokenFile}, args...)}
	serversMu.Lock()
	allServers = append(allServers, s)
	serversMu.Unlock()
	t.Cleanup(s.cleanup)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("airlock %s %v's output:\n%s", command, args, s.output())
		}
	})
	if err := s.start(); err != nil {
		t.Fatalf("start airlock %s: %v", command, err)
	}
	return s
}

// TestClusterNode: `airlock node` registers its host as a Node that only
// sandbox Pods tolerate, with the capacity it was given, and keeps its
// Lease; a sandbox row admitted in the cluster's PostgreSQL store becomes a
// Pod (the controller), kube-scheduler binds it to the node, and the node
// makes its VM, whose commands then run through the node's internal API.
// That API refuses a request without the cluster's token or with another,
// answers only for its own sandboxes and admits no creates. A Pod whose
// sandbox the store lacks is refused, reported and never made. A Pod
// deleted while its sandbox runs leaves the VM, and the Pod comes back on
// the same node; a node killed and started again adopts its VM; the row's
// delete removes the VM, then the Pod.
func TestClusterNode(t *testing.T) {
	tc := newTestCluster(t)
	cp, kc, storeURL, key, owner, tpl := tc.cp, tc.kc, tc.storeURL, tc.key, tc.owner, tc.tpl
	ctx := context.Background()
	n := tc.node(t, "node-a", "--cpus", "3", "--max-sandboxes", "4")
	t.Cleanup(func() {
		if t.Failed() {
			pods, _ := cp.Kubectl("", "get", "pods", "-A", "-o", "wide")
			t.Logf("pods:\n%s\nkube-scheduler:\n%s", pods, cp.Log("kube-scheduler"))
		}
	})

	// The Node, as the node agent registered it.
	var node *corev1.Node
	testenv.Eventually(t, 30*time.Second, "node-a registered and schedulable", func() (bool, string) {
		got, err := kc.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		node = got
		keys := []string{}
		for _, tn := range got.Spec.Taints {
			keys = append(keys, tn.Key+"="+tn.Value+":"+string(tn.Effect))
		}
		return slices.Equal(keys, []string{"virtual-kubelet.io/provider=airlock:NoSchedule"}), fmt.Sprintf("taints %v", keys)
	})
	if got := node.Status.Capacity[corev1.ResourceCPU]; got.String() != "3" {
		t.Errorf("capacity cpu %s, want 3", got.String())
	}
	if got := node.Status.Capacity[corev1.ResourcePods]; got.String() != "4" {
		t.Errorf("capacity pods %s, want 4", got.String())
	}
	if node.Labels["airlock.dev/node"] != "true" || len(node.Status.Addresses) != 1 || node.Status.Addresses[0].Address != "127.0.0.1" {
		t.Errorf("labels %v, addresses %v", node.Labels, node.Status.Addresses)
	}
	if _, err := kc.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("the node's lease: %v", err)
	}

	st, err := store.OpenPostgres(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var ctrlLog safeBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller:\n%s", ctrlLog.String())
		}
	})
	ctrl, err := cluster.New(cluster.Config{Client: kc, Store: st, Namespace: clusterNS, Identity: "e2e",
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond, Resync: time.Second,
		Log: slog.New(slog.NewTextHandler(&ctrlLog, nil))})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopCtrl := context.WithCancel(ctx)
	ctrlDone := make(chan struct{})
	go func() { ctrl.Run(cctx); close(ctrlDone) }()
	t.Cleanup(func() { stopCtrl(); <-ctrlDone })

	// A sandbox admitted as an API replica admits one: its row and its
	// pending create, and nothing else.
	now := time.Now().UTC().Truncate(time.Millisecond)
	sb := store.Sandbox{ID: ids.New("sbx"), Owner: owner, State: apiv1.StateCreating,
		TemplateRef: tpl.Name + ":" + tpl.Tag, TemplateDigest: tpl.Digest,
		VCPUs: tpl.VCPUs, MemoryMiB: tpl.MemoryMiB, DiskMiB: tpl.DiskMiB, OnTimeout: "delete",
		CreatedAt: now, UpdatedAt: now}
	op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner, Status: apiv1.OpPending, CreatedAt: now}
	if err := st.InsertSandbox(ctx, sb, op); err != nil {
		t.Fatal(err)
	}
	ctrl.Poke()
	done := waitStoreOp(t, st, op.ID)
	if done.Status != apiv1.OpSucceeded {
		t.Fatalf("create on the node: %+v\nnode:\n%s", done.Error, n.output())
	}
	if on, err := st.SandboxNode(ctx, sb.ID); err != nil || on != "node-a" {
		t.Fatalf("the sandbox's node: %q, %v", on, err)
	}
	if out := n.run(t, key, sb.ID, apiv1.CommandRequest{Cmd: "echo on node-a; echo kept > /tmp/mark"}); out.stdout != "on node-a\n" || out.exit.ExitCode != 0 {
		t.Fatalf("exec on the node: %+v", out)
	}
	podRunning(t, kc, sb.ID, "")

	t.Run("internal token", func(t *testing.T) {
		for _, c := range []struct{ name, token, says string }{
			{"none", "", "send the cluster's internal token"},
			{"wrong", strings.Repeat("0", 64), "is not this node's"},
		} {
			hdr := http.Header{"Authorization": {"Bearer " + key}}
			if c.token != "" {
				hdr.Set(api.NodeTokenHeader, c.token)
			}
			status, b, err := tlsGet(tc.asServer, n.url+"/v1/sandboxes/"+sb.ID, hdr)
			if err != nil || status != 401 || !strings.Contains(b, c.says) {
				t.Errorf("%s token: status %d, %s, %v; want 401 saying %q", c.name, status, b, err, c.says)
			}
		}
		// The token is not a key: with it and no key, nothing is answered.
		if status, b := n.call(t, "GET", "/v1/sandboxes/"+sb.ID, "", nil); status != 401 {
			t.Errorf("token without a key: %d %s", status, b)
		}
	})

	// The internal API is TLS with the cluster CA: with the token and an
	// admin key, but without a server's certificate, nothing is answered.
	t.Run("cluster TLS", func(t *testing.T) {
		full := http.Header{"Authorization": {"Bearer " + key}, api.NodeTokenHeader: {tc.token}}
		if status, b, err := tlsGet(tc.asServer, n.url+"/v1/sandboxes/"+sb.ID, full); err != nil || status != 200 {
			t.Fatalf("as a server: %d %s %v", status, b, err)
		}
		tc.refusesStrangers(t, n.addr, clustertls.RoleNode, "/v1/sandboxes/"+sb.ID, full)
		// Another node's certificate: template images only.
		asNode := tc.clientAs(t, "node", clustertls.RoleNode)
		if status, b, err := tlsGet(asNode, n.url+"/v1/sandboxes/"+sb.ID, full); err != nil || status != 403 || !strings.Contains(b, "template images only") {
			t.Errorf("a node's certificate asking for a sandbox: %d %s %v; want 403", status, b, err)
		}
		if status, b, err := tlsGet(asNode, n.url+cluster.TemplatesPath+tpl.Digest, http.Header{api.NodeTokenHeader: {tc.token}}); err != nil || status != 200 {
			t.Errorf("a node's certificate asking for a template image: %d %s %v; want 200", status, b, err)
		}
	})

	// Another node's sandbox, with an operation in flight there and a
	// lease that has ended: node-a leaves it to node-b.
	other := sb
	other.ID, other.State = ids.New("sbx"), apiv1.StateRunning
	ended := now.Add(-time.Minute)
	other.TimeoutS, other.ExpiresAt = 60, &ended
	otherOp := store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: other.ID, Owner: owner,
		Status: apiv1.OpSucceeded, CreatedAt: now, FinishedAt: &now}
	if err := st.InsertSandbox(ctx, other, otherOp); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSandboxNode(ctx, other.ID, "node-b"); err != nil {
		t.Fatal(err)
	}
	pause := store.Operation{ID: ids.New("op"), Kind: apiv1.OpPause, TargetID: other.ID, Owner: owner, Status: apiv1.OpRunning, CreatedAt: now}
	if err := st.BeginOperation(ctx, other, pause, apiv1.StateRunning); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		other.State = apiv1.StateDeleted
		st.UpdateSandbox(ctx, other)
	})

	t.Run("only its own sandboxes", func(t *testing.T) {
		if status, b := n.call(t, "POST", "/v1/sandboxes/"+other.ID+"/exec", key, apiv1.CommandRequest{Cmd: "true"}); status != 404 || !strings.Contains(string(b), "not on node node-a") {
			t.Errorf("exec in node-b's sandbox through node-a: %d %s", status, b)
		}
		if status, b := n.call(t, "POST", "/v1/sandboxes", key, apiv1.CreateSandbox{Template: "tiny"}); status != 403 || !strings.Contains(string(b), "through the cluster's API") {
			t.Errorf("a create on a node: %d %s", status, b)
		}
	})

	t.Run("unknown pod", func(t *testing.T) {
		id := ids.New("sbx")
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: clusterNS, Labels: map[string]string{cluster.LabelSandbox: id}},
			Spec: corev1.PodSpec{NodeName: "node-a", RestartPolicy: corev1.RestartPolicyNever,
				Tolerations: []corev1.Toleration{{Key: "virtual-kubelet.io/provider", Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: "sandbox", Image: "airlock.dev/stranger"}}},
		}
		if _, err := kc.CoreV1().Pods(clusterNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the stranger's pod refused", func() (bool, string) {
			p, err := kc.CoreV1().Pods(clusterNS).Get(ctx, id, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return p.Status.Reason == "ProviderFailed" && strings.Contains(p.Status.Message, "airlock has no sandbox "+id),
				fmt.Sprintf("phase %s, reason %q, message %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
		})
		if _, err := os.Stat(filepath.Join(n.home, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("the stranger got a sandbox directory: %v", err)
		}
		if _, err := st.GetSandbox(ctx, id); err == nil {
			t.Error("the stranger got a row")
		}
		_, b := n.call(t, "GET", "/metrics", key, nil)
		if !strings.Contains(string(b), `airlock_node_refused_pods_total{reason="unknown"}`) {
			t.Errorf("/metrics does not count the refused pod")
		}
		// Left alone: the controller and the node delete nothing of it.
		if _, err := kc.CoreV1().Pods(clusterNS).Get(ctx, id, metav1.GetOptions{}); err != nil {
			t.Errorf("the stranger's pod: %v", err)
		}
	})

	t.Run("pod deleted while the sandbox runs", func(t *testing.T) {
		old, err := kc.CoreV1().Pods(clusterNS).Get(ctx, sb.ID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		zero := int64(0)
		if err := kc.CoreV1().Pods(clusterNS).Delete(ctx, sb.ID, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		podRunning(t, kc, sb.ID, old.UID)
		if out := n.run(t, key, sb.ID, apiv1.CommandRequest{Cmd: "cat /tmp/mark"}); out.stdout != "kept\n" {
			t.Fatalf("the VM after its pod was deleted: %+v", out)
		}
	})

	t.Run("node restart", func(t *testing.T) {
		n.stop(syscall.SIGKILL)
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		if out := n.run(t, key, sb.ID, apiv1.CommandRequest{Cmd: "cat /tmp/mark"}); out.stdout != "kept\n" {
			t.Fatalf("the VM after the node restarted: %+v\nnode:\n%s", out, n.output())
		}
		// Recovery left node-b's sandbox and its operation alone.
		if got, err := st.GetSandbox(ctx, other.ID); err != nil || got.State != apiv1.StateRunning {
			t.Errorf("node-b's sandbox after node-a restarted: %s, %v", got.State, err)
		}
		if got, err := st.GetOperation(ctx, pause.ID); err != nil || got.Status != apiv1.OpRunning {
			t.Errorf("node-b's operation after node-a restarted: %s, %v", got.Status, err)
		}
	})

	t.Run("lease ends on the node", func(t *testing.T) {
		short := sb
		short.ID, short.TimeoutS = ids.New("sbx"), 8
		exp := time.Now().Add(8 * time.Second)
		short.ExpiresAt = &exp
		op := store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: short.ID, Owner: owner, Status: apiv1.OpPending, CreatedAt: now}
		if err := st.InsertSandbox(ctx, short, op); err != nil {
			t.Fatal(err)
		}
		ctrl.Poke()
		if done := waitStoreOp(t, st, op.ID); done.Status != apiv1.OpSucceeded {
			t.Fatalf("create: %+v", done.Error)
		}
		testenv.Eventually(t, 60*time.Second, "the sandbox deleted when its lease ended", func() (bool, string) {
			got, err := st.GetSandbox(ctx, short.ID)
			return err == nil && got.State == apiv1.StateDeleted, fmt.Sprintf("%s, %v", got.State, err)
		})
		if _, err := os.Stat(filepath.Join(n.home, "sandboxes", short.ID)); !os.IsNotExist(err) {
			t.Errorf("the expired sandbox's directory: %v", err)
		}
	})

	// The delete goes through the node that runs the sandbox; the Pod
	// goes after the row says deleted.
	n.deleteSandbox(t, key, sb.ID)
	testenv.Eventually(t, 30*time.Second, "the deleted sandbox's pod gone", func() (bool, string) {
		p, err := kc.CoreV1().Pods(clusterNS).Get(ctx, sb.ID, metav1.GetOptions{})
		if err != nil {
			return strings.Contains(err.Error(), "not found"), err.Error()
		}
		return false, fmt.Sprintf("phase %s, deletion %v", p.Status.Phase, p.DeletionTimestamp)
	})
}

// waitStoreOp polls an operation's row until it is done.
func waitStoreOp(t *testing.T, st *store.Store, id string) store.Operation {
	t.Helper()
	var op store.Operation
	testenv.Eventually(t, 3*time.Minute, "operation "+id+" done", func() (bool, string) {
		var err error
		op, err = st.GetOperation(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		return op.Status == apiv1.OpSucceeded || op.Status == apiv1.OpFailed, op.Status
	})
	return op
}

// podRunning waits for the sandbox's Pod, other than the one with UID
// old, to be bound to node-a and running with the node's address.
func podRunning(t *testing.T, kc kubernetes.Interface, id string, old types.UID) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "pod of "+id+" running on node-a", func() (bool, string) {
		p, err := kc.CoreV1().Pods(clusterNS).Get(context.Background(), id, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if old != "" && p.UID == old {
			return false, "still the old pod"
		}
		return p.Spec.NodeName == "node-a" && p.Status.Phase == corev1.PodRunning && p.Status.PodIP == "127.0.0.1",
			fmt.Sprintf("node %q, phase %s, ip %q, reason %q, message %q", p.Spec.NodeName, p.Status.Phase, p.Status.PodIP, p.Status.Reason, p.Status.Message)
	})
}

// TestClusterReplicas: two API replicas (`airlock serve --cluster
// kubernetes`, as the airlock-server service account) and two nodes on
// one store. A create through either replica is placed by kube-scheduler
// on a node and made there; exec, command streams, files and suspend and
// wake through either replica reach the sandbox's node; a replica killed
// mid-stream costs the client a reconnect to the other with Last-Event-ID,
// and nothing of the output is lost or repeated; deletes through a
// replica remove the VMs and the Pods.
func TestClusterReplicas(t *testing.T) {
	tc := newTestCluster(t)
	ctx := context.Background()
	nodes := map[string]*server{
		"node-a": tc.node(t, "node-a", "--cpus", "3"),
		"node-b": tc.node(t, "node-b", "--cpus", "3"),
	}
	a, b := tc.replica(t), tc.replica(t)
	t.Cleanup(func() {
		if t.Failed() {
			pods, _ := tc.cp.Kubectl("", "get", "pods", "-A", "-o", "wide")
			t.Logf("pods:\n%s", pods)
		}
	})
	for _, r := range []*server{a, b} {
		if !strings.Contains(r.output(), "store postgres, cluster kubernetes)") {
			t.Fatalf("a replica does not say it is one:\n%s", r.output())
		}
	}

	// Each node offers 3 CPUs, and a sandbox asks for one and the VMM's
	// tenth: the second lands on the emptier node, the other one.
	on := map[string]string{}
	var sbxs []string
	for i, r := range []*server{a, b} {
		var res apiv1.SandboxOperation
		r.must(t, 202, "POST", "/v1/sandboxes", tc.key, apiv1.CreateSandbox{Template: "tiny", VCPUs: 1}, &res)
		other := []*server{b, a}[i]
		if op := other.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("create through a replica: %+v", op.Error)
		}
		node, err := testStore(t, tc.storeURL).SandboxNode(ctx, res.Sandbox.ID)
		if err != nil {
			t.Fatal(err)
		}
		on[res.Sandbox.ID] = node
		sbxs = append(sbxs, res.Sandbox.ID)
		var sb apiv1.Sandbox
		other.must(t, 200, "GET", "/v1/sandboxes/"+res.Sandbox.ID, tc.key, nil, &sb)
		if sb.State != apiv1.StateRunning {
			t.Fatalf("sandbox %s is %s", sb.ID, sb.State)
		}
	}
	if on[sbxs[0]] == on[sbxs[1]] || nodes[on[sbxs[0]]] == nil || nodes[on[sbxs[1]]] == nil {
		t.Fatalf("placement %v: want one sandbox on each node", on)
	}

	for _, id := range sbxs {
		for _, r := range []*server{a, b} {
			if out := r.run(t, tc.key, id, apiv1.CommandRequest{Cmd: "hostname >/dev/null; echo through"}); out.stdout != "through\n" || out.exit.ExitCode != 0 {
				t.Fatalf("exec in %s through a replica: %+v", id, out)
			}
		}
		// Files go through too, and the file is in that node's VM.
		a.must(t, 204, "PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/f", tc.key, "on "+on[id], nil)
		if status, body := b.call(t, "GET", "/v1/sandboxes/"+id+"/files?path=/tmp/f", tc.key, nil); status != 200 || string(body) != "on "+on[id] {
			t.Fatalf("read back through the other replica: %d %q", status, body)
		}
	}

	t.Run("replica killed mid-stream", func(t *testing.T) {
		id := sbxs[0]
		var sess apiv1.CommandSession
		a.must(t, 201, "POST", "/v1/sandboxes/"+id+"/commands", tc.key,
			apiv1.CommandRequest{Cmd: "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.5; done"}, &sess)
		resp, r := a.attach(t, sess.ID, tc.key, 0)
		got, last := readUntil(t, r, lines(2))
		a.stop(syscall.SIGKILL)
		resp.Body.Close()
		resp2, r2 := b.attach(t, sess.ID, sess.Attach.Token, last)
		defer resp2.Body.Close()
		rest := readToExit(t, r2)
		if got+rest.stdout != "line1\nline2\nline3\nline4\nline5\nline6\n" || rest.exit.ExitCode != 0 {
			t.Fatalf("before the kill %q, after through the other replica %q (exit %+v)", got, rest.stdout, rest.exit)
		}
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("suspend and wake through the replicas", func(t *testing.T) {
		id := sbxs[1]
		a.lifecycle(t, id, "suspend")
		if sb := b.state(t, id); sb.State != apiv1.StateSuspended {
			t.Fatalf("after suspend: %s", sb.State)
		}
		b.lifecycle(t, id, "wake")
		if out := a.run(t, tc.key, id, apiv1.CommandRequest{Cmd: "cat /tmp/f"}); out.stdout != "on "+on[id] {
			t.Fatalf("after wake: %+v", out)
		}
		if node, _ := testStore(t, tc.storeURL).SandboxNode(ctx, id); node != on[id] {
			t.Errorf("woken on %s, was on %s", node, on[id])
		}
	})

	t.Run("a node that died", func(t *testing.T) {
		var seen time.Duration
		id := sbxs[1]
		dead := on[id]
		n := nodes[dead]
		n.stop(syscall.SIGKILL)
		killed := time.Now()
		// Within its lease (4 s) and the controller's check, the replicas
		// say why, and the controller taints its Node.
		defer func() { t.Logf("%s's death was seen after %s", dead, seen.Round(100*time.Millisecond)) }()
		testenv.Eventually(t, 20*time.Second, "the sandbox reported unavailable", func() (bool, string) {
			seen = time.Since(killed)
			var sb apiv1.Sandbox
			b.must(t, 200, "GET", "/v1/sandboxes/"+id, tc.key, nil, &sb)
			return sb.Unavailable != nil && sb.Unavailable.Code == apiv1.CodeUnavailable &&
				strings.Contains(sb.Unavailable.Message, "node "+dead+" has not renewed its lease"), fmt.Sprintf("%+v", sb.Unavailable)
		})
		var list apiv1.List[apiv1.Sandbox]
		a.must(t, 200, "GET", "/v1/sandboxes", tc.key, nil, &list)
		for _, sb := range list.Items {
			if (sb.ID == id) != (sb.Unavailable != nil) {
				t.Errorf("listed %s (on %s): unavailable %+v", sb.ID, on[sb.ID], sb.Unavailable)
			}
		}
		status, body := a.call(t, "POST", "/v1/sandboxes/"+id+"/exec", tc.key, apiv1.CommandRequest{Cmd: "true"})
		if status != 503 || !strings.Contains(string(body), "node "+dead+" has not renewed its lease") {
			t.Errorf("exec while its node is down: %d %s", status, body)
		}
		// The leader taints it; if the replica killed above led, the other
		// takes over once that Lease expires (15 s).
		testenv.Eventually(t, 30*time.Second, "the dead node tainted", func() (bool, string) {
			node, err := tc.kc.CoreV1().Nodes().Get(ctx, dead, metav1.GetOptions{})
			return err == nil && slices.ContainsFunc(node.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == cluster.TaintUnreachable }),
				fmt.Sprintf("%v %v", err, node.Spec.Taints)
		})
		// A create goes to the node that is up.
		var res apiv1.SandboxOperation
		a.must(t, 202, "POST", "/v1/sandboxes", tc.key, apiv1.CreateSandbox{Template: "tiny", VCPUs: 1}, &res)
		if op := b.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("create while %s is down: %+v", dead, op.Error)
		}
		if node, _ := testStore(t, tc.storeURL).SandboxNode(ctx, res.Sandbox.ID); node != on[sbxs[0]] {
			t.Errorf("a create while %s is down went to %q", dead, node)
		}
		var del apiv1.SandboxOperation
		b.must(t, 202, "DELETE", "/v1/sandboxes/"+res.Sandbox.ID, tc.key, nil, &del)
		if op := a.waitOp(t, tc.key, del.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("delete: %+v", op.Error)
		}

		// Back with its VM: available once it renews its lease, untainted.
		if err := n.start(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "the node back and untainted", func() (bool, string) {
			var sb apiv1.Sandbox
			b.must(t, 200, "GET", "/v1/sandboxes/"+id, tc.key, nil, &sb)
			node, err := tc.kc.CoreV1().Nodes().Get(ctx, dead, metav1.GetOptions{})
			tainted := err != nil || slices.ContainsFunc(node.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == cluster.TaintUnreachable })
			return sb.Unavailable == nil && !tainted, fmt.Sprintf("unavailable %+v, tainted %v", sb.Unavailable, tainted)
		})
		if out := b.run(t, tc.key, id, apiv1.CommandRequest{Cmd: "cat /tmp/f"}); out.stdout != "on "+dead {
			t.Fatalf("after the node came back: %+v", out)
		}
	})

	t.Run("a sandbox no node can take", func(t *testing.T) {
		// Both nodes have 1.9 CPUs left.
		var res apiv1.SandboxOperation
		a.must(t, 202, "POST", "/v1/sandboxes", tc.key, apiv1.CreateSandbox{Template: "tiny", VCPUs: 2}, &res)
		testenv.Eventually(t, 30*time.Second, "the pod unschedulable", func() (bool, string) {
			p, err := tc.kc.CoreV1().Pods(clusterNS).Get(ctx, res.Sandbox.ID, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", p.Status.Conditions)
		})
		var sb apiv1.Sandbox
		b.must(t, 200, "GET", "/v1/sandboxes/"+res.Sandbox.ID, tc.key, nil, &sb)
		if sb.State != apiv1.StateCreating {
			t.Errorf("an unplaced sandbox is %s", sb.State)
		}
		// It says why it waits, as kube-scheduler put it.
		if sb.Unavailable == nil || sb.Unavailable.Code != apiv1.CodeResourceExhausted ||
			!strings.Contains(sb.Unavailable.Message, "no node can take this sandbox yet") || !strings.Contains(sb.Unavailable.Message, "Insufficient cpu") {
			t.Errorf("an unplaced sandbox's unavailable: %+v", sb.Unavailable)
		}
		var list apiv1.List[apiv1.Sandbox]
		a.must(t, 200, "GET", "/v1/sandboxes", tc.key, nil, &list)
		for _, it := range list.Items {
			if it.ID == res.Sandbox.ID && (it.Unavailable == nil || !strings.Contains(it.Unavailable.Message, "Insufficient cpu")) {
				t.Errorf("the list's unplaced sandbox: %+v", it.Unavailable)
			}
		}
		// Its delete is the replica's own: no node has it.
		var del apiv1.SandboxOperation
		b.must(t, 202, "DELETE", "/v1/sandboxes/"+res.Sandbox.ID, tc.key, nil, &del)
		if op := a.waitOp(t, tc.key, del.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("delete of an unplaced sandbox: %+v", op.Error)
		}
		if op := a.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpFailed {
			t.Errorf("its create: %s, want failed", op.Status)
		}
		testenv.Eventually(t, 30*time.Second, "the unplaced sandbox's pod gone", func() (bool, string) {
			_, err := tc.kc.CoreV1().Pods(clusterNS).Get(ctx, res.Sandbox.ID, metav1.GetOptions{})
			return err != nil && strings.Contains(err.Error(), "not found"), fmt.Sprint(err)
		})
	})

	t.Run("bad input through a replica", func(t *testing.T) {
		if status, b := a.call(t, "POST", "/v1/sandboxes/"+ids.New("sbx")+"/exec", tc.key, apiv1.CommandRequest{Cmd: "true"}); status != 404 {
			t.Errorf("exec in an unknown sandbox: %d %s", status, b)
		}
		if status, b := a.call(t, "GET", "/v1/commands/"+ids.New("cmd"), tc.key, nil); status != 404 {
			t.Errorf("an unknown command: %d %s", status, b)
		}
		if status, b := a.call(t, "POST", "/v1/sandboxes/"+sbxs[0]+"/exec", "", apiv1.CommandRequest{Cmd: "true"}); status != 401 {
			t.Errorf("exec without a key: %d %s", status, b)
		}
	})

	for _, id := range sbxs {
		var res apiv1.SandboxOperation
		b.must(t, 202, "DELETE", "/v1/sandboxes/"+id, tc.key, nil, &res)
		if op := a.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("delete through a replica: %+v", op.Error)
		}
		if _, err := os.Stat(filepath.Join(nodes[on[id]].home, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("the deleted sandbox's directory on %s: %v", on[id], err)
		}
		testenv.Eventually(t, 30*time.Second, "the deleted sandbox's pod gone", func() (bool, string) {
			_, err := tc.kc.CoreV1().Pods(clusterNS).Get(ctx, id, metav1.GetOptions{})
			return err != nil && strings.Contains(err.Error(), "not found"), fmt.Sprint(err)
		})
	}
}

// testStore opens the cluster's store for the test.
func testStore(t *testing.T, url string) *store.Store {
	t.Helper()
	st, err := store.OpenPostgres(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestClusterTemplates: a node that lacks the template a sandbox was
// admitted with fetches its image by digest, checks it and keeps it: the
// first node, with no other to ask, from the API replica; the second
// from the first. Each then makes the sandbox from its own copy.
func TestClusterTemplates(t *testing.T) {
	tc := newTestCluster(t)
	ctx := context.Background()
	r := tc.replica(t)
	st := testStore(t, tc.storeURL)

	create := func(t *testing.T, want string) string {
		t.Helper()
		var res apiv1.SandboxOperation
		r.must(t, 202, "POST", "/v1/sandboxes", tc.key, apiv1.CreateSandbox{Template: "tiny"}, &res)
		if op := r.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("create on a node without the template: %+v", op.Error)
		}
		if node, err := st.SandboxNode(ctx, res.Sandbox.ID); err != nil || node != want {
			t.Fatalf("sandbox on %q (%v), want %s", node, err, want)
		}
		if out := r.run(t, tc.key, res.Sandbox.ID, apiv1.CommandRequest{Cmd: "echo made"}); out.stdout != "made\n" {
			t.Fatalf("exec: %+v", out)
		}
		return res.Sandbox.ID
	}
	// fetched checks that the node keeps its own copy of the image, whole.
	fetched := func(t *testing.T, n *server, from string) {
		t.Helper()
		hex := strings.TrimPrefix(tc.tpl.Digest, "sha256:")
		img := filepath.Join(n.home, "templates", "sha256-"+hex+".ext4")
		fi, err := os.Lstat(img)
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("the node's copy %s: %v %v", img, fi, err)
		}
		sum, _, err := digest.File(ctx, img)
		if err != nil || sum != hex {
			t.Fatalf("the node's copy hashes to %s (%v), want %s", sum, err, hex)
		}
		status, body := n.call(t, "GET", "/metrics", tc.key, nil)
		want := `airlock_node_template_fetches_total{from="` + from + `",result="fetched"} 1`
		if status != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("the node's metrics (%d) lack %s:\n%s", status, want, grepLines(string(body), "template_fetch"))
		}
	}

	b := tc.bareNode(t, "node-b", "--templates-from", r.internal)
	create(t, "node-b")
	fetched(t, b, "server")

	// The replica serves images on its internal listener only, to the
	// cluster's members only.
	t.Run("internal listener", func(t *testing.T) {
		path := cluster.TemplatesPath + tc.tpl.Digest
		tokenOnly := http.Header{api.NodeTokenHeader: {tc.token}}
		if status, body := r.call(t, "GET", path, "", nil, api.NodeTokenHeader, tc.token); status == 200 {
			t.Errorf("the public listener served a template image: %.200s", body)
		}
		asNode := tc.clientAs(t, "node", clustertls.RoleServer)
		if status, body, err := tlsGet(asNode, r.internal+path, tokenOnly); err != nil || status != 200 || !strings.Contains(body, tc.tpl.Digest) {
			t.Errorf("a node's certificate: %d %.200s %v; want the image's description", status, body, err)
		}
		if status, body, err := tlsGet(asNode, r.internal+path, nil); err != nil || status != 401 {
			t.Errorf("a node's certificate without the token: %d %.200s %v; want 401", status, body, err)
		}
		tc.refusesStrangers(t, strings.TrimPrefix(r.internal, "https://"), clustertls.RoleServer, path, tokenOnly)
	})

	// With node-b cordoned, the next create goes to node-c, which asks
	// node-b first.
	c := tc.bareNode(t, "node-c")
	tc.cp.MustKubectl(t, "", "cordon", "node-b")
	create(t, "node-c")
	fetched(t, c, "node")
}

// TestClusterBuilds: a template build sent to an API replica runs on a
// node, and its result goes into the cluster's catalogue, not into any
// data directory: the other replica shows it and its build log (read on
// the node that ran the build); a sandbox made from it on the other node
// runs from the image that node fetched from the first; a save of that
// sandbox runs on its node and is published alike; a build context stays
// on the node it was uploaded to, and the build that reads it runs there;
// a delete through a replica removes the tag for the whole cluster. What
// cluster mode does not do (replacing or deleting a provisioned
// template) it refuses with the reason, and records nothing.
func TestClusterBuilds(t *testing.T) {
	tc := newTestCluster(t)
	ctx := context.Background()
	st := testStore(t, tc.storeURL)
	a := tc.ownNode(t, "node-a", []string{"tiny"}, "--reclaim-interval", "1s", "--cpus", "8")
	b := tc.ownNode(t, "node-b", []string{"tiny"}, "--reclaim-interval", "1s", "--cpus", "8")
	r1, r2 := tc.replica(t), tc.replica(t)
	nodeOf := map[string]*server{"node-a": a, "node-b": b}
	rogueHits := rogueNode(t, tc, "aaa-rogue")

	// A replica sends a build to a node once it has seen one come up.
	req := apiv1.CreateTemplate{Name: "clustered", From: "tiny", Steps: []apiv1.BuildStep{{Run: "echo cluster-built > /built"}}}
	var res apiv1.TemplateOperation
	testenv.Eventually(t, 30*time.Second, "a replica takes the build", func() (bool, string) {
		status, body := r1.call(t, "POST", "/v1/templates", tc.key, req)
		if status == 202 {
			return json.Unmarshal(body, &res) == nil, string(body)
		}
		return status != 503, fmt.Sprintf("%d %s", status, body)
	})
	if res.Template.Status != apiv1.TemplateBuilding {
		t.Fatalf("POST /v1/templates: %+v", res)
	}
	if op := r2.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("the build: %+v\nlog:\n%s", op.Error, r2.buildLogText(t, "clustered"))
	}
	rec, err := st.LatestBuild(ctx, "clustered", "latest")
	if err != nil || rec.Node != "node-a" { // the two are idle: the first by name
		t.Fatalf("the build ran on %q (%v), want node-a", rec.Node, err)
	}
	if n := rogueHits.Load(); n != 0 {
		t.Errorf("a Node that labelled itself an airlock node got %d requests", n)
	}
	var tpl apiv1.Template
	r2.must(t, 200, "GET", "/v1/templates/clustered", tc.key, nil, &tpl)
	if tpl.Status != apiv1.TemplateReady || tpl.Digest != rec.Digest || tpl.Source == nil || tpl.Source.From != "tiny" || tpl.BuildID != rec.ID {
		t.Fatalf("the other replica shows %+v, want the ready build %+v", tpl, rec)
	}
	var list apiv1.List[apiv1.Template]
	r2.must(t, 200, "GET", "/v1/templates?limit=100", tc.key, nil, &list)
	if !slices.ContainsFunc(list.Items, func(v apiv1.Template) bool { return v.Name == "clustered" && v.Digest == tpl.Digest }) {
		t.Errorf("the other replica's list lacks clustered: %+v", list.Items)
	}
	lines, end := r2.buildLog(t, "clustered")
	if end.Status != apiv1.TemplateReady || !slices.ContainsFunc(lines, func(l apiv1.BuildLogLine) bool {
		return strings.Contains(l.Text, "built clustered:latest as "+tpl.Digest)
	}) {
		t.Errorf("the build log through the other replica: %+v, end %+v", lines, end)
	}
	// The node keeps the image and names it in the catalogue only.
	hex := strings.TrimPrefix(tpl.Digest, "sha256:")
	if _, err := os.Stat(filepath.Join(a.home, "templates", "sha256-"+hex+".ext4")); err != nil {
		t.Errorf("the built image on node-a: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(a.home, "templates", "refs", "clustered")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("node-a tagged the build in its data directory: %v", err)
	}
	if tag, err := st.GetTemplateTag(ctx, "clustered", "latest"); err != nil || tag.Digest != tpl.Digest || tag.Owner != tc.owner {
		t.Errorf("the catalogue's clustered:latest: %+v, %v", tag, err)
	}

	create := func(t *testing.T, r *server, ref, want string) string {
		t.Helper()
		var res apiv1.SandboxOperation
		r.must(t, 202, "POST", "/v1/sandboxes", tc.key, apiv1.CreateSandbox{Template: ref}, &res)
		if op := r.waitOp(t, tc.key, res.Operation.ID); op.Status != apiv1.OpSucceeded {
			t.Fatalf("create from %s: %+v\n%s's output:\n%s", ref, op.Error, want, nodeOf[want].output())
		}
		if node, err := st.SandboxNode(ctx, res.Sandbox.ID); err != nil || node != want {
			t.Fatalf("sandbox from %s on %q (%v), want %s", ref, node, err, want)
		}
		if res.Sandbox.Template.Ref != ref+":latest" {
			t.Errorf("the sandbox's template %q, want %s:latest", res.Sandbox.Template, ref)
		}
		return res.Sandbox.ID
	}
	tc.cp.MustKubectl(t, "", "cordon", "node-a")
	sbx := create(t, r2, "clustered", "node-b")
	if out := r1.run(t, tc.key, sbx, apiv1.CommandRequest{Cmd: "cat /built; echo saved > /saved"}); out.stdout != "cluster-built\n" {
		t.Fatalf("a sandbox of the build on node-b: %+v", out)
	}
	if status, body := b.call(t, "GET", "/metrics", tc.key, nil); status != 200 ||
		!strings.Contains(string(body), `airlock_node_template_fetches_total{from="node",result="fetched"} 1`) {
		t.Errorf("node-b did not fetch the build from node-a (%d):\n%s", status, grepLines(string(body), "template_fetch"))
	}
	// A build context goes to a node taking work (node-b, node-a being
	// cordoned), which records that it holds it.
	bc := r1.putContext(t, makeTar(t, tarEntry{name: "hello.txt", body: "from the context\n"}))
	if on, err := st.BuildContextNode(ctx, bc.ID); err != nil || on != "node-b" {
		t.Fatalf("build context %s on %q (%v), want node-b", bc.ID, on, err)
	}

	// A save runs on the sandbox's node, and is published as a build is.
	var saved apiv1.TemplateOperation
	r1.must(t, 202, "POST", "/v1/sandboxes/"+sbx+"/template", tc.key, apiv1.SaveTemplate{Name: "clustered-save"}, &saved)
	if op := r2.waitOp(t, tc.key, saved.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("the save: %+v", op.Error)
	}
	if rec, err := st.LatestBuild(ctx, "clustered-save", "latest"); err != nil || rec.Node != "node-b" {
		t.Fatalf("the save ran on %q (%v), want node-b", rec.Node, err)
	}
	// With no node taking work, a build is refused, and nothing recorded.
	tc.cp.MustKubectl(t, "", "cordon", "node-b")
	// The replica's watch of the Nodes sees it: until then a build it
	// sends goes to node-b, which refuses one with an unknown field and
	// records nothing.
	testenv.Eventually(t, 30*time.Second, "the replica seeing both nodes cordoned", func() (bool, string) {
		status, body := r2.call(t, "POST", "/v1/templates", tc.key, map[string]any{"name": "nowhere", "from": "tiny", "probe": true})
		return status == 503, fmt.Sprintf("%d %s", status, body)
	})
	if status, body := r2.call(t, "POST", "/v1/templates", tc.key, apiv1.CreateTemplate{Name: "nowhere", From: "tiny"}); status != 503 ||
		!strings.Contains(string(body), "no airlock node is up and taking work") {
		t.Errorf("a build with both nodes cordoned: %d %s", status, body)
	}
	if _, err := st.LatestBuild(ctx, "nowhere", "latest"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a build no node took was recorded: %v", err)
	}
	tc.cp.MustKubectl(t, "", "uncordon", "node-a")
	from := create(t, r1, "clustered-save", "node-a")
	if out := r2.run(t, tc.key, from, apiv1.CommandRequest{Cmd: "cat /built /saved"}); out.stdout != "cluster-built\nsaved\n" {
		t.Fatalf("a sandbox of the save on node-a: %+v", out)
	}

	// A build that reads a context runs on the node that holds it, cordoned
	// or not (node-a is the one taking work now); its sandbox, on node-a,
	// has the file.
	r2.mustBuild(t, apiv1.CreateTemplate{Name: "from-context", From: "tiny", Context: bc.ID,
		Steps: []apiv1.BuildStep{{Copy: &apiv1.BuildCopy{Src: "hello.txt", Dest: "/hello.txt"}}}})
	if rec, err := st.LatestBuild(ctx, "from-context", "latest"); err != nil || rec.Node != "node-b" {
		t.Fatalf("the build of the context ran on %q (%v), want node-b", rec.Node, err)
	}
	withCtx := create(t, r1, "from-context", "node-a")
	if out := r1.run(t, tc.key, withCtx, apiv1.CommandRequest{Cmd: "cat /hello.txt"}); out.stdout != "from the context\n" {
		t.Fatalf("a sandbox of the context's build: %+v", out)
	}
	r1.deleteSandbox(t, tc.key, withCtx)
	if status, body := r1.call(t, "POST", "/v1/templates", tc.key, apiv1.CreateTemplate{Name: "lost", From: "tiny", Context: "ctx" + strings.Repeat("0", 20),
		Steps: []apiv1.BuildStep{{Copy: &apiv1.BuildCopy{Src: "a", Dest: "/a"}}}}); status != 404 || !strings.Contains(string(body), "upload it again") {
		t.Errorf("a build of a context no node holds: %d %s", status, body)
	}

	// What a cluster does not do is refused, and changes nothing.
	for _, name := range []string{"tiny"} {
		if status, body := r1.call(t, "POST", "/v1/templates", tc.key, apiv1.CreateTemplate{Name: name, From: "tiny"}); status != 409 || !strings.Contains(string(body), "provisioned") {
			t.Errorf("a build over the provisioned %s: %d %s", name, status, body)
		}
		if status, body := r2.call(t, "DELETE", "/v1/templates/"+name+":latest", tc.key, nil); status != 409 || !strings.Contains(string(body), "provisioned") {
			t.Errorf("a delete of the provisioned %s: %d %s", name, status, body)
		}
	}
	if _, err := st.LatestBuild(ctx, "tiny", "latest"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused build was recorded: %v", err)
	}

	// A delete through one replica is seen by the other; the sandbox made
	// from the template goes on.
	r2.must(t, 204, "DELETE", "/v1/templates/clustered:latest", tc.key, nil, nil)
	r1.must(t, 404, "GET", "/v1/templates/clustered:latest", tc.key, nil, nil)
	if status, body := r1.call(t, "POST", "/v1/sandboxes", tc.key, apiv1.CreateSandbox{Template: "clustered"}); status != 404 {
		t.Errorf("a create from the deleted template: %d %s", status, body)
	}
	if out := r1.run(t, tc.key, sbx, apiv1.CommandRequest{Cmd: "cat /built"}); out.stdout != "cluster-built\n" {
		t.Errorf("the sandbox of the deleted template: %+v", out)
	}

	// Each node keeps its copies while a sandbox or the catalogue names
	// them, and reclaims them (--reclaim-interval) once neither does.
	var savedTpl apiv1.Template
	r1.must(t, 200, "GET", "/v1/templates/clustered-save", tc.key, nil, &savedTpl)
	images := func(n *server) []string {
		var held []string
		for _, d := range []string{tpl.Digest, savedTpl.Digest} {
			if _, err := os.Stat(filepath.Join(n.home, "templates", "sha256-"+strings.TrimPrefix(d, "sha256:")+".ext4")); err == nil {
				held = append(held, d)
			}
		}
		return held
	}
	r1.deleteSandbox(t, tc.key, sbx)
	r2.deleteSandbox(t, tc.key, from)
	for _, n := range []*server{a, b} {
		// clustered goes (no tag, no sandbox); clustered-save stays.
		testenv.Eventually(t, 20*time.Second, "the node reclaims the deleted template's image only", func() (bool, string) {
			held := images(n)
			return slices.Equal(held, []string{savedTpl.Digest}), fmt.Sprintf("holds %v", held)
		})
	}
	// Two more reclaims on each node, on its timer, must keep it.
	for _, n := range []*server{a, b} {
		was := reclaims(t, n)
		testenv.Eventually(t, 20*time.Second, "two more reclaims on the node", func() (bool, string) {
			now := reclaims(t, n)
			return now >= was+2, fmt.Sprintf("%d passes since", now-was)
		})
	}
	for _, n := range []*server{a, b} {
		if held := images(n); !slices.Equal(held, []string{savedTpl.Digest}) {
			t.Errorf("a node holds %v while the catalogue names only clustered-save", held)
		}
	}
	r1.must(t, 204, "DELETE", "/v1/templates/clustered-save:latest", tc.key, nil, nil)
	for _, n := range []*server{a, b} {
		testenv.Eventually(t, 20*time.Second, "the node reclaims the images", func() (bool, string) {
			held := images(n)
			return len(held) == 0, fmt.Sprintf("holds %v", held)
		})
	}

	// A node killed during a build (node-a, the one taking work): while it
	// is down the replicas show the build with the reason; the build's VM
	// dies with the agent; the agent, started again, fails the build and
	// removes the build sandbox's directory, though it is not a minute
	// old.
	var orphan apiv1.TemplateOperation
	r1.must(t, 202, "POST", "/v1/templates", tc.key, apiv1.CreateTemplate{Name: "orphaned", From: "tiny",
		Steps: []apiv1.BuildStep{{Run: "sleep 600"}}}, &orphan)
	var buildVM string
	testenv.Eventually(t, time.Minute, "the build's VM running on node-a", func() (bool, string) {
		pids, _ := filepath.Glob(filepath.Join(a.home, "sandboxes", "sbxbuild*", "qemu.pid"))
		if len(pids) == 1 {
			buildVM = filepath.Dir(pids[0])
		}
		return buildVM != "", fmt.Sprintf("%v", pids)
	})
	qemu := qemuPID(t, a, filepath.Base(buildVM))
	if qemu == 0 {
		t.Fatalf("no QEMU pid in %s", buildVM)
	}
	a.stop(syscall.SIGKILL)
	testenv.Eventually(t, 20*time.Second, "the build shown unavailable", func() (bool, string) {
		var v apiv1.Template
		r2.must(t, 200, "GET", "/v1/templates/orphaned", tc.key, nil, &v)
		return v.Status == apiv1.TemplateBuilding && v.Unavailable != nil && v.Unavailable.Code == apiv1.CodeUnavailable &&
			strings.Contains(v.Unavailable.Message, "node node-a has not renewed its lease"), fmt.Sprintf("%+v", v)
	})
	testenv.Eventually(t, 10*time.Second, "the build's QEMU gone with the agent", func() (bool, string) {
		return syscall.Kill(qemu, 0) != nil, fmt.Sprintf("pid %d", qemu)
	})
	if _, err := os.Stat(buildVM); err != nil {
		t.Fatalf("the build's sandbox directory, left by the agent: %v", err)
	}
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	if op := r2.waitOp(t, tc.key, orphan.Operation.ID); op.Status != apiv1.OpFailed || op.Error == nil ||
		!strings.Contains(op.Error.Message, "stopped during the build") {
		t.Errorf("the build's operation after its node restarted: %+v", op)
	}
	var v apiv1.Template
	r1.must(t, 200, "GET", "/v1/templates/orphaned", tc.key, nil, &v)
	if v.Status != apiv1.TemplateFailed || v.Unavailable != nil {
		t.Errorf("the build after its node restarted: %+v", v)
	}
	if _, err := os.Stat(buildVM); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the build's sandbox directory is still there: %v", err)
	}
}

// TestClusterE2B: E2B's own SDK (e2e/e2bsdk/cluster.mjs) against two API
// replicas' E2B API, neither of which runs a VM: a sandbox made through
// one is driven through the other (connect, commands, a streamed
// background command, files, info, list, kill), every call reaching the
// node that runs it through the internal API.
func TestClusterE2B(t *testing.T) {
	nodeJS := needNode(t)
	dir, err := filepath.Abs(e2bSDKDir)
	if err != nil {
		t.Fatal(err)
	}
	needSDKModules(t, dir)
	tc := newTestCluster(t)
	ctx := context.Background()
	st := testStore(t, tc.storeURL)
	tc.node(t, "node-a", "--e2b-domain", e2bSDKDomain)
	var urls []string
	var replicas []*server
	for range 2 {
		addr, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, tc.replica(t, "--e2b-listen", addr, "--e2b-domain", e2bSDKDomain))
		urls = append(urls, "http://"+addr)
	}
	var k struct {
		Key string `json:"key"`
	}
	replicas[0].must(t, 201, "POST", "/v1/keys", tc.key, map[string]string{"name": "e2b-cluster", "role": "user", "format": "e2b"}, &k)
	res := runSDKScript(t, replicas[0], nodeJS, dir, "cluster.mjs", []string{
		"E2E_REPLICA_ONE=" + urls[0], "E2E_REPLICA_TWO=" + urls[1], "E2B_API_KEY=" + k.Key, "E2B_DOMAIN=" + e2bSDKDomain,
	}, 6*time.Minute)
	// The sandbox was node-a's, and is deleted.
	made := res["create through replica one"]
	if len(made.Log) == 0 || !strings.HasPrefix(made.Log[0], "sandbox ") {
		t.Fatalf("the create case logged %q, want the sandbox's ID", made.Log)
	}
	id := strings.TrimPrefix(made.Log[0], "sandbox ")
	if node, err := st.SandboxNode(ctx, id); err != nil || node != "node-a" {
		t.Errorf("sandbox %s ran on %q (%v), want node-a", id, node, err)
	}
	if sb, err := st.GetSandbox(ctx, id); err != nil || sb.State != apiv1.StateDeleted {
		t.Errorf("sandbox %s after the kill: %s, %v", id, sb.State, err)
	}
}

// tlsGet GETs u with client and hdr, and returns the answer's status and
// body, or the error of a refused connection.
func tlsGet(client *http.Client, u string, hdr http.Header) (int, string, error) {
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}

// refusesStrangers checks that the cluster-TLS listener on addr, whose
// certificate is for role, answers path (with hdr: the token, a key)
// to no caller without a certificate of the cluster CA: not in plain
// HTTP, not over TLS without a certificate, not with one of another CA
// for the same role. And a client of the cluster refuses a listener with
// another CA's certificate.
func (c *testCluster) refusesStrangers(t *testing.T, addr, role, path string, hdr http.Header) {
	t.Helper()
	if status, b, err := tlsGet(&http.Client{}, "http://"+addr+path, hdr); err == nil && status != 400 {
		t.Errorf("plain HTTP: %d %s; want it refused", status, b)
	}
	ca, err := os.ReadFile(filepath.Join(c.tls, clustertls.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: role}}}
	if status, b, err := tlsGet(noCert, "https://"+addr+path, hdr); err == nil {
		t.Errorf("TLS without a client certificate: %d %s; want the handshake refused", status, b)
	}
	other := filepath.Join(t.TempDir(), "other")
	if err := clustertls.Generate(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	stranger, err := clustertls.Load(filepath.Join(other, "server"), clustertls.RoleServer)
	if err != nil {
		t.Fatal(err)
	}
	// The stranger trusts this cluster's CA, so that only the listener's
	// check of its certificate stands in its way.
	cfg := stranger.ClientConfig(role)
	cfg.RootCAs = pool
	if status, b, err := tlsGet(&http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}, "https://"+addr+path, hdr); err == nil {
		t.Errorf("TLS with another CA's certificate: %d %s; want the handshake refused", status, b)
	}
	// A member of the cluster does not talk to a listener of another CA.
	if status, b, err := tlsGet(&http.Client{Transport: stranger.Transport(role)}, "https://"+addr+path, hdr); err == nil {
		t.Errorf("another CA's client took this cluster's listener: %d %s", status, b)
	}
}

// rogueNode makes a Node that labels itself an airlock node, as anyone who
// may create Nodes could, with its address and port those of a listener
// on loopback, and returns the count of the requests that reach it: an
// airlock server must send none (no call, no client key, no token).
func rogueNode(t *testing.T, tc *testCluster, name string) *atomic.Int32 {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ctx := context.Background()
	n, err := tc.kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"airlock.dev/node": "true", "type": "virtual-kubelet"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"), corev1.ResourcePods: resource.MustParse("100")}
	n.Status.Allocatable = n.Status.Capacity
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if _, err := tc.kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &hits
}

// reclaims is how many passes of its template storage's reclaim n has
// done, by its /metrics.
func reclaims(t *testing.T, n *server) int {
	t.Helper()
	status, body := n.call(t, "GET", "/metrics", n.key, nil)
	m := reclaimsTotal.FindSubmatch(body)
	if status != 200 || m == nil {
		t.Fatalf("no airlock_template_reclaims_total in the node's metrics (%d)", status)
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}

var reclaimsTotal = regexp.MustCompile(`(?m)^airlock_template_reclaims_total (\d+)$`)
