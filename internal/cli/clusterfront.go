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
	"github.com/airlockhq/airlock/internal/store"
)

// clusterFront is what `serve --cluster kubernetes` adds to a server: the
// cluster controller, which every replica runs and one leads, and the
// router that sends a sandbox's calls to its node.
type clusterFront struct {
	client    kubernetes.Interface
	st        *store.Store
	namespace string
	token     string
	log       *slog.Logger
	ctrl      *cluster.Controller
	router    *cluster.Router
	cancel    context.CancelFunc
	done      chan struct{}
}

// startClusterFront checks the internal token against the store's and
// reaches the apiserver.
func startClusterFront(ctx context.Context, st *store.Store, kubeconfig, namespace, token string, wait time.Duration, log *slog.Logger) (*clusterFront, error) {
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
	return &clusterFront{client: client, st: st, namespace: namespace, token: token, log: log, done: make(chan struct{})}, nil
}

// start runs the controller and the router until stop.
func (c *clusterFront) start(ctx context.Context, reg prometheus.Registerer) error {
	host, _ := os.Hostname()
	ctrl, err := cluster.New(cluster.Config{Client: c.client, Store: c.st, Namespace: c.namespace,
		Identity: fmt.Sprintf("%s-%d", host, os.Getpid()), Log: c.log, Registry: reg})
	if err != nil {
		return err
	}
	cctx, cancel := context.WithCancel(ctx)
	router, err := cluster.NewRouter(cctx, c.client, c.st, c.token, c.log)
	if err != nil {
		cancel()
		return err
	}
	c.ctrl, c.router, c.cancel = ctrl, router, cancel
	go func() { ctrl.Run(cctx); close(c.done) }()
	return nil
}

// admitted tells the controller of a sandbox just recorded.
func (c *clusterFront) admitted(string) {
	if c != nil && c.ctrl != nil {
		c.ctrl.Poke()
	}
}

// stop ends the controller, giving up its Lease if it leads.
func (c *clusterFront) stop() {
	if c.cancel != nil {
		c.cancel()
		<-c.done
	}
}

// nodeDown is service.Config.NodeDown for a replica: the router's view,
// once it runs; nil outside cluster mode.
func (c *clusterFront) nodeDown() func(string) string {
	if c == nil {
		return nil
	}
	return func(node string) string {
		if c.router == nil {
			return ""
		}
		return c.router.NodeDown(node)
	}
}
