// Package node is `airlock node`: it registers its host with Kubernetes
// as a virtual-kubelet Node that only airlock's sandbox Pods tolerate,
// with the host's capacity, and turns the sandbox Pods kube-scheduler
// binds to it into microVMs through a node-mode service.Service. The
// store's row, not the Pod, decides a VM's life: a Pod deleted while its
// sandbox is live (an eviction, a Pod removed by hand) leaves the VM
// running, and the cluster controller makes the Pod again on this node.
// A Pod whose sandbox the store does not know is refused, reported on
// the Pod, in an event and on /metrics, and never becomes a VM.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

const (
	// TaintKey and TaintValue make the taint that keeps every Pod but a
	// sandbox's (whose RuntimeClass tolerates it) off an airlock Node.
	TaintKey   = "virtual-kubelet.io/provider"
	TaintValue = "airlock"
)

// Capacity is what a node offers the scheduler.
type Capacity struct {
	CPUs      int   // vCPUs
	MemoryMiB int64 // guest memory
	DiskMiB   int64 // sandbox disks
	Sandboxes int   // Pods
}

// Config configures an Agent.
type Config struct {
	// Client talks to the apiserver.
	Client kubernetes.Interface
	// Namespace holds the sandbox Pods.
	Namespace string
	// Name is the Node's name, and the node recorded in the rows of the
	// sandboxes it runs.
	Name string
	// Service runs the VMs; its Config.Node is Name.
	Service *service.Service
	// Store is the cluster's store, the service's.
	Store *store.Store
	// Capacity is the Node's capacity and allocatable.
	Capacity Capacity
	// Address is the IP other airlock servers reach this node's internal
	// API on: the Node's InternalIP.
	Address string
	// Port is the internal API's port: the Node's kubelet endpoint.
	Port int
	// LeaseDuration is how long the Node's Lease holds without a renewal
	// (renewed every quarter of it). Default 10 s, so that a dead agent
	// is seen within seconds.
	LeaseDuration time.Duration
	// Version is reported as the Node's kubelet version.
	Version string
	// Log receives the agent's diagnostics; virtual-kubelet's and
	// client-go's go to it too.
	Log *slog.Logger
	// Registry gets the agent's metrics; nil registers none.
	Registry prometheus.Registerer
}

// Agent is one node agent.
type Agent struct {
	cfg Config
	p   *provider
}

// New checks cfg.
func New(cfg Config) (*Agent, error) {
	if cfg.Client == nil || cfg.Service == nil || cfg.Store == nil {
		return nil, errors.New("node: a client, a service and a store are needed")
	}
	if cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("node: a namespace and a node name are needed")
	}
	if net.ParseIP(cfg.Address) == nil {
		return nil, fmt.Errorf("node: address %q is not an IP address", cfg.Address)
	}
	if cfg.Port <= 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("node: port %d is out of range", cfg.Port)
	}
	c := cfg.Capacity
	if c.CPUs < 1 || c.MemoryMiB < 1 || c.DiskMiB < 1 || c.Sandboxes < 1 {
		return nil, fmt.Errorf("node: capacity %+v: every part must be positive", c)
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 10 * time.Second
	}
	if cfg.LeaseDuration < 4*time.Second {
		return nil, fmt.Errorf("node: lease duration %s is under 4s", cfg.LeaseDuration)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "airlock"
	}
	p := newProvider(cfg)
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(p.refused)
	}
	return &Agent{cfg: cfg, p: p}, nil
}

// Run registers the Node and serves its Pods until ctx ends. It returns
// an error only if the Node or its Pod controller could not start.
func (a *Agent) Run(ctx context.Context) error {
	cfg := a.cfg
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(cfg.Log.Handler()))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	leaseSeconds := int32(cfg.LeaseDuration / time.Second)
	nc, err := vknode.NewNodeController(vknode.NaiveNodeProvider{}, a.nodeObject(), cfg.Client.CoreV1().Nodes(),
		vknode.WithNodeEnableLeaseV1WithRenewInterval(cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease), leaseSeconds, cfg.LeaseDuration/4),
		vknode.WithNodeStatusUpdateErrorHandler(func(ctx context.Context, err error) error {
			cfg.Log.Warn("update the node's status", "err", err)
			return err
		}))
	if err != nil {
		return fmt.Errorf("node controller: %w", err)
	}
	ncErr := make(chan error, 1)
	go func() { ncErr <- nc.Run(ctx) }()
	select {
	case <-nc.Ready():
	case err := <-ncErr:
		return fmt.Errorf("register node %s: %w", cfg.Name, err)
	case <-ctx.Done():
		return nil
	}
	go a.dropNotReady(ctx)

	// Only the sandbox Pods bound to this node.
	sel := labels.NewSelector()
	req, err := labels.NewRequirement(cluster.LabelSandbox, selection.Exists, nil)
	if err != nil {
		return err
	}
	sel = sel.Add(*req)
	pods := informers.NewSharedInformerFactoryWithOptions(cfg.Client, time.Minute,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.Name).String()
			o.LabelSelector = sel.String()
		}))
	// The Pod controller wants ConfigMap, Secret and Service informers
	// for the downward API, which sandbox Pods do not use: they come from
	// a factory that is never started, so the agent needs no access to
	// them and holds none of their objects.
	unused := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace))
	events := record.NewBroadcaster()
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Client.CoreV1().Events(cfg.Namespace)})
	recorder := events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "airlock-node", Host: cfg.Name})
	a.p.recorder = recorder

	pc, err := vknode.NewPodController(vknode.PodControllerConfig{
		PodClient:                 cfg.Client.CoreV1(),
		PodInformer:               pods.Core().V1().Pods(),
		EventRecorder:             recorder,
		Provider:                  a.p,
		ConfigMapInformer:         unused.Core().V1().ConfigMaps(),
		SecretInformer:            unused.Core().V1().Secrets(),
		ServiceInformer:           unused.Core().V1().Services(),
		SkipDownwardAPIResolution: true,
	})
	if err != nil {
		return fmt.Errorf("pod controller: %w", err)
	}
	pods.Start(ctx.Done())
	pcErr := make(chan error, 1)
	go func() { pcErr <- pc.Run(ctx, 4) }()
	select {
	case <-pc.Ready():
	case err := <-pcErr:
		return fmt.Errorf("serve the pods of node %s: %w", cfg.Name, err)
	case <-ctx.Done():
		return nil
	}
	cfg.Log.Info("node registered", "node", cfg.Name, "cpus", cfg.Capacity.CPUs, "memory_mib", cfg.Capacity.MemoryMiB, "sandboxes", cfg.Capacity.Sandboxes)
	select {
	case <-ctx.Done():
		return nil
	case err := <-ncErr:
		return fmt.Errorf("node %s: %w", cfg.Name, err)
	case err := <-pcErr:
		return fmt.Errorf("pods of node %s: %w", cfg.Name, err)
	}
}

// nodeObject is the Node as the agent registers it.
func (a *Agent) nodeObject() *corev1.Node {
	cfg := a.cfg
	c := cfg.Capacity
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(c.CPUs), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(c.MemoryMiB<<20, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(c.DiskMiB<<20, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(int64(c.Sandboxes), resource.DecimalSI),
	}
	now := metav1.Now()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.Name,
			Labels: map[string]string{
				cluster.LabelNode:        "true",
				"type":                   "virtual-kubelet",
				"kubernetes.io/role":     "agent",
				"kubernetes.io/hostname": cfg.Name,
				"kubernetes.io/os":       "linux",
			},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: TaintKey, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady",
				Message: "airlock node agent is serving", LastHeartbeatTime: now, LastTransitionTime: now,
			}},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cfg.Address}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(cfg.Port)}},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: cfg.Version,
			},
		},
	}
}

// dropNotReady removes the not-ready taint the apiserver puts on a new
// Node. kube-controller-manager's node lifecycle controller does that in
// a full cluster once the Node says it is ready; a cluster without one
// (make cluster) would otherwise never place a Pod here. It retries
// until the taint is gone or ctx ends.
func (a *Agent) dropNotReady(ctx context.Context) {
	nodes := a.cfg.Client.CoreV1().Nodes()
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		n, err := nodes.Get(ctx, a.cfg.Name, metav1.GetOptions{})
		if err == nil {
			kept := n.Spec.Taints[:0]
			for _, t := range n.Spec.Taints {
				if t.Key != corev1.TaintNodeNotReady {
					kept = append(kept, t)
				}
			}
			if len(kept) == len(n.Spec.Taints) {
				return
			}
			n.Spec.Taints = kept
			if _, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		a.cfg.Log.Warn("drop the not-ready taint", "node", a.cfg.Name, "err", err, "retry_in", delay.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}
