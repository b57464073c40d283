package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

// LabelNode marks the Nodes of airlock node agents; the RuntimeClass
// airlock selects them (deploy/runtimeclass.yaml).
const LabelNode = "airlock.dev/node"

// Router sends the calls an API replica gets for a sandbox to the node
// that runs it: the node recorded in the sandbox's row, reached at its
// Node's InternalIP and kubelet port, with the cluster's internal token.
// Streams are passed through as they come (no buffering), so an attach
// cut by a replica's death resumes through another with Last-Event-ID.
type Router struct {
	client    kubernetes.Interface
	namespace string // of the sandbox Pods
	st        *store.Store
	nodes     *nodeWatch
	token     string
	log       *slog.Logger
	proxy     *httputil.ReverseProxy
	// BuildNode, if set, names the node that ran, or runs, the build of a
	// template ref ("" for none, or an errdefs.ErrNotFound error): a
	// build's log is there.
	BuildNode func(ctx context.Context, ref string) (string, error)
}

// NewRouter watches the airlock Nodes until ctx ends and returns a Router
// once it has listed them. The sandbox Pods are in namespace. Calls go
// to the nodes through tr: the cluster TLS (clustertls.Identity.Transport
// for the node role).
func NewRouter(ctx context.Context, client kubernetes.Interface, namespace string, st *store.Store, token string, tr http.RoundTripper, log *slog.Logger) (*Router, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nodes, err := watchNodes(ctx, client, st)
	if err != nil {
		return nil, err
	}
	r := &Router{client: client, namespace: namespace, st: st, nodes: nodes, token: token, log: log}
	r.proxy = &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(targetKey{}).(*url.URL))
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set(api.NodeTokenHeader, token)
		},
		FlushInterval: -1, // event streams go through as written
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			node, _ := req.Context().Value(nodeKey{}).(string)
			log.Warn("route to a node failed", "node", node, "path", req.URL.Path, "err", err)
			msg := fmt.Sprintf("node %s, to which this call goes, did not answer (%v): retry shortly", node, err)
			if id, ok := req.Context().Value(e2bKey{}).(string); ok {
				// E2B's proxy shape: the SDKs read a 502 as "not running".
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadGateway)
				json.NewEncoder(w).Encode(map[string]any{"sandboxId": id, "message": msg, "code": http.StatusBadGateway})
				return
			}
			api.WriteError(w, fmt.Errorf("%s: %w", msg, errdefs.ErrUnavailable))
		},
	}
	return r, nil
}

type (
	targetKey struct{}
	nodeKey   struct{}
	e2bKey    struct{} // the sandbox ID of an E2B request
)

// E2BPath is where a node serves E2B's API (control plane and sandbox
// traffic) for its own sandboxes, behind the internal token.
const E2BPath = "/internal/e2b"

// ForwardE2B is e2b.Config.Forward: it sends a request for one sandbox
// through E2B's API to the sandbox's node, under E2BPath with its Host
// kept (which names the sandbox and port for E2B's sandbox traffic). A
// sandbox no node has taken up, or one the store does not know, is left
// to this server.
func (r *Router) ForwardE2B(w http.ResponseWriter, req *http.Request, id string) (bool, error) {
	ctx := req.Context()
	node, err := r.sandboxNode(ctx, id)
	if node == "" || err != nil {
		return false, err
	}
	return r.proxyTo(w, req.WithContext(context.WithValue(ctx, e2bKey{}, id)), node, "sandbox "+id, E2BPath)
}

// sandboxNode is the node that runs sandbox id, "" when none has taken
// it up or the store does not know it.
func (r *Router) sandboxNode(ctx context.Context, id string) (string, error) {
	node, err := r.st.SandboxNode(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && node == store.ReplicaClaim {
		return "", nil
	}
	return node, err
}

// proxyTo sends req to node's internal API, under prefix, unless the
// node is down (an errdefs.ErrUnavailable error that names what).
func (r *Router) proxyTo(w http.ResponseWriter, req *http.Request, node, what, prefix string) (bool, error) {
	if why := r.nodes.down(node, time.Now()); why != "" {
		return false, fmt.Errorf("%s is unavailable: %s; retry later: %w", what, why, errdefs.ErrUnavailable)
	}
	target, err := r.endpoint(node)
	if err != nil {
		return false, err
	}
	target.Path = prefix
	ctx := context.WithValue(context.WithValue(req.Context(), targetKey{}, target), nodeKey{}, node)
	r.proxy.ServeHTTP(w, req.WithContext(ctx))
	return true, nil
}

// Forward is api.Config.Forward: it routes a call on a sandbox, or on a
// command, to the sandbox's node, a template build to the node that
// pickBuildNode picks, and a build's log to the node that ran the build.
// A sandbox no node has taken up yet, one the store does not know, and a
// build no node ran are left to this server.
func (r *Router) Forward(w http.ResponseWriter, req *http.Request, kind, id string) (bool, error) {
	ctx := req.Context()
	var node, what string
	var err error
	switch kind {
	case api.ForwardBuild:
		if node, err = r.buildNode(req); err != nil {
			return false, err
		}
		what = "the build"
	case api.ForwardBuildContext:
		if node, err = r.pickBuildNode(ctx); err != nil {
			return false, err
		}
		what = "the build context's upload"
	case api.ForwardBuildLog:
		if r.BuildNode == nil {
			return false, nil
		}
		node, err = r.BuildNode(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && node == "" {
			return false, nil
		}
		what = "the log of the build of " + id
	default:
		sbx := id
		if kind == api.ForwardCommand {
			cmd, err := r.st.GetCommand(ctx, id)
			if errors.Is(err, errdefs.ErrNotFound) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			sbx = cmd.SandboxID
		}
		if node, err = r.sandboxNode(ctx, sbx); node == "" && err == nil {
			return false, nil
		}
		what = "sandbox " + sbx
	}
	if err != nil {
		return false, err
	}
	return r.proxyTo(w, req, node, what, "")
}

// buildNode is the node a build request goes to: the one its build
// context is on, if it names one, else the one pickBuildNode picks. It
// reads the body (a JSON request, up to api.MaxJSONBody) and puts it
// back for the proxy; one it cannot read is left to the node to refuse.
func (r *Router) buildNode(req *http.Request) (string, error) {
	b, err := io.ReadAll(io.LimitReader(req.Body, api.MaxJSONBody+1))
	req.Body.Close()
	if err != nil {
		return "", fmt.Errorf("read the request: %v: %w", err, errdefs.ErrInvalid)
	}
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b)) // over the bound: the node says so
	var body struct {
		Context string `json:"context"`
		From    string `json:"from"`
	}
	json.Unmarshal(b, &body) // a bad body is the node's to answer
	id := body.Context
	if archive, ok := strings.CutPrefix(body.From, "oci-archive:"); ok && id == "" {
		id = archive
	}
	if id == "" {
		return r.pickBuildNode(req.Context())
	}
	node, err := r.st.BuildContextNode(req.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("build context %s was not uploaded to this cluster, or is gone: upload it again with PUT /v1/build-contexts: %w", id, errdefs.ErrNotFound)
	}
	return node, err
}

// pickBuildNode picks the node a template build runs on: of the airlock
// Nodes whose agent is up and that take new sandboxes (not cordoned, not
// tainted unreachable), the one with the fewest sandboxes not deleted,
// then by name.
func (r *Router) pickBuildNode(ctx context.Context) (string, error) {
	nodes, err := r.nodes.nodes.List(labels.Everything())
	if err != nil {
		return "", err
	}
	placed, err := r.st.SandboxNodes(ctx, apiv1.StateCreating, apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspending,
		apiv1.StateSuspended, apiv1.StateWaking, apiv1.StateDeleting)
	if err != nil {
		return "", err
	}
	load := map[string]int{}
	for _, n := range placed {
		load[n]++
	}
	now := time.Now()
	best := ""
	for _, n := range nodes {
		if n.Spec.Unschedulable || hasTaint(n, TaintUnreachable) || r.nodes.down(n.Name, now) != "" {
			continue
		}
		if best == "" || load[n.Name] < load[best] || load[n.Name] == load[best] && n.Name < best {
			best = n.Name
		}
	}
	if best == "" {
		return "", fmt.Errorf("no airlock node is up and taking work to run the build: start or uncordon one, then retry: %w", errdefs.ErrUnavailable)
	}
	return best, nil
}

// endpoint is the base URL of a node's internal API, from its Node.
func (r *Router) endpoint(node string) (*url.URL, error) {
	return r.nodes.endpoint(node)
}

// endpoint is where node is reached: the base URL its agent registered in
// the store.
func (w *nodeWatch) endpoint(node string) (*url.URL, error) {
	at := w.registeredAt(node)
	if at == "" {
		return nil, fmt.Errorf("node %s is not registered in the cluster's store: %w", node, errdefs.ErrUnavailable)
	}
	u, err := url.Parse(at)
	if err != nil {
		return nil, fmt.Errorf("node %s's registered endpoint %q: %v: %w", node, at, err, errdefs.ErrUnavailable)
	}
	return u, nil
}

// NodeDown says why a node cannot be reached now, "" if it can: for
// service.Config.NodeDown.
func (r *Router) NodeDown(node string) string { return r.nodes.down(node, time.Now()) }

// Unplaced says why kube-scheduler has not bound the Pod of sandbox id
// ("" when it has, when there is no Pod yet, or when the apiserver does
// not answer within a second): the scheduler's message, such as "0/2
// nodes are available: 2 Insufficient cpu".
func (r *Router) Unplaced(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	pod, err := r.client.CoreV1().Pods(r.namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil || pod.Spec.NodeName != "" {
		return ""
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return "no node can take this sandbox yet; its create waits until one can: " + c.Message
		}
	}
	return ""
}
