package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// provider is virtual-kubelet's view of the node: it makes the VMs of
// the sandbox Pods bound here through the service, and reads their
// status from the store. virtual-kubelet polls GetPodStatus every few
// seconds (it wraps a provider that does not notify).
type provider struct {
	svc      *service.Service
	st       *store.Store
	node     string
	addr     string
	log      *slog.Logger
	recorder record.EventRecorder
	refused  *prometheus.CounterVec

	mu   sync.Mutex
	pods map[string]*corev1.Pod // the Pods given to CreatePod, by namespace/name
}

func newProvider(cfg Config) *provider {
	return &provider{
		svc: cfg.Service, st: cfg.Store, node: cfg.Name, addr: cfg.Address, log: cfg.Log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_node_refused_pods_total",
			Help: "Sandbox Pods bound to this node that it refused to make a VM for, by reason (unknown: the store has no such sandbox).",
		}, []string{"reason"}),
		pods: map[string]*corev1.Pod{},
	}
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// sandboxOf is the sandbox a Pod stands for: its label, which the
// controller sets to the Pod's name.
func sandboxOf(pod *corev1.Pod) (string, error) {
	id := pod.Labels[cluster.LabelSandbox]
	if id == "" || id != pod.Name {
		return "", fmt.Errorf("pod %s/%s is not a sandbox's: its %s label is %q", pod.Namespace, pod.Name, cluster.LabelSandbox, id)
	}
	return id, nil
}

// CreatePod makes the Pod's sandbox on this node, or takes up the one
// the node already runs. A Pod of a sandbox the store does not know is
// refused and reported, and nothing is made for it.
func (p *provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	id, err := sandboxOf(pod)
	if err == nil {
		err = p.svc.Realize(ctx, id)
	}
	if errors.Is(err, errdefs.ErrNotFound) || err != nil && id == "" {
		p.refused.WithLabelValues("unknown").Inc()
		p.log.Warn("refused a pod whose sandbox the store does not know", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		return vkerrdefs.AsInvalidInput(fmt.Errorf("airlock has no sandbox %s: the Pod is left alone and no VM is made: %w", pod.Name, err))
	}
	if err != nil {
		p.refused.WithLabelValues("other").Inc()
		p.log.Warn("could not make a pod's sandbox", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		return err
	}
	p.mu.Lock()
	p.pods[podKey(pod.Namespace, pod.Name)] = pod.DeepCopy()
	p.mu.Unlock()
	return nil
}

// UpdatePod keeps the newer Pod: nothing of a sandbox comes from a Pod
// after its create.
func (p *provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods[podKey(pod.Namespace, pod.Name)] = pod.DeepCopy()
	return nil
}

// DeletePod forgets the Pod. The VM goes only when the store says the
// sandbox has ended, which the service's delete carries out: a Pod
// deleted while its sandbox lives (evicted from a NotReady node, or
// removed by hand) leaves the VM running, and the controller makes the
// Pod again here.
func (p *provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	delete(p.pods, podKey(pod.Namespace, pod.Name))
	p.mu.Unlock()
	id, err := sandboxOf(pod)
	if err != nil {
		return nil
	}
	sb, err := p.st.GetSandbox(ctx, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		return err
	}
	if sb.State != apiv1.StateDeleted && sb.State != apiv1.StateFailed {
		p.log.Info("pod deleted while its sandbox lives: the VM stays", "sandbox", id, "state", sb.State)
		if p.recorder != nil {
			p.recorder.Eventf(pod, corev1.EventTypeNormal, "VMKept", "sandbox %s is %s: its VM stays on %s until the sandbox is deleted", id, sb.State, p.node)
		}
	}
	return nil
}

// GetPod returns the Pod as CreatePod or UpdatePod last had it.
func (p *provider) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[podKey(namespace, name)]
	if !ok {
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on node %s", namespace, name, p.node)
	}
	return pod.DeepCopy(), nil
}

// GetPods returns the Pods the node holds.
func (p *provider) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.DeepCopy())
	}
	return out, nil
}

// GetPodStatus is the status of a sandbox's Pod, from the sandbox's row:
// pending while it is made, running while it has a VM or a snapshot on
// this node, failed or succeeded once it has ended.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	sb, err := p.st.GetSandbox(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, vkerrdefs.NotFoundf("airlock has no sandbox %s", name)
	}
	if err != nil {
		return nil, err
	}
	on, err := p.st.SandboxNode(ctx, name)
	if err != nil {
		return nil, err
	}
	if on != "" && on != p.node {
		return nil, vkerrdefs.NotFoundf("sandbox %s is on node %s", name, on)
	}
	return podStatus(sb, p.addr), nil
}

// podStatus maps a sandbox's row to its Pod's status.
func podStatus(sb store.Sandbox, addr string) *corev1.PodStatus {
	created := metav1.NewTime(sb.CreatedAt)
	st := &corev1.PodStatus{HostIP: addr, PodIP: addr, StartTime: &created, Message: "sandbox " + sb.State}
	if addr != "" {
		st.HostIPs = []corev1.HostIP{{IP: addr}}
		st.PodIPs = []corev1.PodIP{{IP: addr}}
	}
	cs := corev1.ContainerStatus{Name: "sandbox", Image: "airlock.dev/template@" + sb.TemplateDigest, ImageID: sb.TemplateDigest}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.NewTime(sb.UpdatedAt)}
	}
	switch sb.State {
	case apiv1.StateCreating:
		st.Phase = corev1.PodPending
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "Creating", Message: "the sandbox's VM is being made"}
	case apiv1.StateDeleted:
		st.Phase = corev1.PodSucceeded
		cs.State.Terminated = &corev1.ContainerStateTerminated{Reason: "Deleted", FinishedAt: metav1.NewTime(sb.UpdatedAt), StartedAt: created}
	case apiv1.StateFailed:
		st.Phase, st.Reason = corev1.PodFailed, "SandboxFailed"
		msg := "the sandbox failed"
		if sb.LastError != nil {
			msg = sb.LastError.Message
		}
		st.Message = msg
		cs.State.Terminated = &corev1.ContainerStateTerminated{Reason: "Failed", Message: msg, ExitCode: 1, FinishedAt: metav1.NewTime(sb.UpdatedAt), StartedAt: created}
	default:
		st.Phase = corev1.PodRunning
		cs.Ready, cs.Started = sb.State == apiv1.StateRunning, ptr(true)
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: created}
	}
	running := st.Phase == corev1.PodRunning
	st.Conditions = []corev1.PodCondition{
		cond(corev1.PodScheduled, true),
		cond(corev1.PodInitialized, true),
		cond(corev1.ContainersReady, running && cs.Ready),
		cond(corev1.PodReady, running && cs.Ready),
	}
	st.ContainerStatuses = []corev1.ContainerStatus{cs}
	return st
}

func ptr[T any](v T) *T { return &v }

// provider is what virtual-kubelet drives.
var _ vknode.PodLifecycleHandler = (*provider)(nil)
