package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/store"
)

// clusterFront is what a Front daemon adds to a server: the router that
// sends a sandbox's calls to its node, and the cluster controller, which
// every replica runs and one leads.
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

// checkClusterToken makes sure that token is the cluster's: the store
// keeps the hash of the token the first server or node of the cluster
// started with, and a later one with another token is refused, since
// the cluster's servers could not reach it.
func checkClusterToken(ctx context.Context, st *store.Store, token string) error {
	sum := sha256.Sum256([]byte("airlock node token\x00" + token))
	want := hex.EncodeToString(sum[:])
	got, err := st.EnsureSetting(ctx, "node_token_sha256", want)
	if err != nil {
		return err
	}
	if !sameSecret(got, want) {
		return fmt.Errorf("the internal token is not the cluster's: this store's cluster started with another; give every server and node the same token: %w", errdefs.ErrInvalid)
	}
	return nil
}

// checkClusterKeys makes sure that the data directory's secrets key and
// E2B token key are the cluster's: the store keeps fingerprints of the
// keys the first server or node started with, and a later one with other
// keys is refused, since a secret one replica sealed would not open on
// the node that injects it, nor a token one signed on another.
func checkClusterKeys(ctx context.Context, st *store.Store, dir datadir.Dir, tokenKey []byte) error {
	secretsKey, err := secrets.LoadOrCreateKey(dir.SecretsKey(), secrets.KeySize)
	if err != nil {
		return err
	}
	for _, k := range []struct {
		setting, path string
		key           []byte
	}{
		{"secrets_key_sha256", dir.SecretsKey(), secretsKey},
		{"e2b_token_key_sha256", dir.E2BTokenKey(), tokenKey},
	} {
		sum := sha256.Sum256(append([]byte("airlock key fingerprint\x00"), k.key...))
		want := hex.EncodeToString(sum[:])
		got, err := st.EnsureSetting(ctx, k.setting, want)
		if err != nil {
			return err
		}
		if !sameSecret(got, want) {
			return fmt.Errorf("%s is not the cluster's key: its first server or node started with another; give every server and node the same file (docs/kubernetes.md): %w",
				k.path, errdefs.ErrPrecondition)
		}
	}
	return nil
}

// kubeConfig reads a kubeconfig file, or with none the in-cluster config.
func kubeConfig(file string) (*rest.Config, error) {
	if file == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig or $KUBECONFIG, and not in a cluster: %v: %w", err, errdefs.ErrInvalid)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", file)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %v: %w", file, err, errdefs.ErrInvalid)
	}
	return c, nil
}

// waitAPIServer asks the apiserver its version until it answers, with
// backoff, for up to wait.
func waitAPIServer(ctx context.Context, c kubernetes.Interface, wait time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(wait)
	for backoff := 250 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		_, err := c.Discovery().ServerVersion()
		if err == nil {
			return nil
		}
		if time.Now().Add(backoff).After(deadline) {
			return fmt.Errorf("the apiserver does not answer: %v: gave up after %s (--kube-wait): check --kubeconfig and that the apiserver is reachable: %w",
				err, wait, errdefs.ErrUnavailable)
		}
		log.Warn("apiserver unreachable; trying again", "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// advertised is the IP the cluster reaches the listener at.
func advertised(flag string, ln *net.TCPAddr) (net.IP, error) {
	if flag != "" {
		ip := net.ParseIP(flag)
		if ip == nil {
			return nil, fmt.Errorf("--advertise %q is not an IP address: %w", flag, errdefs.ErrInvalid)
		}
		return ip, nil
	}
	if !ln.IP.IsUnspecified() {
		return ln.IP, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() && n.IP.To4() != nil {
			return n.IP, nil
		}
	}
	return nil, fmt.Errorf("this host has no global IPv4 address to advertise: give --advertise: %w", errdefs.ErrInvalid)
}
