package cli

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/cluster"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/e2b"
	"github.com/airlockhq/airlock/internal/e2b/envd"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/node"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

const nodeAbout = `Runs this host as a node of an airlock cluster on Kubernetes (see
docs/kubernetes.md) until SIGTERM or SIGINT.

The host registers as a Node named --name, labelled airlock.dev/node=true
and tainted virtual-kubelet.io/provider=airlock:NoSchedule, so that only
sandbox Pods (RuntimeClass airlock) land on it, with its CPUs, memory,
the data directory's disk and --max-sandboxes as capacity. Each sandbox
Pod kube-scheduler binds to it becomes a microVM, made from the sandbox's
row in the cluster's PostgreSQL store (--store, required). The row, not
the Pod, decides when a VM goes: a Pod deleted while its sandbox lives
leaves the VM running. A Pod whose sandbox the store does not know is
refused, and reported on the Pod and in an event.

The node serves airlock's API for its own sandboxes on --listen, the
internal address the cluster's servers route to (the Node's InternalIP is
--advertise), and registers itself in the store at that address: the
servers take a Node for an airlock node only when the store registered it,
whatever its labels say. It is served over TLS with the cluster's own CA
(--cluster-tls): a caller must show a certificate of that CA, a server's
for anything, another node's for template images only. Every request
there must carry the cluster's internal token as well (--token-file, or
$AIRLOCK_NODE_TOKEN: at least 32 characters, the same on every server and
node), and an API key.

The store keeps the hash of the token the cluster's first node started
with; a node with another token is refused at start.

A sandbox's template is pinned by digest when a server admits it. A node
that lacks that image fetches it from the cluster's other nodes, then
from --templates-from (the API servers' address), checks it against its
sha256 digest and keeps it; the node serves its own images to the others
the same way, behind the internal token.

The servers send template builds and build context uploads to the nodes
(a build to the node its context is on), and saves to the sandbox's
node. A node runs them (--max-builds at once, pulling only
from --trusted-registries if given) and records the result's name:tag in
the store's catalogue, where every server and node finds it, rather than
in its data directory. It keeps an image while the catalogue names it or
a sandbox uses it, and reclaims the others after its own builds and
deletes and every --reclaim-interval.

An unreachable store or apiserver is retried for --store-wait and
--kube-wait at start. Sandboxes keep running when the node stops; the
next start re-adopts those recorded on it.

  airlock node --store postgres://airlock@db/airlock --token-file /etc/airlock/token
  airlock node --kubeconfig ~/.kube/config --name host-a --listen 10.0.0.5:7701`

func runNode(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("node", "airlock node --store URL [FLAGS]", nodeAbout, env)
	hostname, _ := os.Hostname()
	name := fs.String("name", strings.ToLower(hostname), "`name` of this host's Node, and of the node recorded for its sandboxes")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig `file` to reach the apiserver (default: $KUBECONFIG, else the in-cluster service account)")
	namespace := fs.String("namespace", "airlock", "`namespace` of the sandbox Pods")
	listen := fs.String("listen", "0.0.0.0:7701", "`address` of the internal API the cluster's servers reach this node on")
	advertise := fs.String("advertise", "", "`IP` the cluster's servers reach --listen at (default: --listen's host, else this host's first global address)")
	tokenFile := fs.String("token-file", "", "`file` holding the cluster's internal token (default: $AIRLOCK_NODE_TOKEN)")
	tlsDir := fs.String("cluster-tls", "", "`directory` of the cluster TLS: ca.crt, and tls.crt and tls.key for the "+clustertls.RoleNode+" role (default: $AIRLOCK_CLUSTER_TLS; `airlock cluster-certs` makes them)")
	storeAddr := fs.String("store", "", "the cluster's PostgreSQL `URL` (default: $AIRLOCK_STORE)")
	storeWait := fs.Duration("store-wait", 30*time.Second, "how long to keep trying to reach the store at start")
	kubeWait := fs.Duration("kube-wait", 30*time.Second, "how long to keep trying to reach the apiserver at start")
	lease := fs.Duration("lease-duration", 10*time.Second, "how long the Node's lease holds without a renewal: how soon a dead node is seen")
	accel := fs.String("accel", "auto", "accelerator: kvm, tcg or auto")
	cpus := fs.Int("cpus", runtime.NumCPU(), "vCPUs this node offers sandboxes")
	memory := sizeFlag{n: hostMemory()}
	fs.Var(&memory, "memory", "guest memory `size` this node offers sandboxes (default: the host's)")
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
	minFreeDisk := sizeFlag{n: 2 << 30}
	fs.Var(&minFreeDisk, "min-free-disk", "free `size` to keep on the data directory's filesystem: creates and wakes are refused below it; 0: no check")
	trusted := fs.String("trusted-registries", "", "comma-separated registry `hosts` (HOST[:PORT]) template builds on this node may pull docker:// images from (default: any registry at a public address; a registry at a loopback or private address must be listed)")
	hostCreds := fs.Bool("registry-host-credentials", false, "let pulls without registry_auth use the host's docker config ($DOCKER_CONFIG, ~/.docker/config.json) for the registry they name")
	maxBuilds := fs.Int("max-builds", 1, "most template builds running at once on this node (each boots a sandbox)")
	maxContext := fs.Int64("max-build-context", 1024, "largest build context upload in `MiB`")
	reclaimEvery := fs.Duration("reclaim-interval", 5*time.Minute, "how often to remove the template images nothing in the cluster refers to any more")
	e2bDomain := fs.String("e2b-domain", "", "sandbox `domain` E2B SDKs are told of in the answers this node gives through the servers' E2B API (as serve's --e2b-domain)")
	templatesFrom := fs.String("templates-from", "", "comma-separated https base `URLs` of the API servers' internal listeners (serve --internal-listen) to fetch template images from when no other node has them (in Kubernetes: the Service, https://airlock-internal.airlock.svc:7702)")
	jailOpts := addJailFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("node: unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	sources, err := templateSources(*templatesFrom)
	if err != nil {
		return fmt.Errorf("node: --templates-from: %w", err)
	}
	unjailed, uids, err := jailOpts.parse()
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := checkNodeName(*name); err != nil {
		return fmt.Errorf("node: --name: %w", err)
	}
	if *storeAddr == "" {
		*storeAddr = os.Getenv("AIRLOCK_STORE")
	}
	if !store.IsPostgresURL(*storeAddr) {
		return fmt.Errorf("node: --store (or $AIRLOCK_STORE) must be the cluster's postgres:// URL: %w", errdefs.ErrInvalid)
	}
	token, err := nodeToken(*tokenFile)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	id, err := clusterIdentity(*tlsDir, clustertls.RoleNode)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if *cpus < 1 || memory.n < 1<<20 || *maxSandboxes < 1 || *maxStarts < 0 || *maxQueued < 0 {
		return fmt.Errorf("node: --cpus, --memory and the limits must be positive: %w", errdefs.ErrInvalid)
	}
	if *storeWait < 0 || *kubeWait < 0 {
		return fmt.Errorf("node: --store-wait and --kube-wait must not be negative: %w", errdefs.ErrInvalid)
	}
	if *lease < 4*time.Second || *lease > 10*time.Minute {
		return fmt.Errorf("node: --lease-duration must be between 4s and 10m: %w", errdefs.ErrInvalid)
	}
	if *ping < 100*time.Millisecond {
		return fmt.Errorf("node: --ping-interval must be at least 100ms: %w", errdefs.ErrInvalid)
	}
	if err := e2b.CheckDomain(*e2bDomain); err != nil {
		return fmt.Errorf("node: --e2b-domain: %w", err)
	}
	if *maxBuilds < 1 || *maxContext < 1 {
		return fmt.Errorf("node: --max-builds and --max-build-context must be at least 1: %w", errdefs.ErrInvalid)
	}
	if *reclaimEvery < time.Second || *reclaimEvery > 24*time.Hour {
		return fmt.Errorf("node: --reclaim-interval must be between 1s and 24h: %w", errdefs.ErrInvalid)
	}
	trustedRegistries, err := parseRegistries(*trusted)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	limits, err := service.ParseLimits(*defaultLimits)
	if err != nil {
		return fmt.Errorf("%s: --default-limits: %w", fs.Name(), err)
	}
	private, err := checkNetworkFlags(*defaultEgress, *dnsUpstream, *egressPrivate)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	restCfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("node: listen on %s: %v: %w", *listen, err, errdefs.ErrInvalid)
	}
	defer ln.Close()
	if unjailed && !isLoopback(ln.Addr()) {
		return fmt.Errorf("node: --jail off is for debugging only and is refused on %s: listen on a loopback address: %w", ln.Addr(), errdefs.ErrInvalid)
	}
	addr, err := advertised(*advertise, ln.Addr().(*net.TCPAddr))
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	log := env.Log.With("node", *name)
	if unjailed {
		log.Warn("THE JAIL IS OFF: every QEMU runs as this process's user with nothing taken away and no cgroup; for debugging only.")
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	st, err := openServeStore(ctx, env, *storeAddr, *storeWait, log)
	if err != nil {
		return fmt.Errorf("node: open store: %w", err)
	}
	defer st.Close()
	if err := checkClusterToken(ctx, st, token); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := os.MkdirAll(env.Dir.Root, 0o755); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	box, tokenKey, err := openKeys(env)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := checkClusterKeys(ctx, st, env.Dir, tokenKey); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := waitAPIServer(ctx, client, *kubeWait, log); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	// The cluster's servers take a Node for an airlock node only once its
	// agent, which holds the store's credentials, registered it there.
	endpoint := "https://" + net.JoinHostPort(addr.String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	if err := st.RegisterClusterNode(ctx, *name, endpoint); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	reg := newRegistry()
	fetcher, err := cluster.NewFetcher(ctx, cluster.FetcherConfig{Templates: template.Open(env.Dir), Node: *name,
		Client: client, Nodes: st, Sources: sources, Token: token, TLS: id, Settings: cluster.StoreSettings(st), Log: log, Registry: reg})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	_, svc, err := startService(ctx, sandbox.Config{Dir: env.Dir, Accel: *accel, Log: log, Unjailed: unjailed, UIDs: uids,
		Network: sandbox.NetworkConfig{DNSUpstream: *dnsUpstream, Private: private}}, service.Config{
		Dir: env.Dir, Store: st, Log: log, Node: *name,
		MaxSandboxes: *maxSandboxes, MaxStarts: *maxStarts, MaxQueuedStarts: *maxQueued,
		DefaultEgress: *defaultEgress, EgressPrivate: private, DefaultLimits: limits, MemoryBudgetMiB: memoryBudget.n >> 20, Secrets: box, TokenKey: tokenKey, MinFreeDiskBytes: minFreeDisk.n,
		TrustedRegistries: trustedRegistries, RegistryHostCredentials: *hostCreds, MaxBuilds: *maxBuilds, MaxContextBytes: *maxContext << 20, ReclaimEvery: *reclaimEvery,
		FetchTemplate: fetcher.Fetch,
	}, reg)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	defer svc.Close()
	reg.MustRegister(service.NewSandboxCollector(svc, service.SandboxCollectorConfig{Limit: 100}))

	var fsStat unix.Statfs_t
	if err := unix.Statfs(env.Dir.Sandboxes(), &fsStat); err != nil {
		if err := unix.Statfs(env.Dir.Root, &fsStat); err != nil {
			return fmt.Errorf("node: size of the data directory's filesystem: %w", err)
		}
	}
	agent, err := node.New(node.Config{
		Client: client, Namespace: *namespace, Name: *name, Service: svc, Store: st,
		Capacity: node.Capacity{CPUs: *cpus, MemoryMiB: memory.n >> 20,
			DiskMiB: int64(fsStat.Blocks) * fsStat.Bsize >> 20, Sandboxes: *maxSandboxes},
		Address: addr.String(), Port: ln.Addr().(*net.TCPAddr).Port, LeaseDuration: *lease,
		Version: "airlock-" + Version(), Log: log, Registry: reg,
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}

	apiSrv := api.New(api.Config{Service: svc, Store: st, Log: log, Registry: reg, Secrets: box, PingInterval: *ping})
	envdSrv := envd.New(svc, log)
	defer envdSrv.Close()
	e2bSrv, err := e2b.New(e2b.Config{Service: svc, Log: log, Domain: *e2bDomain, Envd: envdSrv})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", apiSrv)
	mux.Handle(cluster.TemplatesPath, cluster.ServeTemplates(template.Open(env.Dir)))
	// The replicas' E2B API sends the requests for this node's sandboxes
	// here, their Host kept.
	mux.Handle(cluster.E2BPath+"/", http.StripPrefix(cluster.E2BPath, e2bSrv))
	httpSrv := &http.Server{Handler: cluster.NodeGate(api.RequireNodeToken(token, mux)), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: id.ServerConfig()}
	errc := make(chan error, 2)
	go func() { errc <- httpSrv.ServeTLS(ln, "", "") }()
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	go func() {
		if err := agent.Run(actx); err != nil {
			errc <- err
		}
	}()
	fmt.Fprintf(env.Stdout, "airlock node %s serving its sandboxes on https://%s (internal; advertised as %s)\n", *name, ln.Addr(), addr)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	select {
	case err := <-errc:
		return fmt.Errorf("node: %w", err)
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case <-ctx.Done():
	}
	acancel()
	apiSrv.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := httpSrv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("http shutdown", "err", err)
	}
	svc.Close()
	fmt.Fprintln(env.Stdout, "airlock node stopped; sandboxes keep running")
	return nil
}

// checkNodeName accepts a Kubernetes Node name: a DNS subdomain.
func checkNodeName(n string) error {
	if n == "" || len(n) > 253 {
		return fmt.Errorf("%q is not 1 to 253 characters: %w", n, errdefs.ErrInvalid)
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' || len(label) > 63 {
			return fmt.Errorf("%q is not a DNS name (lower case letters, digits, '-' and '.'): %w", n, errdefs.ErrInvalid)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("%q is not a DNS name (lower case letters, digits, '-' and '.'): %w", n, errdefs.ErrInvalid)
			}
		}
	}
	return nil
}

// nodeToken reads the internal token from file, else $AIRLOCK_NODE_TOKEN.
func nodeToken(file string) (string, error) {
	token := os.Getenv("AIRLOCK_NODE_TOKEN")
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %v: %w", err, errdefs.ErrInvalid)
		}
		token = string(b)
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", fmt.Errorf("no internal token: give --token-file or $AIRLOCK_NODE_TOKEN (the same on every server and node, for example from `openssl rand -hex 32`): %w", errdefs.ErrInvalid)
	}
	if len(token) < api.MinNodeTokenLen || strings.ContainsAny(token, " \t\r\n\x00") {
		return "", fmt.Errorf("the internal token must be at least %d characters with no spaces, for example from `openssl rand -hex 32`: %w", api.MinNodeTokenLen, errdefs.ErrInvalid)
	}
	return token, nil
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
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
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
		if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
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
func waitAPIServer(ctx context.Context, c kubernetes.Interface, wait time.Duration, log interface{ Warn(string, ...any) }) error {
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

// hostMemory is the host's memory in bytes, from sysinfo.
func hostMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// templateSources parses --templates-from: base URLs, http or https,
// with a host and nothing after the path.
func templateSources(list string) ([]*url.URL, error) {
	var out []*url.URL
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("%q is not a base URL such as http://airlock.airlock.svc: %w", s, errdefs.ErrInvalid)
		}
		out = append(out, u)
	}
	return out, nil
}

// clusterIdentity loads the cluster TLS of role from dir, else
// $AIRLOCK_CLUSTER_TLS.
func clusterIdentity(dir, role string) (*clustertls.Identity, error) {
	if dir == "" {
		dir = os.Getenv("AIRLOCK_CLUSTER_TLS")
	}
	if dir == "" {
		return nil, fmt.Errorf("cluster traffic is TLS: give --cluster-tls DIR (or $AIRLOCK_CLUSTER_TLS) holding ca.crt, tls.crt and tls.key for the %s role; `airlock cluster-certs DIR` makes them: %w", role, errdefs.ErrInvalid)
	}
	return clustertls.Load(dir, role)
}
