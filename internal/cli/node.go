package cli

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
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
	cfg := daemon.Config{Role: daemon.Node, Dir: env.Dir, Log: env.Log, Stdout: env.Stdout, Version: Version(),
		MemoryBytes: hostMemory(), MinFreeDiskBytes: 2 << 30}
	hostname, _ := os.Hostname()
	fs.StringVar(&cfg.NodeName, "name", strings.ToLower(hostname), "`name` of this host's Node, and of the node recorded for its sandboxes")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig `file` to reach the apiserver (default: $KUBECONFIG, else the in-cluster service account)")
	fs.StringVar(&cfg.Namespace, "namespace", "airlock", "`namespace` of the sandbox Pods")
	fs.StringVar(&cfg.Listen, "listen", "0.0.0.0:7701", "`address` of the internal API the cluster's servers reach this node on")
	fs.StringVar(&cfg.Advertise, "advertise", "", "`IP` the cluster's servers reach --listen at (default: --listen's host, else this host's first global address)")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "`file` holding the cluster's internal token (default: $AIRLOCK_NODE_TOKEN)")
	fs.StringVar(&cfg.TLSDir, "cluster-tls", "", "`directory` of the cluster TLS: ca.crt, and tls.crt and tls.key for the "+clustertls.RoleNode+" role (default: $AIRLOCK_CLUSTER_TLS; `airlock cluster-certs` makes them)")
	fs.StringVar(&cfg.Store, "store", "", "the cluster's PostgreSQL `URL` (default: $AIRLOCK_STORE)")
	fs.DurationVar(&cfg.StoreWait, "store-wait", 30*time.Second, "how long to keep trying to reach the store at start")
	fs.DurationVar(&cfg.KubeWait, "kube-wait", 30*time.Second, "how long to keep trying to reach the apiserver at start")
	fs.DurationVar(&cfg.LeaseDuration, "lease-duration", 10*time.Second, "how long the Node's lease holds without a renewal: how soon a dead node is seen")
	fs.StringVar(&cfg.Accel, "accel", "auto", "accelerator: kvm, tcg or auto")
	fs.IntVar(&cfg.CPUs, "cpus", runtime.NumCPU(), "vCPUs this node offers sandboxes")
	fs.Var((*sizeFlag)(&cfg.MemoryBytes), "memory", "guest memory `size` this node offers sandboxes (default: the host's)")
	fs.IntVar(&cfg.MaxSandboxes, "max-sandboxes", 32, "most sandboxes holding a VM at once")
	fs.IntVar(&cfg.MaxStarts, "max-starts", 0, "most sandboxes booting at once (default: twice the CPUs)")
	fs.IntVar(&cfg.MaxQueuedStarts, "max-queued-starts", 64, "most creates waiting for a start slot")
	fs.DurationVar(&cfg.PingInterval, "ping-interval", 15*time.Second, "how often idle event streams get a `: ping`")
	fs.StringVar(&cfg.DefaultEgress, "default-egress", "deny", "egress of sandboxes created without a network policy: allow or deny")
	defaultLimits := fs.String("default-limits", "", "`limits` of user keys where they have none of their own, NAME=N[,NAME=N…] (sandboxes, vcpus, memory_mib, disk_mib, suspended_mib, checkpoints, builds, build_context_mib; default: none)")
	fs.Var((*sizeFlag)(&cfg.MemoryBudgetBytes), "memory-budget", "most memory (`size`, like 16GiB) this host's sandboxes' VMs may hold: creates and wakes past it are refused (default: the host's RAM less 1 GiB)")
	egressPrivate := fs.String("egress-private", "", "comma-separated private `CIDRs` (within 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10) a sandbox's policy may open by naming an address in them (default: none)")
	fs.StringVar(&cfg.DNSUpstream, "dns-upstream", "", "resolver `HOST:PORT` the gateways ask (default: the host's, from /etc/resolv.conf)")
	fs.Var((*sizeFlag)(&cfg.MinFreeDiskBytes), "min-free-disk", "free `size` to keep on the data directory's filesystem: creates and wakes are refused below it; 0: no check")
	trusted := fs.String("trusted-registries", "", "comma-separated registry `hosts` (HOST[:PORT]) template builds on this node may pull docker:// images from (default: any registry at a public address; a registry at a loopback or private address must be listed)")
	fs.BoolVar(&cfg.RegistryHostCredentials, "registry-host-credentials", false, "let pulls without registry_auth use the host's docker config ($DOCKER_CONFIG, ~/.docker/config.json) for the registry they name")
	fs.IntVar(&cfg.MaxBuilds, "max-builds", 1, "most template builds running at once on this node (each boots a sandbox)")
	fs.Int64Var(&cfg.MaxBuildContextMiB, "max-build-context", 1024, "largest build context upload in `MiB`")
	fs.DurationVar(&cfg.ReclaimEvery, "reclaim-interval", 5*time.Minute, "how often to remove the template images nothing in the cluster refers to any more")
	fs.StringVar(&cfg.E2BDomain, "e2b-domain", "", "sandbox `domain` E2B SDKs are told of in the answers this node gives through the servers' E2B API (as serve's --e2b-domain)")
	templatesFrom := fs.String("templates-from", "", "comma-separated https base `URLs` of the API servers' internal listeners (serve --internal-listen) to fetch template images from when no other node has them (in Kubernetes: the Service, https://airlock-internal.airlock.svc:7702)")
	jailOpts := addJailFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	err := nodeFlags(fs, &cfg, jailOpts, *defaultLimits, *egressPrivate, *trusted, *templatesFrom)
	if err == nil {
		err = runDaemon(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}

// nodeFlags reads into cfg what node's flags say beyond their values.
func nodeFlags(fs *flagSet, cfg *daemon.Config, jailOpts jailOptions, defaultLimits, egressPrivate, trusted, templatesFrom string) (err error) {
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	if cfg.TemplatesFrom, err = templateSources(templatesFrom); err != nil {
		return fmt.Errorf("--templates-from: %w", err)
	}
	if cfg.Unjailed, cfg.UIDs, err = jailOpts.parse(); err != nil {
		return err
	}
	if cfg.Store == "" {
		cfg.Store = os.Getenv("AIRLOCK_STORE")
	}
	cfg.Token = os.Getenv("AIRLOCK_NODE_TOKEN")
	if cfg.TLSDir == "" {
		cfg.TLSDir = os.Getenv("AIRLOCK_CLUSTER_TLS")
	}
	if cfg.TrustedRegistries, err = parseRegistries(trusted); err != nil {
		return err
	}
	if cfg.DefaultLimits, err = daemon.ParseLimits(defaultLimits); err != nil {
		return fmt.Errorf("--default-limits: %w", err)
	}
	if cfg.EgressPrivate, err = policy.ParsePrivate(egressPrivate); err != nil {
		return fmt.Errorf("--egress-private: %w", err)
	}
	return nil
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
