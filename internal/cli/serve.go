package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/webhooks"
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
	cfg := daemon.Config{Dir: env.Dir, Log: env.Log, Stdout: env.Stdout, MinFreeDiskBytes: 2 << 30, Version: Version()}
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7700", "`address` to listen on")
	fs.StringVar(&cfg.Accel, "accel", "auto", "accelerator: kvm, tcg or auto")
	fs.IntVar(&cfg.MaxSandboxes, "max-sandboxes", 32, "most sandboxes holding a VM at once")
	fs.IntVar(&cfg.MaxStarts, "max-starts", 0, "most sandboxes booting at once (default: twice the CPUs)")
	fs.IntVar(&cfg.MaxQueuedStarts, "max-queued-starts", 64, "most creates waiting for a start slot")
	fs.DurationVar(&cfg.PingInterval, "ping-interval", 15*time.Second, "how often idle event streams get a `: ping`")
	fs.StringVar(&cfg.DefaultEgress, "default-egress", "deny", "egress of sandboxes created without a network policy: allow or deny")
	defaultLimits := fs.String("default-limits", "", "`limits` of user keys where they have none of their own, NAME=N[,NAME=N…] (sandboxes, vcpus, memory_mib, disk_mib, suspended_mib, checkpoints, builds, build_context_mib; default: none)")
	fs.Var((*sizeFlag)(&cfg.MemoryBudgetBytes), "memory-budget", "most memory (`size`, like 16GiB) this host's sandboxes' VMs may hold: creates and wakes past it are refused (default: the host's RAM less 1 GiB)")
	egressPrivate := fs.String("egress-private", "", "comma-separated private `CIDRs` (within 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10) a sandbox's policy may open by naming an address in them (default: none)")
	webhookPrivate := fs.String("webhook-private", "", "comma-separated `CIDRs` webhooks may point into though egress denies them (loopback, private, link-local): your own receivers (default: none)")
	fs.StringVar(&cfg.DNSUpstream, "dns-upstream", "", "resolver `HOST:PORT` the gateways ask (default: the host's, from /etc/resolv.conf)")
	fs.StringVar(&cfg.E2BListen, "e2b-listen", "", "`address` to serve E2B's API on (default: not served)")
	fs.StringVar(&cfg.E2BDomain, "e2b-domain", "", "sandbox `domain` returned to E2B SDKs (default: none, the SDK's own E2B_DOMAIN)")
	trusted := fs.String("trusted-registries", "", "comma-separated registry `hosts` (HOST[:PORT]) template builds may pull docker:// images from (default: any registry at a public address; a registry at a loopback or private address must be listed)")
	fs.BoolVar(&cfg.RegistryHostCredentials, "registry-host-credentials", false, "let pulls without registry_auth use the host's docker config ($DOCKER_CONFIG, ~/.docker/config.json) for the registry they name")
	fs.IntVar(&cfg.MaxBuilds, "max-builds", 1, "most template builds running at once (each boots a sandbox)")
	fs.Int64Var(&cfg.MaxBuildContextMiB, "max-build-context", 1024, "largest build context upload in `MiB`")
	fs.Var((*sizeFlag)(&cfg.MinFreeDiskBytes), "min-free-disk", "free `size` (like 512MiB or 2GiB) to keep on the data directory's filesystem: creates, wakes, builds and saves are refused below it; 0: no check")
	jailOpts := addJailFlags(fs)
	fs.Var((*warmFlag)(&cfg.Warm), "warm", "keep `N[:TEMPLATE]` clones of a template (default base) restored and ready, so that a create that fits one only gives it its identity; repeat or comma-separate for more templates")
	fs.StringVar(&cfg.Store, "store", "", "PostgreSQL `URL` (postgres://USER@HOST:PORT/DB) to keep the store in, instead of the SQLite file in the data directory (default: $AIRLOCK_STORE, else the file)")
	fs.DurationVar(&cfg.StoreWait, "store-wait", 30*time.Second, "how long to keep trying to reach the PostgreSQL store at start")
	fs.StringVar(&cfg.TLSDir, "cluster-tls", "", "with --cluster: `directory` of the cluster TLS, ca.crt, and tls.crt and tls.key for the "+clustertls.RoleServer+" role (default: $AIRLOCK_CLUSTER_TLS; `airlock cluster-certs` makes them)")
	fs.StringVar(&cfg.InternalListen, "internal-listen", ":7702", "with --cluster: `address` of the TLS listener the nodes fetch template images from (--templates-from https://…)")
	clusterMode := fs.String("cluster", "", "`kubernetes`: serve as an API replica of an airlock cluster on Kubernetes (docs/kubernetes.md), with --store; default: a single host")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "with --cluster: kubeconfig `file` to reach the apiserver (default: $KUBECONFIG, else the in-cluster service account)")
	fs.StringVar(&cfg.Namespace, "namespace", "airlock", "with --cluster: `namespace` of the sandbox Pods and the controller's Lease")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "with --cluster: `file` holding the cluster's internal token (default: $AIRLOCK_NODE_TOKEN)")
	fs.DurationVar(&cfg.KubeWait, "kube-wait", 30*time.Second, "with --cluster: how long to keep trying to reach the apiserver at start")
	fs.IntVar(&cfg.MetricsPerSandbox, "metrics-per-sandbox", 100, "most running sandboxes that get their own series on /metrics; with more running, none do; 0: none")
	if err := parse(fs, args); err != nil {
		return err
	}
	err := serveFlags(fs, &cfg, jailOpts, *defaultLimits, *egressPrivate, *webhookPrivate, *trusted, *clusterMode)
	if err == nil {
		err = runDaemon(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// serveFlags reads into cfg what serve's flags say beyond their values.
func serveFlags(fs *flagSet, cfg *daemon.Config, jailOpts jailOptions, defaultLimits, egressPrivate, webhookPrivate, trusted, clusterMode string) (err error) {
	if cfg.Unjailed, cfg.UIDs, err = jailOpts.parse(); err != nil {
		return err
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
	if cfg.WebhookPrivate, err = webhooks.ParsePrivate(webhookPrivate); err != nil {
		return fmt.Errorf("--webhook-private: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: %w", fs.Arg(0), errdefs.ErrInvalid)
	}
	if cfg.Store == "" {
		cfg.Store = os.Getenv("AIRLOCK_STORE")
	}
	switch clusterMode {
	case "":
		var stray []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "cluster-tls" || f.Name == "internal-listen" {
				stray = append(stray, "--"+f.Name)
			}
		})
		if len(stray) > 0 {
			return fmt.Errorf("%s is for an API replica of a cluster (--cluster kubernetes): %w", strings.Join(stray, " and "), errdefs.ErrInvalid)
		}
	case "kubernetes":
		cfg.Role, cfg.Token = daemon.Front, os.Getenv("AIRLOCK_NODE_TOKEN")
		if cfg.TLSDir == "" {
			cfg.TLSDir = os.Getenv("AIRLOCK_CLUSTER_TLS")
		}
	default:
		return fmt.Errorf("--cluster %q is not kubernetes: %w", clusterMode, errdefs.ErrInvalid)
	}
	return nil
}

// runDaemon builds the daemon cfg describes and runs it until SIGTERM or
// SIGINT, which it logs, or until ctx ends.
func runDaemon(ctx context.Context, cfg daemon.Config) error {
	d, err := daemon.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Role == daemon.Node {
		log = log.With("node", cfg.NodeName)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		select {
		case sig := <-sigs:
			log.Info("shutting down", "signal", sig.String())
			cancel()
		case <-rctx.Done():
		}
	}()
	return d.Run(rctx)
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
