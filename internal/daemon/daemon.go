package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/builds"
	"github.com/airlockhq/airlock/internal/checkpoint"
	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/e2b"
	"github.com/airlockhq/airlock/internal/e2b/envd"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/events"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/node"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/sessions"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/usage"
	"github.com/airlockhq/airlock/internal/webhooks"
)

// shutdownGrace bounds how long Run waits for requests in flight.
const shutdownGrace = 15 * time.Second

// Daemon is an assembled airlock server: New builds it, Run serves it,
// Close lets go of what it holds.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	stdout io.Writer

	st       *store.Store
	rt       *sandbox.Runtime
	svc      *service.Service
	builds   *builds.Service
	events   *events.Service
	webhooks *webhooks.Service
	// checkpoints keeps the checkpoints of the sandboxes here; it sweeps
	// their files in a single host's Run.
	checkpoints *checkpoint.Service
	box         *secrets.Box
	adminKey    string // the admin key made on this start, else ""

	ln, e2bLn, internalLn net.Listener
	apiSrv                *api.Server
	httpSrv               *http.Server
	e2bSrv                *http.Server // nil: E2B's API is not served on a listener of its own
	internalSrv           *http.Server // Front: the template images for the nodes
	envd                  *envd.Server
	// usage samples the sandboxes this server runs, for E2B's getMetrics;
	// nil without E2B's API, and on a Front (whose replicas forward the
	// route to the sandbox's node). Run samples until bg ends.
	usage      *usage.History
	front      *clusterFront // Front only
	agent      *node.Agent   // Node only
	advertised net.IP        // Node only

	// lostStore receives the error of a Local daemon that lost its
	// exclusive hold on the store.
	lostStore chan error
	// bg is the context of the daemon's own goroutines (the purge of old
	// idempotency keys); bgCancel, called by Close, ends them.
	bg       context.Context
	bgCancel context.CancelFunc
}

// New checks cfg (Validate), opens the listeners and builds the server
// cfg describes; it serves nothing until Run. ctx bounds the start and is
// the parent of the daemon's long-lived work. On failure, what it opened
// is closed again.
func New(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	r, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: cfg.Log, stdout: cfg.Stdout, lostStore: make(chan error, 1)}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.stdout == nil {
		d.stdout = io.Discard
	}
	d.bg, d.bgCancel = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if cfg.Role == Node {
		err = d.buildNode(ctx, r)
	} else {
		err = d.buildServe(ctx, r)
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// listen opens a listener on addr, refused off loopback without the jail.
func (d *Daemon) listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %v: %w", addr, err, errdefs.ErrInvalid)
	}
	if d.cfg.Unjailed && !isLoopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("--jail off is for debugging only and is refused on %s: listen on a loopback address: %w", ln.Addr(), errdefs.ErrInvalid)
	}
	return ln, nil
}

// buildServe builds a Local or Front daemon.
func (d *Daemon) buildServe(ctx context.Context, r resolved) error {
	cfg, log := d.cfg, d.log
	var err error
	if d.ln, err = d.listen(cfg.Listen); err != nil {
		return err
	}
	if cfg.E2BListen != "" {
		if d.e2bLn, err = d.listen(cfg.E2BListen); err != nil {
			return err
		}
	}
	if cfg.Unjailed {
		log.Warn("THE JAIL IS OFF: every QEMU runs as this process's user with nothing taken away and no cgroup; a guest that escapes into its VMM owns the host. For debugging only.")
	}
	if err := os.MkdirAll(cfg.Dir.Root, 0o755); err != nil {
		return err
	}
	if d.st, err = OpenStore(ctx, cfg.Dir.Store(), cfg.Store, cfg.StoreWait, log); err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	box, tokenKey, err := d.openKeys()
	if err != nil {
		return err
	}
	if err := d.takeStore(ctx, r, tokenKey); err != nil {
		return err
	}
	reg := newRegistry()
	sc, bc := d.serviceConfig(box, tokenKey), d.buildsConfig()
	sc.Warm = cfg.Warm
	if d.front != nil {
		sc.FrontConfig = service.FrontConfig{Front: true, Admitted: d.front.admitted, NodeDown: d.front.router.NodeDown, Unplaced: d.front.router.Unplaced}
		bc.Role = builds.Role{Front: true, NodeDown: d.front.router.NodeDown}
	}
	if err := d.startService(ctx, sc, bc, reg); err != nil {
		return err
	}
	reg.MustRegister(service.NewSandboxCollector(d.svc, service.SandboxCollectorConfig{Limit: cfg.MetricsPerSandbox}), service.NewPoolCollector(d.svc))

	keyPath := cfg.Dir.AdminKey()
	if d.adminKey, err = d.svc.EnsureAdminKey(ctx, keyPath); err != nil {
		return err
	} else if d.adminKey != "" {
		fmt.Fprintf(d.stdout, "admin API key (shown once; also in %s):\n  %s\n", keyPath, d.adminKey)
	}

	var forward func(http.ResponseWriter, *http.Request, string, string) (bool, error)
	if d.front != nil {
		if err := d.front.startController(reg); err != nil {
			return err
		}
		d.front.router.BuildNode = d.builds.BuildNode
		forward = d.front.router.Forward
	}
	d.events = events.New(events.Config{Store: d.st, Log: log})
	if d.webhooks, err = d.newWebhooks(box); err != nil {
		return err
	}
	d.checkpoints = checkpoint.New(checkpoint.Config{Store: d.st, Sandboxes: d.svc, Log: log})
	d.apiSrv = api.New(api.Config{Service: d.svc, Commands: d.svc.Commands(), Builds: d.builds, Events: d.events, Webhooks: d.webhooks,
		Checkpoints: d.checkpoints, Store: d.st, Log: log, Registry: reg, Secrets: box,
		MetricsOpen: isLoopback(d.ln.Addr()), PingInterval: cfg.PingInterval, Forward: forward, Version: cfg.Version})
	d.httpSrv = &http.Server{Handler: d.apiSrv, ReadHeaderTimeout: 10 * time.Second}
	return d.buildServeEdges(r)
}

// takeStore makes the store this daemon's: a Front's, shared with the
// other replicas, once its keys and token are the cluster's; a Local
// one's for it alone.
func (d *Daemon) takeStore(ctx context.Context, r resolved, tokenKey []byte) error {
	cfg, log := d.cfg, d.log
	var err error
	if cfg.Role == Front {
		// Replicas share the store, and so its secrets' key; the sandboxes
		// are the nodes'.
		if err := checkClusterKeys(ctx, d.st, cfg.Dir, tokenKey); err != nil {
			return err
		}
		if d.front, err = startClusterFront(ctx, d.st, cfg.Kubeconfig, cfg.Namespace, r.token, r.id, cfg.KubeWait, log); err != nil {
			return err
		}
	} else {
		// A second server on one PostgreSQL database would take the first's
		// sandboxes for its own; one that loses the database stops.
		if err := d.st.Exclusive(ctx, func(err error) { d.lostStore <- err }); err != nil {
			return err
		}
		// This server is the store's only one: a claim on an Idempotency-Key is
		// one of a request that died with the last server, and a retry must run.
		if n, err := d.st.ReleaseAllClaims(ctx); err != nil {
			return err
		} else if n > 0 {
			log.Info("released the idempotency keys of requests the last server did not answer", "keys", n)
		}
	}
	return nil
}

// buildServeEdges builds what a Local or Front daemon serves beside the
// API: a Front's internal listener of template images, and E2B's API.
func (d *Daemon) buildServeEdges(r resolved) error {
	cfg, log := d.cfg, d.log
	var err error
	if d.front != nil {
		// The nodes fetch the template images they lack from here, over
		// the cluster TLS.
		if d.internalLn, err = net.Listen("tcp", cfg.InternalListen); err != nil {
			return fmt.Errorf("--internal-listen %s: %v: %w", cfg.InternalListen, err, errdefs.ErrInvalid)
		}
		mux := http.NewServeMux()
		mux.Handle(cluster.TemplatesPath, cluster.ServerGate(api.RequireNodeToken(r.token, cluster.ServeTemplates(template.Open(cfg.Dir)))))
		d.internalSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: r.id.ServerConfig()}
	}
	if d.e2bLn != nil {
		d.envd = envd.New(d.svc, d.svc.Commands(), log)
		ec := e2b.Config{Service: d.svc, Checkpoints: d.checkpoints, Log: log, Domain: cfg.E2BDomain, Envd: d.envd}
		if d.front != nil {
			ec.Forward = d.front.router.ForwardE2B
		} else {
			if d.usage, err = newUsage(d.svc, log); err != nil {
				return err
			}
			ec.Usage = d.usage
		}
		h, err := e2b.New(ec)
		if err != nil {
			return err
		}
		d.e2bSrv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	}
	return nil
}

// buildNode builds a Node daemon.
func (d *Daemon) buildNode(ctx context.Context, r resolved) error {
	cfg := d.cfg
	restCfg, err := kubeConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	if d.ln, err = d.listen(cfg.Listen); err != nil {
		return err
	}
	port := d.ln.Addr().(*net.TCPAddr).Port
	if d.advertised, err = advertised(cfg.Advertise, d.ln.Addr().(*net.TCPAddr)); err != nil {
		return err
	}
	d.log = d.log.With("node", cfg.NodeName)
	log := d.log
	if cfg.Unjailed {
		log.Warn("THE JAIL IS OFF: every QEMU runs as this process's user with nothing taken away and no cgroup; for debugging only.")
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	if d.st, err = OpenStore(ctx, cfg.Dir.Store(), cfg.Store, cfg.StoreWait, log); err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	if err := checkClusterToken(ctx, d.st, r.token); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.Dir.Root, 0o755); err != nil {
		return err
	}
	box, tokenKey, err := d.openKeys()
	if err != nil {
		return err
	}
	if err := checkClusterKeys(ctx, d.st, cfg.Dir, tokenKey); err != nil {
		return err
	}
	if err := waitAPIServer(ctx, client, cfg.KubeWait, log); err != nil {
		return err
	}
	// The cluster's servers take a Node for an airlock node only once its
	// agent, which holds the store's credentials, registered it there.
	endpoint := "https://" + net.JoinHostPort(d.advertised.String(), strconv.Itoa(port))
	if err := d.st.RegisterClusterNode(ctx, cfg.NodeName, endpoint); err != nil {
		return err
	}
	reg := newRegistry()
	fetcher, err := cluster.NewFetcher(ctx, cluster.FetcherConfig{Templates: template.Open(cfg.Dir), Node: cfg.NodeName,
		Client: client, Nodes: d.st, Sources: cfg.TemplatesFrom, Token: r.token, TLS: r.id, Settings: cluster.StoreSettings(d.st), Log: log, Registry: reg})
	if err != nil {
		return err
	}
	sc, bc := d.serviceConfig(box, tokenKey), d.buildsConfig()
	sc.NodeConfig = service.NodeConfig{Node: cfg.NodeName, FetchTemplate: fetcher.Fetch}
	bc.Role = builds.Role{Node: cfg.NodeName, FetchTemplate: fetcher.Fetch, ReclaimEvery: cfg.ReclaimEvery}
	if err := d.startService(ctx, sc, bc, reg); err != nil {
		return err
	}
	reg.MustRegister(service.NewSandboxCollector(d.svc, service.SandboxCollectorConfig{Limit: 100}))

	var fsStat unix.Statfs_t
	if err := unix.Statfs(cfg.Dir.Sandboxes(), &fsStat); err != nil {
		if err := unix.Statfs(cfg.Dir.Root, &fsStat); err != nil {
			return fmt.Errorf("size of the data directory's filesystem: %w", err)
		}
	}
	if d.agent, err = node.New(node.Config{
		Client: client, Namespace: cfg.Namespace, Name: cfg.NodeName, Service: d.svc, Store: d.st,
		Capacity: node.Capacity{CPUs: cfg.CPUs, MemoryMiB: cfg.MemoryBytes >> 20,
			DiskMiB: int64(fsStat.Blocks) * fsStat.Bsize >> 20, Sandboxes: cfg.MaxSandboxes},
		Address: d.advertised.String(), Port: port, LeaseDuration: cfg.LeaseDuration,
		Version: "airlock-" + cfg.Version, Log: log, Registry: reg,
	}); err != nil {
		return err
	}

	d.events = events.New(events.Config{Store: d.st, Log: log})
	if d.webhooks, err = d.newWebhooks(box); err != nil {
		return err
	}
	// A node's checkpoints answer that cluster mode has none yet; no
	// sweep runs here.
	cps := checkpoint.New(checkpoint.Config{Store: d.st, Sandboxes: d.svc, Log: log})
	d.apiSrv = api.New(api.Config{Service: d.svc, Commands: d.svc.Commands(), Builds: d.builds, Events: d.events, Webhooks: d.webhooks, Checkpoints: cps, Store: d.st, Log: log, Registry: reg, Secrets: box, PingInterval: cfg.PingInterval, Version: cfg.Version})
	d.envd = envd.New(d.svc, d.svc.Commands(), log)
	if d.usage, err = newUsage(d.svc, log); err != nil {
		return err
	}
	e2bSrv, err := e2b.New(e2b.Config{Service: d.svc, Checkpoints: cps, Log: log, Domain: cfg.E2BDomain, Envd: d.envd, Usage: d.usage})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", d.apiSrv)
	mux.Handle(cluster.TemplatesPath, cluster.ServeTemplates(template.Open(cfg.Dir)))
	// The replicas' E2B API sends the requests for this node's sandboxes
	// here, their Host kept.
	mux.Handle(cluster.E2BPath+"/", http.StripPrefix(cluster.E2BPath, e2bSrv))
	d.httpSrv = &http.Server{Handler: cluster.NodeGate(api.RequireNodeToken(r.token, mux)), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: r.id.ServerConfig()}
	return nil
}

// serviceConfig is the service's part of the daemon's Config.
func (d *Daemon) serviceConfig(box *secrets.Box, tokenKey []byte) service.Config {
	cfg := d.cfg
	return service.Config{
		Dir: cfg.Dir, Store: d.st, Log: d.log,
		MaxSandboxes: cfg.MaxSandboxes, MaxStarts: cfg.MaxStarts, MaxQueuedStarts: cfg.MaxQueuedStarts,
		DefaultEgress: cfg.DefaultEgress, EgressPrivate: cfg.EgressPrivate, DefaultLimits: cfg.DefaultLimits,
		MemoryBudgetMiB: cfg.MemoryBudgetBytes >> 20, Secrets: box, TokenKey: tokenKey,
		MinFreeDiskBytes: cfg.MinFreeDiskBytes,
	}
}

// buildsConfig is the builds' part of the daemon's Config, for a single
// host; a cluster's role sets Role.
func (d *Daemon) buildsConfig() builds.Config {
	cfg := d.cfg
	return builds.Config{
		Dir: cfg.Dir, Store: d.st, Log: d.log, DefaultEgress: cfg.DefaultEgress,
		TrustedRegistries: cfg.TrustedRegistries, RegistryHostCredentials: cfg.RegistryHostCredentials,
		MaxBuilds: cfg.MaxBuilds, MaxContextBytes: cfg.MaxBuildContextMiB << 20, NoReclaim: cfg.NoReclaim,
	}
}

// startService makes the runtime, the builds and the service over them,
// with their metrics in reg. The gateways look secrets up through the
// service, which needs the runtime first: the service is filled in before
// any sandbox starts. The builds recover before the service (which would
// otherwise find their operations unfinished), and take the service as
// their sandbox side once it is made.
func (d *Daemon) startService(ctx context.Context, sc service.Config, bc builds.Config, reg *prometheus.Registry) error {
	cfg := d.cfg
	var svc *service.Service
	rc := sandbox.Config{Dir: cfg.Dir, Accel: cfg.Accel, BootTimeout: cfg.BootTimeout, Log: d.log, Unjailed: cfg.Unjailed, UIDs: cfg.UIDs,
		Network: sandbox.NetworkConfig{DNSUpstream: cfg.DNSUpstream, Private: cfg.EgressPrivate}}
	rc.Network.Metrics = gateway.NewMetrics(reg)
	rc.Network.Secret = func(ctx context.Context, id, name string) (string, error) {
		return svc.SandboxSecret(ctx, id, name)
	}
	rt, err := sandbox.New(ctx, rc)
	if err != nil {
		return err
	}
	bc.Runtime, bc.Templates, bc.Metrics = rt, rt.Templates(), builds.NewMetrics(reg)
	b, err := builds.New(ctx, bc)
	if err != nil {
		return err
	}
	sc.Runtime, sc.Metrics, sc.CommandMetrics, sc.Catalogue = service.RuntimeOf(rt), service.NewMetrics(reg), sessions.NewMetrics(reg), b
	if svc, err = service.New(ctx, sc); err != nil {
		b.Close()
		return err
	}
	b.Serve(svc)
	d.rt, d.builds, d.svc = rt, b, svc
	return nil
}

// openKeys opens the keys a server keeps in its data directory: the box
// that seals secrets, and the key that signs the envd access tokens of
// the E2B API (kept, so that they stay the same across restarts).
func (d *Daemon) openKeys() (*secrets.Box, []byte, error) {
	box, err := secrets.OpenBox(d.cfg.Dir.SecretsKey())
	if err != nil {
		return nil, nil, err
	}
	tokenKey, err := secrets.LoadOrCreateKey(d.cfg.Dir.E2BTokenKey(), 32)
	if err != nil {
		return nil, nil, err
	}
	d.box = box
	return box, tokenKey, nil
}

// Run serves until ctx ends, a listener fails, the Node's agent fails or
// a Local daemon loses the store to another server, then shuts down: it
// stops taking requests, ends event streams, lets requests in flight
// finish and lets go of the sandboxes, whose VMs keep running. It returns
// nil after a shutdown that ctx or a lost store asked for. Call Close
// after it.
func (d *Daemon) Run(ctx context.Context) error {
	if d.cfg.Role == Node {
		return d.runNode(ctx)
	}
	errc := make(chan error, 3)
	go func() { errc <- d.httpSrv.Serve(d.ln) }()
	if d.internalSrv != nil {
		go func() { errc <- d.internalSrv.ServeTLS(d.internalLn, "", "") }()
		fmt.Fprintf(d.stdout, "airlock serving template images to the cluster's nodes on https://%s\n", d.internalLn.Addr())
	}
	go purgeIdempotent(d.bg, d.st, d.log)
	go d.events.Run(d.bg)
	go d.webhooks.Run(d.bg)
	if d.front == nil {
		go d.checkpoints.Run(d.bg)
	}
	if d.usage != nil {
		go d.usage.Run(d.bg)
	}
	if d.e2bSrv != nil {
		go func() { errc <- d.e2bSrv.Serve(d.e2bLn) }()
		fmt.Fprintf(d.stdout, "airlock serving E2B's API on http://%s\n", d.e2bLn.Addr())
	}
	mode := ""
	if d.front != nil {
		mode = ", cluster kubernetes"
	}
	fmt.Fprintf(d.stdout, "airlock serving on http://%s (accelerator %s, store %s%s)\n", d.ln.Addr(), d.rt.Accel(), d.st.Engine(), mode)

	select {
	case err := <-errc:
		return err
	case err := <-d.lostStore:
		d.log.Error("shutting down: another airlock serve took the store", "err", err)
	case <-ctx.Done():
	}
	// Stop taking requests, end event streams, let requests in flight
	// finish, then let go of the sandboxes (their VMs keep running).
	d.apiSrv.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	d.shutdown(sctx, d.httpSrv, "http shutdown")
	d.shutdown(sctx, d.e2bSrv, "E2B http shutdown")
	d.shutdown(sctx, d.internalSrv, "internal http shutdown")
	d.svc.Close()
	fmt.Fprintln(d.stdout, "airlock stopped; sandboxes keep running")
	return nil
}

// runNode is Run of a Node.
func (d *Daemon) runNode(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() { errc <- d.httpSrv.ServeTLS(d.ln, "", "") }()
	actx, acancel := context.WithCancel(d.bg)
	defer acancel()
	go d.usage.Run(d.bg)
	go func() {
		if err := d.agent.Run(actx); err != nil {
			errc <- err
		}
	}()
	fmt.Fprintf(d.stdout, "airlock node %s serving its sandboxes on https://%s (internal; advertised as %s)\n", d.cfg.NodeName, d.ln.Addr(), d.advertised)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	acancel()
	d.apiSrv.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	d.shutdown(sctx, d.httpSrv, "http shutdown")
	d.svc.Close()
	fmt.Fprintln(d.stdout, "airlock node stopped; sandboxes keep running")
	return nil
}

// shutdown shuts srv down, if there is one, by ctx's deadline.
func (d *Daemon) shutdown(ctx context.Context, srv *http.Server, what string) {
	if srv == nil {
		return
	}
	if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		d.log.Warn(what, "err", err)
	}
}

// Close lets go of everything the daemon holds, in the reverse of the
// order New took it: the E2B API's envd sessions, the daemon's own
// goroutines, the service (sandboxes keep running), the cluster router
// and controller, the store and the listeners. It is safe on a daemon New
// only partly built, and after Run.
func (d *Daemon) Close() {
	if d.envd != nil {
		d.envd.Close()
	}
	d.bgCancel()
	if d.builds != nil {
		d.builds.Close()
	}
	if d.svc != nil {
		d.svc.Close()
	}
	if d.front != nil {
		d.front.stop()
	}
	if d.st != nil {
		d.st.Close()
	}
	for _, ln := range []net.Listener{d.internalLn, d.e2bLn, d.ln} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Addr is the address of the API's listener.
func (d *Daemon) Addr() net.Addr { return d.ln.Addr() }

// E2BAddr is the address of E2B's API's listener, or nil when it has none.
func (d *Daemon) E2BAddr() net.Addr {
	if d.e2bLn == nil {
		return nil
	}
	return d.e2bLn.Addr()
}

// AdminKey is the admin key this start made, or "" when the store had
// one already.
func (d *Daemon) AdminKey() string { return d.adminKey }

// Runtime is the daemon's sandbox runtime.
func (d *Daemon) Runtime() *sandbox.Runtime { return d.rt }

// Service is the daemon's service.
func (d *Daemon) Service() *service.Service { return d.svc }

// Builds is the daemon's template builds and catalogue.
func (d *Daemon) Builds() *builds.Service { return d.builds }

// Store is the daemon's store.
func (d *Daemon) Store() *store.Store { return d.st }

// newRegistry is a metrics registry with the Go and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// newWebhooks is the webhooks service: its receivers may not be the
// host's own addresses, nor any range egress denies but those opened.
func (d *Daemon) newWebhooks(box *secrets.Box) (*webhooks.Service, error) {
	host, err := gateway.HostAddrs()
	if err != nil {
		return nil, err
	}
	return webhooks.New(webhooks.Config{Store: d.st, Secrets: box, Private: d.cfg.WebhookPrivate, Host: host, Log: d.log}), nil
}
