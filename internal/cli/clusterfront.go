package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/store"
)

// clusterFront is what `serve --cluster kubernetes` adds to a server: the
// router that sends a sandbox's calls to its node, and the cluster
// controller, which every replica runs and one leads.
type clusterFront struct {
	client    kubernetes.Interface
	st        *store.Store
	namespace string
	log       *slog.Logger
	router    *cluster.Router
	ctrl      *cluster.Controller
	ctx       context.Context // ended by stop
	cancel    context.CancelFunc
	done      chan struct{}
}

// startClusterFront checks the internal token against the store's,
// reaches the apiserver and starts the router; stop ends it.
func startClusterFront(ctx context.Context, st *store.Store, kubeconfig, namespace, token string, id *clustertls.Identity, wait time.Duration, log *slog.Logger) (*clusterFront, error) {
	if err := checkClusterToken(ctx, st, token); err != nil {
		return nil, err
	}
	cfg, err := kubeConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := waitAPIServer(ctx, client, wait, log); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	router, err := cluster.NewRouter(cctx, client, namespace, st, token, id.Transport(clustertls.RoleNode), log)
	if err != nil {
		cancel()
		return nil, err
	}
	return &clusterFront{client: client, st: st, namespace: namespace, log: log, router: router,
		ctx: cctx, cancel: cancel, done: make(chan struct{})}, nil
}

// startController runs the controller, with its metrics in reg, until
// stop.
func (c *clusterFront) startController(reg prometheus.Registerer) error {
	host, _ := os.Hostname()
	ctrl, err := cluster.New(cluster.Config{Client: c.client, Store: c.st, Namespace: c.namespace,
		Identity: fmt.Sprintf("%s-%d", host, os.Getpid()), Log: c.log, Registry: reg})
	if err != nil {
		return err
	}
	c.ctrl = ctrl
	go func() { ctrl.Run(c.ctx); close(c.done) }()
	return nil
}

// admitted tells the controller of a sandbox just recorded; before the
// controller runs, its first pass finds it.
func (c *clusterFront) admitted() {
	if c.ctrl != nil {
		c.ctrl.Poke()
	}
}

// stop ends the router and the controller, which gives up its Lease if
// it leads.
func (c *clusterFront) stop() {
	c.cancel()
	if c.ctrl != nil {
		<-c.done
	}
}
