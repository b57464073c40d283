// Package cluster places sandboxes on Kubernetes. Its controller turns
// the store's sandbox rows into Pods that kube-scheduler binds to airlock
// nodes, and records the node each one is bound to. The row is the truth:
// a Pod is made for every sandbox that should have a VM and removed when
// its row says the sandbox is gone, never the other way round.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

const (
	// LabelSandbox holds the sandbox ID on its Pod.
	LabelSandbox = "airlock.dev/sandbox-id"
	// AnnotationTemplate holds the digest of the sandbox's template.
	AnnotationTemplate = "airlock.dev/template"
	// RuntimeClass is the RuntimeClass of sandbox Pods (deploy/).
	RuntimeClass = "airlock"
	// DefaultLease is the name of the controllers' coordination Lease.
	DefaultLease = "airlock-controller"
)

// Config configures a Controller.
type Config struct {
	// Client reaches the apiserver.
	Client kubernetes.Interface
	// Store holds the sandbox rows.
	Store *store.Store
	// Namespace holds the sandbox Pods and the Lease.
	Namespace string
	// Identity names this controller in the Lease; unique per process.
	Identity string
	// Lease is the Lease's name; DefaultLease if empty.
	Lease string
	// LeaseDuration, RenewDeadline and RetryPeriod are the leader
	// election's timings (client-go's leaderelection): a leader that
	// cannot renew for RenewDeadline stops; another takes over
	// LeaseDuration after the last renewal. 15 s, 10 s and 2 s if zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Resync is the period of the full pass over rows and Pods while
	// leading; 10 s if zero. A change to a sandbox Pod, or Poke after
	// rows changed, brings one sooner.
	Resync time.Duration
	// Log receives what the controller did and what it left alone, and
	// what client-go logs while it runs.
	Log *slog.Logger
	// Registry, if set, gets the controller's metrics.
	Registry prometheus.Registerer
}

// Controller reconciles sandbox rows and Pods while it holds the Lease.
type Controller struct {
	cfg  Config
	poke chan struct{}

	mu      sync.Mutex // guards leading and unknown
	leading bool
	unknown []string // Pods of sandboxes the store lacks, from the last pass

	m metrics
}

type metrics struct {
	leading     prometheus.Gauge
	unknown     prometheus.Gauge
	changes     *prometheus.CounterVec
	failures    prometheus.Counter
	unreachable prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		leading: prometheus.NewGauge(prometheus.GaugeOpts{Name: "airlock_cluster_leading",
			Help: "1 while this server's controller holds the Lease and reconciles, else 0."}),
		unknown: prometheus.NewGauge(prometheus.GaugeOpts{Name: "airlock_cluster_unknown_pods",
			Help: "Sandbox Pods that name a sandbox the store does not know, left alone (last pass)."}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "airlock_cluster_pod_changes_total",
			Help: "Changes the controller made: created and deleted Pods, bound nodes recorded in rows."}, []string{"change"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "airlock_cluster_pass_failures_total",
			Help: "Passes that failed in part; the next pass retries."}),
		unreachable: prometheus.NewGauge(prometheus.GaugeOpts{Name: "airlock_cluster_unreachable_nodes",
			Help: "Airlock nodes whose agent has not renewed its Lease in time, tainted " + TaintUnreachable + "."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.leading, m.unknown, m.changes, m.failures, m.unreachable} {
			if err := reg.Register(c); err != nil {
				return m, fmt.Errorf("cluster controller: metrics: %w", err)
			}
		}
	}
	return m, nil
}

// New checks cfg and returns a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.Client == nil || cfg.Store == nil:
		return nil, errors.New("cluster controller: a client and a store are needed")
	case cfg.Namespace == "" || cfg.Identity == "":
		return nil, errors.New("cluster controller: a namespace and an identity are needed")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.LeaseDuration, 15*time.Second)
	def(&cfg.RenewDeadline, 10*time.Second)
	def(&cfg.RetryPeriod, 2*time.Second)
	def(&cfg.Resync, 10*time.Second)
	if cfg.LeaseDuration <= cfg.RenewDeadline ||
		float64(cfg.RenewDeadline) <= leaderelection.JitterFactor*float64(cfg.RetryPeriod) || cfg.Resync < 0 {
		return nil, fmt.Errorf("cluster controller: lease duration %s, renew deadline %s, retry period %s, resync %s: "+
			"the lease must outlast the renew deadline, which must exceed %.1f retry periods, and resync must not be negative",
			cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod, cfg.Resync, leaderelection.JitterFactor)
	}
	if cfg.Lease == "" {
		cfg.Lease = DefaultLease
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, poke: make(chan struct{}, 1), m: m}, nil
}

// Run campaigns for the Lease and reconciles while it holds it, until ctx
// ends; a leader that loses the Lease stops reconciling and campaigns
// again. Leaving, it gives the Lease up so another takes over at once.
func (c *Controller) Run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: c.cfg.Lease, Namespace: c.cfg.Namespace},
		Client:     c.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.cfg.Identity},
	}
	// client-go logs through klog, which takes the logger from ctx.
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(c.cfg.Log.Handler()))
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   c.cfg.LeaseDuration,
			RenewDeadline:   c.cfg.RenewDeadline,
			RetryPeriod:     c.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            c.cfg.Lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: c.lead,
				OnStoppedLeading: func() { c.setLeading(false) },
			},
		})
		if err != nil { // only a bad configuration, which New refuses
			c.cfg.Log.Error("cluster controller: leader election", "err", err)
			return
		}
		le.Run(ctx)
	}
}

// Leading says whether this controller holds the Lease.
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading
}

// Unknown lists the Pods, by sandbox ID, that the last pass found for
// sandboxes the store does not know. They are left alone: nothing of the
// store says to make them into VMs or to remove them.
func (c *Controller) Unknown() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.unknown)
}

// Poke asks the leader for a pass now, after rows changed.
func (c *Controller) Poke() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

func (c *Controller) setLeading(v bool) {
	c.mu.Lock()
	c.leading = v
	c.mu.Unlock()
	if v {
		c.m.leading.Set(1)
		c.cfg.Log.Info("cluster controller: leading", "identity", c.cfg.Identity)
	} else {
		c.m.leading.Set(0)
		c.cfg.Log.Info("cluster controller: not leading", "identity", c.cfg.Identity)
	}
}

// lead watches the sandbox Pods and runs passes until ctx, which ends
// with the leadership, ends.
func (c *Controller) lead(ctx context.Context) {
	c.setLeading(true)
	f := informers.NewSharedInformerFactoryWithOptions(c.cfg.Client, 0, informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSandbox }))
	pods := f.Core().V1().Pods()
	poke := func(any) { c.Poke() }
	pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, DeleteFunc: poke, UpdateFunc: func(_, o any) { poke(o) }})
	f.StartWithContext(ctx)
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), pods.Informer().HasSynced) {
		return // the leadership ended first
	}
	lister := pods.Lister().Pods(c.cfg.Namespace)
	nodes, err := watchNodes(ctx, c.cfg.Client, c.cfg.Store)
	if err != nil {
		return // the leadership ended first
	}
	// Heartbeats are checked every second, apart from the passes.
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			c.m.unreachable.Set(float64(c.markNodes(ctx, nodes)))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	for {
		if err := c.reconcile(ctx, lister); err != nil && ctx.Err() == nil {
			c.m.failures.Inc()
			c.cfg.Log.Warn("cluster controller: pass failed; the next one retries", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.poke:
		}
	}
}

// liveStates are the states of a sandbox that has, or is to have, a VM,
// and so a Pod holding its node's resources: all but deleted and failed.
var liveStates = slices.DeleteFunc(slices.Clone(apiv1.States),
	func(st string) bool { return st == apiv1.StateDeleted || st == apiv1.StateFailed })

// reconcile makes one full pass: a Pod for every live sandbox, none for a
// sandbox whose row says it ended, and each bound Pod's node recorded in
// its row. It reads the live rows only, and the row of a Pod that has no
// live one. The Pods are the informer's, which may lag the apiserver; rows
// or Pods that change during the pass are caught by the next one.
func (c *Controller) reconcile(ctx context.Context, lister listerv1.PodNamespaceLister) error {
	rows, err := c.liveRows(ctx)
	if err != nil {
		return err
	}
	nodes, err := c.cfg.Store.SandboxNodes(ctx, liveStates...)
	if err != nil {
		return err
	}
	pods, err := lister.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list sandbox pods: %w", err)
	}
	var errs []error
	var unknown []string
	have := map[string]bool{}
	for _, pod := range pods { // the informer's: read, never changed
		id := pod.Labels[LabelSandbox]
		if _, ok := rows[id]; !ok {
			if pod.DeletionTimestamp != nil {
				continue // deleted, waiting for its node
			}
			sb, err := c.cfg.Store.GetSandbox(ctx, id)
			switch {
			case errors.Is(err, errdefs.ErrNotFound):
				unknown = append(unknown, id)
			case err != nil:
				errs = append(errs, err)
			case !slices.Contains(liveStates, sb.State):
				errs = append(errs, c.deletePod(ctx, pod, "its sandbox is "+sb.State))
			} // else created since the list: the next pass has it
			continue
		}
		have[id] = true
		switch node := pod.Spec.NodeName; {
		case node == "":
		case nodes[id] == "":
			// A claim, not a write: a node or a replica that took the
			// sandbox meanwhile keeps it, and the next pass sees the Pod
			// bound elsewhere.
			got, err := c.cfg.Store.ClaimSandboxNode(ctx, id, node)
			if err != nil || got != node {
				errs = append(errs, err)
				break
			}
			c.m.changes.WithLabelValues("bound").Inc()
			c.cfg.Log.Info("cluster controller: sandbox bound", "sandbox", id, "node", node)
		case nodes[id] != node:
			// Its VM and snapshot are on the recorded node; a Pod bound
			// elsewhere would put a second VM there.
			errs = append(errs, c.deletePod(ctx, pod, "bound to "+node+" but the sandbox is on "+nodes[id]))
		}
	}
	for id, sb := range rows {
		if !have[id] && nodes[id] != store.ReplicaClaim { // a replica's delete ends it
			errs = append(errs, c.createPod(ctx, sb, nodes[id]))
		}
	}
	c.report(unknown)
	return errors.Join(errs...)
}

// liveRows reads the rows of the sandboxes in a live state, by ID.
func (c *Controller) liveRows(ctx context.Context) (map[string]store.Sandbox, error) {
	const page = 500
	out := map[string]store.Sandbox{}
	after := ""
	for {
		sbs, err := c.cfg.Store.ListSandboxes(ctx, store.SandboxFilter{States: liveStates, After: after, Limit: page})
		if err != nil {
			return nil, err
		}
		for _, sb := range sbs {
			out[sb.ID] = sb
		}
		if len(sbs) < page {
			return out, nil
		}
		after = sbs[len(sbs)-1].ID
	}
}

// report logs the Pods of unknown sandboxes the pass found that the one
// before did not, and keeps the list for Unknown.
func (c *Controller) report(unknown []string) {
	slices.Sort(unknown)
	c.mu.Lock()
	before := c.unknown
	c.unknown = unknown
	c.mu.Unlock()
	c.m.unknown.Set(float64(len(unknown)))
	for _, id := range unknown {
		if !slices.Contains(before, id) {
			c.cfg.Log.Warn("cluster controller: a sandbox pod names a sandbox the store does not know; left alone",
				"namespace", c.cfg.Namespace, "sandbox", id)
		}
	}
}

func (c *Controller) createPod(ctx context.Context, sb store.Sandbox, node string) error {
	if errs := validation.IsDNS1123Label(sb.ID); len(errs) > 0 {
		return fmt.Errorf("sandbox %s cannot name a pod: %v", sb.ID, errs)
	}
	_, err := c.cfg.Client.CoreV1().Pods(c.cfg.Namespace).Create(ctx, podFor(sb, c.cfg.Namespace, node), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // one made since the list, or one still terminating: the next pass sees it
	}
	if err != nil {
		return fmt.Errorf("create pod of sandbox %s: %w", sb.ID, err)
	}
	c.m.changes.WithLabelValues("created").Inc()
	c.cfg.Log.Info("cluster controller: pod created", "sandbox", sb.ID, "node", node)
	return nil
}

func (c *Controller) deletePod(ctx context.Context, pod *corev1.Pod, why string) error {
	if pod.DeletionTimestamp != nil {
		return nil
	}
	// Only the Pod the pass saw: a newer one of the same name is left for
	// the next pass.
	err := c.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod of sandbox %s: %w", pod.Labels[LabelSandbox], err)
	}
	c.m.changes.WithLabelValues("deleted").Inc()
	c.cfg.Log.Info("cluster controller: pod deleted", "sandbox", pod.Labels[LabelSandbox], "why", why)
	return nil
}

// podFor is the Pod of sandbox sb in namespace: the airlock RuntimeClass,
// requests and limits from its vCPUs, memory and disk, a grace period of
// a second, and made bound to node if the sandbox already has one (its VM or
// snapshot is there). It tolerates not-ready and unreachable nodes for
// good: a node that stops answering must not have its sandboxes evicted
// and made again elsewhere, since their VMs live on it.
func podFor(sb store.Sandbox, namespace, node string) *corev1.Pod {
	res := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(sb.VCPUs), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(int64(sb.MemoryMiB)<<20, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(int64(sb.DiskMiB)<<20, resource.BinarySI),
	}
	grace := int64(1)
	no := false
	class := RuntimeClass
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: sb.ID, Namespace: namespace,
			Labels:      map[string]string{LabelSandbox: sb.ID},
			Annotations: map[string]string{AnnotationTemplate: sb.TemplateDigest},
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &class,
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			Containers: []corev1.Container{{
				Name:      "sandbox",
				Image:     "airlock.dev/template@" + sb.TemplateDigest,
				Resources: corev1.ResourceRequirements{Requests: res, Limits: res},
			}},
			Tolerations: []corev1.Toleration{
				{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
				{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
			},
		},
	}
}
