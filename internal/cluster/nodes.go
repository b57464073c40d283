package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// TaintUnreachable is the taint the controller puts on an airlock Node
// whose agent stopped renewing its Lease, so that kube-scheduler places
// new sandboxes elsewhere; it goes when the agent is back. Sandbox Pods
// do not tolerate it; those on the Node stay (it is NoSchedule).
const TaintUnreachable = "airlock.dev/unreachable"

// NodeRegistry lists the airlock nodes the cluster's store registered
// (store.Store.ClusterNodes): name to the base URL it is reached at.
type NodeRegistry interface {
	ClusterNodes(ctx context.Context) (map[string]string, error)
}

// registryTTL is how long a read of the registered nodes is trusted.
const registryTTL = 2 * time.Second

// nodeWatch follows the airlock Nodes and their heartbeat Leases, and the
// nodes the store registered: a Node that carries airlock's label is taken
// for an airlock node only when its agent registered it in the store,
// which takes the store's credentials, and it is reached at the endpoint
// registered there, not at what the Node object says.
type nodeWatch struct {
	nodes  corev1listers.NodeLister
	leases coordinationlisters.LeaseNamespaceLister
	reg    NodeRegistry

	mu         sync.Mutex // guards registered and read
	registered map[string]string
	read       time.Time
}

// registeredAt returns the endpoint node is registered at in the store,
// "" when it is not registered (or the store cannot say).
func (w *nodeWatch) registeredAt(node string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.registered == nil || time.Since(w.read) > registryTTL {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := w.reg.ClusterNodes(ctx)
		cancel()
		if err == nil {
			w.registered, w.read = got, time.Now()
		}
	}
	return w.registered[node]
}

// watchNodes starts informers on the airlock Nodes and the Leases of
// kube-node-lease until ctx ends, and returns once both have listed. reg
// says which of those Nodes are airlock's.
func watchNodes(ctx context.Context, client kubernetes.Interface, reg NodeRegistry) (*nodeWatch, error) {
	nf := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelNode + "=true" }))
	lf := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute, informers.WithNamespace(corev1.NamespaceNodeLease))
	ni, li := nf.Core().V1().Nodes(), lf.Coordination().V1().Leases()
	w := &nodeWatch{nodes: ni.Lister(), leases: li.Lister().Leases(corev1.NamespaceNodeLease), reg: reg}
	nf.Start(ctx.Done())
	lf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), ni.Informer().HasSynced, li.Informer().HasSynced) {
		return nil, fmt.Errorf("list the airlock nodes and their leases: %w", errdefs.ErrUnavailable)
	}
	return w, nil
}

// down says why the node's agent cannot be counted on at now, or "" if
// it renewed its Lease within the Lease's duration. A Node without a
// Lease (not one an agent registered) is taken as up.
func (w *nodeWatch) down(node string, now time.Time) string {
	if _, err := w.nodes.Get(node); err != nil {
		return fmt.Sprintf("node %s is not registered with the cluster", node)
	}
	if w.registeredAt(node) == "" {
		return fmt.Sprintf("node %s carries airlock's label but its agent never registered it in the cluster's store: it is not taken for an airlock node", node)
	}
	l, err := w.leases.Get(node)
	if err != nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return "" // no heartbeat to judge it by: taken as up
	}
	renewed := l.Spec.RenewTime.Time
	if late := now.Sub(renewed) - time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second; late > 0 {
		return fmt.Sprintf("node %s has not renewed its lease since %s (%s ago): its agent is down or cut off",
			node, renewed.UTC().Format(time.RFC3339), now.Sub(renewed).Truncate(time.Second))
	}
	return ""
}

// markNodes taints each airlock Node whose agent is down with
// TaintUnreachable, and untaints it once the agent is back. It returns
// how many are down.
func (c *Controller) markNodes(ctx context.Context, w *nodeWatch) int {
	nodes, err := w.nodes.List(labels.Everything())
	if err != nil {
		return 0
	}
	down := 0
	now := time.Now()
	for _, n := range nodes { // the informer's: read, never changed
		why := w.down(n.Name, now)
		if why != "" {
			down++
		}
		if (why != "") == hasTaint(n, TaintUnreachable) {
			continue
		}
		if err := c.setUnreachable(ctx, n.Name, why); err != nil && ctx.Err() == nil {
			c.cfg.Log.Warn("cluster controller: mark a node", "node", n.Name, "err", err)
		}
	}
	return down
}

// setUnreachable adds TaintUnreachable to the Node when why is set, and
// removes it when not.
func (c *Controller) setUnreachable(ctx context.Context, name, why string) error {
	nodes := c.cfg.Client.CoreV1().Nodes()
	n, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool { return t.Key == TaintUnreachable })
	if why != "" {
		now := metav1.Now()
		taints = append(taints, corev1.Taint{Key: TaintUnreachable, Effect: corev1.TaintEffectNoSchedule, TimeAdded: &now})
	}
	n.Spec.Taints = taints
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		return err
	}
	if why != "" {
		c.cfg.Log.Warn("cluster controller: node unreachable: new sandboxes go elsewhere", "node", name, "why", why)
	} else {
		c.cfg.Log.Info("cluster controller: node back", "node", name)
	}
	return nil
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}
