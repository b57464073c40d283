package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/e2b"
	"github.com/airlockhq/airlock/internal/e2b/envd"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

const serveAbout = `Serves airlock's HTTP API (see docs/api.md) until SIGTERM or SIGINT.

On first start it creates an admin API key, prints it once and writes it
to $AIRLOCK_HOME/admin.key (mode 0600). Sandboxes keep running when the
server stops; the next start re-adopts them and their commands.

Every sandbox's network goes through its gateway in this process, which
enforces the sandbox's egress policy (see docs/network.md). A sandbox
created without a policy gets --default-egress, and so do template builds
and E2B creates that say nothing of egress. Loopback, link-local (cloud
metadata), the host's own addresses and the private ranges are denied to
every policy; --egress-private opens parts of the private ranges to
policies that name their addresses literally. Names are resolved
through the host's resolvers (/etc/resolv.conf) or --dns-upstream, and
upstreams of hosts with credentials are verified with the host's roots
(SSL_CERT_FILE is honoured).

With --e2b-listen it also serves E2B's API on a second address, for code
written for E2B's SDKs (see docs/e2b.md): point both E2B_API_URL and
E2B_SANDBOX_URL at it.

Creates, wakes, template builds and sandbox saves write large files: while
the data directory's filesystem has less than --min-free-disk free they
are refused with 429 resource_exhausted, before anything is recorded.
/metrics carries gauges per running sandbox (CPU, memory, disk, labelled
by sandbox ID and template) while at most --metrics-per-sandbox run.

--warm 2:base keeps two clones of base restored, their agent session up,
waiting: a create of base with the template's vCPUs and memory takes one
and only gives it the sandbox's identity (clock, fresh entropy, hostname,
gateway CA and policy, environment, disk size), and the pool makes
another. Members are running VMs: they count against --max-sandboxes (a
create that needs a member's room destroys it) and end with the server. See docs/bench.md for what they save.

  airlock serve
  airlock serve --listen 0.0.0.0:7700 --max-sandboxes 64
  airlock serve --min-free-disk 10GiB --metrics-per-sandbox 0
  airlock serve --default-egress allow --dns-upstream 127.0.0.1:5353
  airlock serve --e2b-listen 127.0.0.1:3000
  airlock serve --warm 4:base --warm 1:code-interpreter
  AIRLOCK_STORE=postgres://airlock@db.internal/airlock airlock serve

The store (keys, sandboxes, operations, commands, secrets, builds) is the
SQLite file airlock.db in the data directory, or with --store (or
$AIRLOCK_STORE) a PostgreSQL database; one server uses one database. Give
the password through PGPASSWORD or ~/.pgpass rather than the command
line. An unreachable PostgreSQL is retried for --store-wait at start; a
connection lost later is remade, and calls meanwhile fail with 503.

With --cluster kubernetes it is one of the API replicas of an airlock
cluster on Kubernetes (docs/kubernetes.md), all on one PostgreSQL store
(--store): it records creates for kube-scheduler to place on the hosts
that run airlock node, runs the cluster controller (one replica leads,
through a Lease in --namespace), and routes every call on a sandbox to
the node that runs it, and template builds to a node, with the cluster's
internal token (--token-file or $AIRLOCK_NODE_TOKEN). It runs no VM
itself (--max-builds, --trusted-registries and --registry-host-credentials
are the nodes' to set).
--e2b-listen serves E2B's API there too, sending each request for a
sandbox to its node; --warm is not served in cluster mode yet.

  airlock serve --cluster kubernetes --store postgres://airlock@db/airlock --token-file /etc/airlock/token

Each sandbox's QEMU runs jailed (docs/hardening.md): as a user of its own
from --jail-uids, in a mount namespace that holds only its files, with no
capabilities, no_new_privs, QEMU's seccomp filter and a cgroup limiting
its CPU, memory, processes and I/O weight. --jail off is for debugging
only: it is logged loudly and refused unless every listener is loopback.`

func runServe(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("serve", "airlock serve [FLAGS]", serveAbout, env)
	listen := fs.String("listen", "127.0.0.1:7700", "`address` to listen on")
	accel := fs.String("accel", "auto", "accelerator: kvm, tcg or auto")
	maxSandboxes := fs.Int("max-sandboxes", 32, "most sandboxes holding a VM at once")
	maxStarts := fs.Int("max-starts", 0, "most sandboxes booting at once (default: twice the CPUs)")
	maxQueued := fs.Int("max-queued-starts", 64, "most creates waiting for a start slot")
	ping := fs.Duration("ping-interval", 15*time.Second, "how often idle event streams get a `: ping`")
	defaultEgress := fs.String("default-egress", "deny", "egress of sandboxes created without a network policy: allow or deny")
	defaultLimits := fs.String("default-limits", "", "`limits` of user keys where they have none of their own, NAME=N[,NAME=N…] (sandboxes, vcpus, memory_mib, disk_mib, suspended_mib, checkpoints, builds, build_context_mib; default: none)")
	var memoryBudget sizeFlag
	fs.Var(&memoryBudget, "memory-budget", "most memory (`size`, like 16GiB) this host's sandboxes' VMs may hold: creates and wakes past it are refused (default: the host's RAM less 1 GiB)")
	egressPrivate := fs.String("egress-private", "", "comma-separated private `CIDRs` (within 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10) a sandbox's policy may open by naming an address in them (default: none)")
	dnsUpstream := fs.String("dns-upstream", "", "resolver `HOST:PORT` the gateways ask (default: the host's, from /etc/resolv.conf)")
	e2bListen := fs.String("e2b-listen", "", "`address` to serve E2B's API on (default: not served)")
	e2bDomain := fs.String("e2b-domain", "", "sandbox `domain` returned to E2B SDKs (default: none, the SDK's own E2B_DOMAIN)")
	trusted := fs.String("trusted-registries", "", "comma-separated registry `hosts` (HOST[:PORT]) template builds may pull docker:// images from (default: any registry at a public address; a registry at a loopback or private address must be listed)")
	hostCreds := fs.Bool("registry-host-credentials", false, "let pulls without registry_auth use the host's docker config ($DOCKER_CONFIG, ~/.docker/config.json) for the registry they name")
	maxBuilds := fs.Int("max-builds", 1, "most template builds running at once (each boots a sandbox)")
	maxContext := fs.Int64("max-build-context", 1024, "largest build context upload in `MiB`")
	minFreeDisk := sizeFlag{n: 2 << 30}
	fs.Var(&minFreeDisk, "min-free-disk", "free `size` (like 512MiB or 2GiB) to keep on the data directory's filesystem: creates, wakes, builds and saves are refused below it; 0: no check")
	jailOpts := addJailFlags(fs)
	var warm warmFlag
	fs.Var(&warm, "warm", "keep `N[:TEMPLATE]` clones of a template (default base) restored and ready, so that a create that fits one only gives it its identity; repeat or comma-separate for more templates")
	storeAddr := fs.String("store", "", "PostgreSQL `URL` (postgres://USER@HOST:PORT/DB) to keep the store in, instead of the SQLite file in the data directory (default: $AIRLOCK_STORE, else the file)")
	storeWait := fs.Duration("store-wait", 30*time.Second, "how long to keep trying to reach the PostgreSQL store at start")
	tlsDir := fs.String("cluster-tls", "", "with --cluster: `directory` of the cluster TLS, ca.crt, and tls.crt and tls.key for the "+clustertls.RoleServer+" role (default: $AIRLOCK_CLUSTER_TLS; `airlock cluster-certs` makes them)")
	internalListen := fs.String("internal-listen", ":7702", "with --cluster: `address` of the TLS listener the nodes fetch template images from (--templates-from https://…)")
	clusterMode := fs.String("cluster", "", "`kubernetes`: serve as an API replica of an airlock cluster on Kubernetes (docs/kubernetes.md), with --store; default: a single host")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "with --cluster: kubeconfig `file` to reach the apiserver (default: $KUBECONFIG, else the in-cluster service account)")
	namespace := fs.String("namespace", "airlock", "with --cluster: `namespace` of the sandbox Pods and the controller's Lease")
	tokenFile := fs.String("token-file", "", "with --cluster: `file` holding the cluster's internal token (default: $AIRLOCK_NODE_TOKEN)")
	kubeWait := fs.Duration("kube-wait", 30*time.Second, "with --cluster: how long to keep trying to reach the apiserver at start")
	perSandbox := fs.Int("metrics-per-sandbox", 100, "most running sandboxes that get their own series on /metrics; with more running, none do; 0: none")
	if err := parse(fs, args); err != nil {
		return err
	}
	unjailed, uids, err := jailOpts.parse()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if *perSandbox < 0 {
		return fmt.Errorf("serve: --metrics-per-sandbox must not be negative (0 turns the series off): %w", errdefs.ErrInvalid)
	}
	trustedRegistries, err := parseRegistries(*trusted)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if *maxBuilds < 1 || *maxContext < 1 {
		return fmt.Errorf("serve: --max-builds and --max-build-context must be at least 1: %w", errdefs.ErrInvalid)
	}
	limits, err := service.ParseLimits(*defaultLimits)
	if err != nil {
		return fmt.Errorf("%s: --default-limits: %w", fs.Name(), err)
	}
	private, err := checkNetworkFlags(*defaultEgress, *dnsUpstream, *egressPrivate)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	if *storeAddr == "" {
		*storeAddr = os.Getenv("AIRLOCK_STORE")
	}
	var token string
	var id *clustertls.Identity
	switch *clusterMode {
	case "":
		var stray []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "cluster-tls" || f.Name == "internal-listen" {
				stray = append(stray, "--"+f.Name)
			}
		})
		if len(stray) > 0 {
			return fmt.Errorf("serve: %s is for an API replica of a cluster (--cluster kubernetes): %w", strings.Join(stray, " and "), errdefs.ErrInvalid)
		}
	case "kubernetes":
		if !store.IsPostgresURL(*storeAddr) {
			return fmt.Errorf("serve: --cluster kubernetes needs the cluster's PostgreSQL store: give --store postgres://… (or $AIRLOCK_STORE): %w", errdefs.ErrInvalid)
		}
		if len(warm) > 0 {
			return fmt.Errorf("serve: --warm is not served in cluster mode yet: %w", errdefs.ErrInvalid)
		}
		if *kubeWait < 0 {
			return fmt.Errorf("serve: --kube-wait must not be negative: %w", errdefs.ErrInvalid)
		}
		t, err := nodeToken(*tokenFile)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		token = t
		if id, err = clusterIdentity(*tlsDir, clustertls.RoleServer); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	default:
		return fmt.Errorf("serve: --cluster %q is not kubernetes: %w", *clusterMode, errdefs.ErrInvalid)
	}
	if *storeWait < 0 {
		return fmt.Errorf("serve: --store-wait must not be negative: %w", errdefs.ErrInvalid)
	}
	if *ping < 100*time.Millisecond {
		return fmt.Errorf("serve: --ping-interval must be at least 100ms: %w", errdefs.ErrInvalid)
	}
	if *maxSandboxes < 1 || *maxStarts < 0 || *maxQueued < 0 {
		return fmt.Errorf("serve: limits must be positive: %w", errdefs.ErrInvalid)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("serve: listen on %s: %v: %w", *listen, err, errdefs.ErrInvalid)
	}
	defer ln.Close()
	if unjailed && !isLoopback(ln.Addr()) {
		return fmt.Errorf("serve: --jail off is for debugging only and is refused on %s: listen on a loopback address: %w", ln.Addr(), errdefs.ErrInvalid)
	}
	var e2bLn net.Listener
	if *e2bListen != "" {
		if e2bLn, err = net.Listen("tcp", *e2bListen); err != nil {
			return fmt.Errorf("serve: listen on %s: %v: %w", *e2bListen, err, errdefs.ErrInvalid)
		}
		defer e2bLn.Close()
		if unjailed && !isLoopback(e2bLn.Addr()) {
			return fmt.Errorf("serve: --jail off is for debugging only and is refused on %s: listen on a loopback address: %w", e2bLn.Addr(), errdefs.ErrInvalid)
		}
	} else if *e2bDomain != "" {
		return fmt.Errorf("serve: --e2b-domain needs --e2b-listen: %w", errdefs.ErrInvalid)
	}
	log := env.Log
	if unjailed {
		log.Warn("THE JAIL IS OFF: every QEMU runs as this process's user with nothing taken away and no cgroup; a guest that escapes into its VMM owns the host. For debugging only.")
	}

	if err := os.MkdirAll(env.Dir.Root, 0o755); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	st, err := openServeStore(ctx, env, *storeAddr, *storeWait, log)
	if err != nil {
		return fmt.Errorf("serve: open store: %w", err)
	}
	defer st.Close()
	box, tokenKey, err := openKeys(env)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	lostStore := make(chan error, 1)
	var cl *clusterFront
	if *clusterMode != "" {
		// Replicas share the store, and so its secrets' key; the sandboxes
		// are the nodes'.
		if err := checkClusterKeys(ctx, st, env.Dir, tokenKey); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		cl, err = startClusterFront(ctx, st, *kubeconfig, *namespace, token, id, *kubeWait, log)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer cl.stop()
	} else {
		// A second server on one PostgreSQL database would take the first's
		// sandboxes for its own; one that loses the database stops.
		if err := st.Exclusive(ctx, func(err error) { lostStore <- err }); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		// This server is the store's only one: a claim on an Idempotency-Key is
		// one of a request that died with the last server, and a retry must run.
		if n, err := st.ReleaseAllClaims(ctx); err != nil {
			return fmt.Errorf("serve: %w", err)
		} else if n > 0 {
			log.Info("released the idempotency keys of requests the last server did not answer", "keys", n)
		}
	}
	reg := newRegistry()
	sc := service.Config{
		Dir: env.Dir, Store: st, Log: log,
		MaxSandboxes: *maxSandboxes, MaxStarts: *maxStarts, MaxQueuedStarts: *maxQueued,
		DefaultEgress: *defaultEgress, EgressPrivate: private, DefaultLimits: limits, MemoryBudgetMiB: memoryBudget.n >> 20, Secrets: box, TokenKey: tokenKey,
		TrustedRegistries: trustedRegistries, RegistryHostCredentials: *hostCreds, MaxBuilds: *maxBuilds, MaxContextBytes: *maxContext << 20,
		MinFreeDiskBytes: minFreeDisk.n, Warm: warm,
	}
	if cl != nil {
		sc.Front, sc.Admitted, sc.NodeDown, sc.Unplaced = true, cl.admitted, cl.router.NodeDown, cl.router.Unplaced
	}
	rt, svc, err := startService(ctx, sandbox.Config{Dir: env.Dir, Accel: *accel, Log: log, Unjailed: unjailed, UIDs: uids,
		Network: sandbox.NetworkConfig{DNSUpstream: *dnsUpstream, Private: private}}, sc, reg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer svc.Close()
	reg.MustRegister(service.NewSandboxCollector(svc, service.SandboxCollectorConfig{Limit: *perSandbox}), service.NewPoolCollector(svc))

	keyPath := env.Dir.AdminKey()
	if key, err := svc.EnsureAdminKey(ctx, keyPath); err != nil {
		return fmt.Errorf("serve: %w", err)
	} else if key != "" {
		fmt.Fprintf(env.Stdout, "admin API key (shown once; also in %s):\n  %s\n", keyPath, key)
	}

	var forward func(http.ResponseWriter, *http.Request, string, string) (bool, error)
	if cl != nil {
		if err := cl.startController(reg); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		cl.router.BuildNode = svc.BuildNode
		forward = cl.router.Forward
	}
	apiSrv := api.New(api.Config{Service: svc, Store: st, Log: log, Registry: reg, Secrets: box,
		MetricsOpen: isLoopback(ln.Addr()), PingInterval: *ping, Forward: forward})
	httpSrv := &http.Server{Handler: apiSrv, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 3)
	go func() { errc <- httpSrv.Serve(ln) }()
	var internalSrv *http.Server
	if cl != nil {
		// The nodes fetch the template images they lack from here, over
		// the cluster TLS.
		iln, err := net.Listen("tcp", *internalListen)
		if err != nil {
			return fmt.Errorf("serve: --internal-listen %s: %v: %w", *internalListen, err, errdefs.ErrInvalid)
		}
		mux := http.NewServeMux()
		mux.Handle(cluster.TemplatesPath, cluster.ServerGate(api.RequireNodeToken(token, cluster.ServeTemplates(template.Open(env.Dir)))))
		internalSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: id.ServerConfig()}
		go func() { errc <- internalSrv.ServeTLS(iln, "", "") }()
		fmt.Fprintf(env.Stdout, "airlock serving template images to the cluster's nodes on https://%s\n", iln.Addr())
	}
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	go purgeIdempotent(pctx, st, log)
	var e2bSrv *http.Server
	if e2bLn != nil {
		envdSrv := envd.New(svc, log)
		defer envdSrv.Close()
		ec := e2b.Config{Service: svc, Log: log, Domain: *e2bDomain, Envd: envdSrv}
		if cl != nil {
			ec.Forward = cl.router.ForwardE2B
		}
		h, err := e2b.New(ec)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		e2bSrv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- e2bSrv.Serve(e2bLn) }()
		fmt.Fprintf(env.Stdout, "airlock serving E2B's API on http://%s\n", e2bLn.Addr())
	}
	mode := ""
	if cl != nil {
		mode = ", cluster kubernetes"
	}
	fmt.Fprintf(env.Stdout, "airlock serving on http://%s (accelerator %s, store %s%s)\n", ln.Addr(), rt.Accel(), st.Engine(), mode)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case err := <-lostStore:
		log.Error("shutting down: another airlock serve took the store", "err", err)
	case <-ctx.Done():
	}
	// Stop taking requests, end event streams, let requests in flight
	// finish, then let go of the sandboxes (their VMs keep running).
	apiSrv.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := httpSrv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("http shutdown", "err", err)
	}
	if e2bSrv != nil {
		if err := e2bSrv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			log.Warn("E2B http shutdown", "err", err)
		}
	}
	if internalSrv != nil {
		if err := internalSrv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			log.Warn("internal http shutdown", "err", err)
		}
	}
	svc.Close()
	fmt.Fprintln(env.Stdout, "airlock stopped; sandboxes keep running")
	return nil
}

// startService makes the runtime and the service over it, with their
// metrics in reg. The gateways look secrets up through the service, which
// needs the runtime first: the service is filled in before any sandbox
// starts.
func startService(ctx context.Context, rc sandbox.Config, sc service.Config, reg *prometheus.Registry) (*sandbox.Runtime, *service.Service, error) {
	var svc *service.Service
	rc.Network.Metrics = gateway.NewMetrics(reg)
	rc.Network.Secret = func(ctx context.Context, id, name string) (string, error) {
		return svc.SandboxSecret(ctx, id, name)
	}
	rt, err := sandbox.New(ctx, rc)
	if err != nil {
		return nil, nil, err
	}
	sc.Runtime, sc.Metrics = service.RuntimeOf(rt), service.NewMetrics(reg)
	svc, err = service.New(ctx, sc)
	if err != nil {
		return nil, nil, err
	}
	return rt, svc, nil
}

// checkNetworkFlags checks --default-egress and --dns-upstream, and reads
// --egress-private.
func checkNetworkFlags(defaultEgress, dnsUpstream, egressPrivate string) ([]netip.Prefix, error) {
	if defaultEgress != "allow" && defaultEgress != "deny" {
		return nil, fmt.Errorf("--default-egress %q is not allow or deny: %w", defaultEgress, errdefs.ErrInvalid)
	}
	if dnsUpstream != "" {
		if _, port, err := net.SplitHostPort(dnsUpstream); err != nil || port == "" {
			return nil, fmt.Errorf("--dns-upstream %q is not HOST:PORT: %w", dnsUpstream, errdefs.ErrInvalid)
		}
	}
	private, err := policy.ParsePrivate(egressPrivate)
	if err != nil {
		return nil, fmt.Errorf("--egress-private: %w", err)
	}
	return private, nil
}

// openKeys opens the keys a server keeps in its data directory: the box
// that seals secrets, and the key that signs the envd access tokens of
// the E2B API (kept, so that they stay the same across restarts).
func openKeys(env *Env) (*secrets.Box, []byte, error) {
	box, err := secrets.OpenBox(env.Dir.SecretsKey())
	if err != nil {
		return nil, nil, err
	}
	tokenKey, err := secrets.LoadOrCreateKey(env.Dir.E2BTokenKey(), 32)
	if err != nil {
		return nil, nil, err
	}
	return box, tokenKey, nil
}

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

// purgeIdempotent drops remembered answers older than a day, hourly,
// until ctx ends.
func purgeIdempotent(ctx context.Context, st *store.Store, log interface{ Warn(string, ...any) }) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if _, err := st.PurgeIdempotent(ctx, time.Now().Add(-24*time.Hour)); err != nil && ctx.Err() == nil {
			log.Warn("purge idempotency keys", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// warmFlag collects --warm's pools: each N[:TEMPLATE], repeated or
// comma-separated.
type warmFlag []sandbox.PoolSpec

func (f *warmFlag) String() string {
	if f == nil {
		return ""
	}
	var parts []string
	for _, p := range *f {
		parts = append(parts, fmt.Sprintf("%d:%s", p.Size, p.Template))
	}
	return strings.Join(parts, ",")
}

func (f *warmFlag) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		p, err := sandbox.ParsePoolSpec(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		for _, q := range *f {
			if q.Template == p.Template {
				return fmt.Errorf("template %s has a warm pool already", p.Template)
			}
		}
		*f = append(*f, p)
	}
	return nil
}

// parseRegistries reads --trusted-registries: comma-separated HOST[:PORT].
func parseRegistries(list string) ([]string, error) {
	var out []string
	for _, h := range strings.Split(list, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if strings.ContainsAny(h, "/ @") {
			return nil, fmt.Errorf("--trusted-registries: %q is not a registry HOST[:PORT]: %w", h, errdefs.ErrInvalid)
		}
		out = append(out, h)
	}
	return out, nil
}
