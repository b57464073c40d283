// Package daemon puts an airlock server together and runs it: the store,
// the keys in the data directory, the sandbox runtime, the service, the
// HTTP API, E2B's API and the server's part in a cluster. `airlock serve`
// and `airlock node` read their flags into a Config, the bench and the
// tests that want a whole server fill one in, and all of them get the
// same server from New.
//
// A Daemon has three roles (Role): a single host (Local), an API replica
// of a cluster on Kubernetes that runs no VM and routes every call on a
// sandbox to its node (Front), and a node of such a cluster (Node).
//
// Its lifetime: New opens the listeners and builds everything, so that a
// bad setting or a port in use is reported before anything is served;
// Run serves until its context ends, a listener fails or (Local) another
// server takes the store, then shuts down in this order: stop taking
// requests and end event streams, let requests in flight finish (up to
// 15 s), let go of the sandboxes (their VMs keep running); Close then
// closes the store and the listeners. Sandboxes outlive the daemon: the
// next one re-adopts them.
package daemon

import (
	"crypto/subtle"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/e2b"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/vm"
)

// Role is the part a daemon plays.
type Role string

const (
	// Local serves a single host: its own store, its own sandboxes
	// (airlock serve).
	Local Role = ""
	// Front is an API replica of a cluster on Kubernetes (airlock serve
	// --cluster kubernetes): it records creates for kube-scheduler to
	// place, runs the cluster controller, and routes every call on a
	// sandbox, and template builds, to a node. It runs no VM.
	Front Role = "front"
	// Node is a host of such a cluster (airlock node): it runs the
	// sandboxes the cluster binds to it and serves them to the replicas
	// over the cluster's TLS.
	Node Role = "node"
)

// Config is what a daemon is made of. Validate names a setting by the
// flag of airlock serve or airlock node that sets it, as the operator
// knows it. A setting marked "required" has no default here: the flag's
// default is given for reference.
type Config struct {
	// Role is the daemon's part: Local (the default), Front or Node.
	Role Role
	// Dir is the data directory. Required.
	Dir datadir.Dir
	// Log receives the daemon's diagnostics. Default: none kept. A Node's
	// lines carry node=NodeName.
	Log *slog.Logger
	// Stdout receives the lines an operator reads: the admin key on its
	// first start, the addresses served, that it stopped. Default: none.
	Stdout io.Writer

	// Listen is the TCP address of airlock's API (--listen): plain HTTP
	// for Local and Front; for a Node, the cluster's internal API over
	// TLS. Required (serve: 127.0.0.1:7700, node: 0.0.0.0:7701).
	Listen string
	// E2BListen is the address of E2B's API (--e2b-listen), Local and
	// Front only. Default "": not served. A Node serves E2B's API for the
	// replicas on Listen, under cluster.E2BPath.
	E2BListen string
	// E2BDomain is the sandbox domain told to E2B SDKs (--e2b-domain).
	// Local and Front need E2BListen for it. Default "": none.
	E2BDomain string

	// Accel is the accelerator: kvm, tcg or auto (--accel). Default auto.
	Accel string
	// BootTimeout bounds a VM's boot to its agent ready. Default 60 s.
	BootTimeout time.Duration
	// Unjailed runs every QEMU unjailed (--jail off): for debugging only,
	// refused unless every listener is loopback. Default false.
	Unjailed bool
	// UIDs are the users jailed VMs run as (--jail-uids). Required unless
	// Unjailed.
	UIDs vm.UIDRange

	// MaxSandboxes caps the sandboxes holding a VM at once
	// (--max-sandboxes). Required, at least 1 (flag default 32).
	MaxSandboxes int
	// MaxStarts caps the sandboxes booting at once (--max-starts).
	// Default 0: twice the CPUs.
	MaxStarts int
	// MaxQueuedStarts caps the creates waiting for a start slot
	// (--max-queued-starts). Default 0: 64.
	MaxQueuedStarts int
	// PingInterval is how often idle event streams get a `: ping`
	// (--ping-interval). Required, at least 100 ms (flag default 15 s).
	PingInterval time.Duration
	// MetricsPerSandbox is the most running sandboxes that get their own
	// series on /metrics; with more running, none do
	// (--metrics-per-sandbox). 0: none. A Node always uses 100. Flag
	// default 100.
	MetricsPerSandbox int

	// DefaultEgress is the egress of a sandbox created without a network
	// policy: allow or deny (--default-egress). Required (flag default
	// deny).
	DefaultEgress string
	// DefaultLimits are the limits of user keys where they have none of
	// their own (--default-limits; ParseLimits reads its form). Default:
	// none.
	DefaultLimits apiv1.Limits
	// MemoryBudgetBytes caps the memory, in bytes, this host's sandboxes'
	// VMs may hold (--memory-budget). Default 0: the host's RAM less
	// 1 GiB.
	MemoryBudgetBytes int64
	// EgressPrivate are the parts of the private ranges a sandbox's
	// policy may open by naming an address in them (--egress-private,
	// read by policy.ParsePrivate). Default: none.
	EgressPrivate []netip.Prefix
	// WebhookPrivate are the ranges egress always denies (loopback,
	// private, link-local…) where webhooks may still point: the
	// operator's own receivers (--webhook-private, read by
	// webhooks.ParsePrivate). Default: none.
	WebhookPrivate []netip.Prefix
	// DNSUpstream is the resolver, HOST:PORT, the gateways ask
	// (--dns-upstream). Default "": the host's, from /etc/resolv.conf.
	DNSUpstream string
	// MinFreeDiskBytes is the free space, in bytes, to keep on the data
	// directory's filesystem: creates, wakes, builds and saves are
	// refused below it (--min-free-disk). 0: no check. Flag default 2 GiB.
	MinFreeDiskBytes int64
	// Warm are the warm pools to keep (--warm), Local only. Default: none.
	Warm []sandbox.PoolSpec

	// TrustedRegistries are the registry hosts, HOST[:PORT], template
	// builds may pull docker:// images from (--trusted-registries).
	// Default: any registry at a public address.
	TrustedRegistries []string
	// RegistryHostCredentials lets pulls without registry_auth use the
	// host's docker config (--registry-host-credentials). Default false.
	RegistryHostCredentials bool
	// MaxBuilds caps the template builds running at once (--max-builds).
	// Required, at least 1 (flag default 1).
	MaxBuilds int
	// MaxBuildContextMiB is the largest build context upload, in MiB
	// (--max-build-context). Required, at least 1 (flag default 1024).
	MaxBuildContextMiB int64
	// NoReclaim keeps every template image and snapshot: for a daemon
	// whose templates directory is shared with another server (the
	// bench's). Default false.
	NoReclaim bool

	// Store is the PostgreSQL URL of the store (--store, or
	// $AIRLOCK_STORE). Default "": the SQLite file in Dir. Front and
	// Node need the cluster's PostgreSQL.
	Store string
	// StoreWait is how long an unreachable PostgreSQL store is tried at
	// start (--store-wait). Default 0: once. Flag default 30 s.
	StoreWait time.Duration

	// Token is the cluster's internal token, Front and Node
	// (--token-file's content, else $AIRLOCK_NODE_TOKEN): at least
	// api.MinNodeTokenLen characters. Required there.
	Token string
	// TokenFile, if set, is read for Token instead (--token-file).
	TokenFile string
	// TLSDir is the directory of the cluster TLS, Front and Node
	// (--cluster-tls, else $AIRLOCK_CLUSTER_TLS): ca.crt, and tls.crt and
	// tls.key of the role's certificate. Required there.
	TLSDir string
	// Kubeconfig is the kubeconfig file to reach the apiserver, Front and
	// Node (--kubeconfig). Default "": the in-cluster service account.
	Kubeconfig string
	// Namespace is the namespace of the sandbox Pods and of the
	// controller's Lease (--namespace). Required for Front and Node (flag
	// default airlock).
	Namespace string
	// KubeWait is how long an unreachable apiserver is tried at start
	// (--kube-wait). Default 0: once. Flag default 30 s.
	KubeWait time.Duration
	// InternalListen is the address of the TLS listener the nodes fetch
	// template images from, Front only (--internal-listen). Required there
	// (flag default :7702).
	InternalListen string

	// NodeName is the name of this host's Node and of the node recorded
	// for its sandboxes, a DNS subdomain (--name). Required for Node.
	NodeName string
	// Advertise is the IP the replicas reach Listen at (--advertise).
	// Default "": Listen's host, else this host's first global address.
	Advertise string
	// LeaseDuration is how long the Node's lease holds without a renewal
	// (--lease-duration), 4 s to 10 min. Required for Node (flag default
	// 10 s).
	LeaseDuration time.Duration
	// CPUs are the vCPUs the Node offers sandboxes (--cpus). Required for
	// Node, at least 1.
	CPUs int
	// MemoryBytes is the guest memory, in bytes, the Node offers
	// sandboxes (--memory). Required for Node, at least 1 MiB.
	MemoryBytes int64
	// ReclaimEvery is how often a Node removes the template images
	// nothing in the cluster refers to (--reclaim-interval), 1 s to 24 h.
	// Required for Node (flag default 5 min).
	ReclaimEvery time.Duration
	// TemplatesFrom are the base URLs of the replicas' internal listeners
	// a Node fetches template images from when no other node has them
	// (--templates-from). Default: none.
	TemplatesFrom []*url.URL
	// Version is the version a Node reports on its Node object, and MCP's
	// initialize at /v1/mcp.
	Version string
}

// ParseLimits reads limits written NAME=N[,NAME=N…], the form of
// --default-limits and of `airlock key create --limit`.
func ParseLimits(s string) (apiv1.Limits, error) { return service.ParseLimits(s) }

// IsPostgresURL reports whether addr names a PostgreSQL store.
func IsPostgresURL(addr string) bool { return store.IsPostgresURL(addr) }

// Validate checks c before anything starts. Its errors wrap
// errdefs.ErrInvalid and name the flag to fix. It reads TokenFile and
// the cluster TLS in TLSDir, which are part of what it checks.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

// resolved is what Validate reads from the files a Config names.
type resolved struct {
	token string
	id    *clustertls.Identity
}

// resolve checks c, in the order airlock serve and airlock node always
// have, and reads the token and the cluster TLS.
func (c Config) resolve() (resolved, error) {
	var r resolved
	if c.Dir.Root == "" {
		return r, fmt.Errorf("no data directory: %w", errdefs.ErrInvalid)
	}
	if c.Listen == "" {
		return r, fmt.Errorf("no --listen address: %w", errdefs.ErrInvalid)
	}
	switch c.Role {
	case Local, Front:
		return r, c.resolveServe(&r)
	case Node:
		return r, c.resolveNode(&r)
	}
	return r, fmt.Errorf("role %q is not local, front or node: %w", c.Role, errdefs.ErrInvalid)
}

func (c Config) resolveServe(r *resolved) error {
	if c.MetricsPerSandbox < 0 {
		return fmt.Errorf("--metrics-per-sandbox must not be negative (0 turns the series off): %w", errdefs.ErrInvalid)
	}
	if c.MaxBuilds < 1 || c.MaxBuildContextMiB < 1 {
		return fmt.Errorf("--max-builds and --max-build-context must be at least 1: %w", errdefs.ErrInvalid)
	}
	if err := checkNetwork(c.DefaultEgress, c.DNSUpstream, c.EgressPrivate); err != nil {
		return err
	}
	if c.Role == Front {
		if !store.IsPostgresURL(c.Store) {
			return fmt.Errorf("--cluster kubernetes needs the cluster's PostgreSQL store: give --store postgres://… (or $AIRLOCK_STORE): %w", errdefs.ErrInvalid)
		}
		if len(c.Warm) > 0 {
			return fmt.Errorf("--warm is not served in cluster mode yet: %w", errdefs.ErrInvalid)
		}
		if c.KubeWait < 0 {
			return fmt.Errorf("--kube-wait must not be negative: %w", errdefs.ErrInvalid)
		}
		var err error
		if r.token, err = readToken(c.Token, c.TokenFile); err != nil {
			return err
		}
		if r.id, err = loadIdentity(c.TLSDir, clustertls.RoleServer); err != nil {
			return err
		}
		if c.InternalListen == "" || c.Namespace == "" {
			return fmt.Errorf("--internal-listen and --namespace must be given: %w", errdefs.ErrInvalid)
		}
	}
	if c.StoreWait < 0 {
		return fmt.Errorf("--store-wait must not be negative: %w", errdefs.ErrInvalid)
	}
	if c.PingInterval < 100*time.Millisecond {
		return fmt.Errorf("--ping-interval must be at least 100ms: %w", errdefs.ErrInvalid)
	}
	if c.MaxSandboxes < 1 || c.MaxStarts < 0 || c.MaxQueuedStarts < 0 {
		return fmt.Errorf("limits must be positive: %w", errdefs.ErrInvalid)
	}
	if c.E2BListen == "" && c.E2BDomain != "" {
		return fmt.Errorf("--e2b-domain needs --e2b-listen: %w", errdefs.ErrInvalid)
	}
	return nil
}

func (c Config) resolveNode(r *resolved) error {
	if err := checkNodeName(c.NodeName); err != nil {
		return fmt.Errorf("--name: %w", err)
	}
	if !store.IsPostgresURL(c.Store) {
		return fmt.Errorf("--store (or $AIRLOCK_STORE) must be the cluster's postgres:// URL: %w", errdefs.ErrInvalid)
	}
	var err error
	if r.token, err = readToken(c.Token, c.TokenFile); err != nil {
		return err
	}
	if r.id, err = loadIdentity(c.TLSDir, clustertls.RoleNode); err != nil {
		return err
	}
	if c.CPUs < 1 || c.MemoryBytes < 1<<20 || c.MaxSandboxes < 1 || c.MaxStarts < 0 || c.MaxQueuedStarts < 0 {
		return fmt.Errorf("--cpus, --memory and the limits must be positive: %w", errdefs.ErrInvalid)
	}
	if c.StoreWait < 0 || c.KubeWait < 0 {
		return fmt.Errorf("--store-wait and --kube-wait must not be negative: %w", errdefs.ErrInvalid)
	}
	if c.LeaseDuration < 4*time.Second || c.LeaseDuration > 10*time.Minute {
		return fmt.Errorf("--lease-duration must be between 4s and 10m: %w", errdefs.ErrInvalid)
	}
	if c.PingInterval < 100*time.Millisecond {
		return fmt.Errorf("--ping-interval must be at least 100ms: %w", errdefs.ErrInvalid)
	}
	if err := e2b.CheckDomain(c.E2BDomain); err != nil {
		return fmt.Errorf("--e2b-domain: %w", err)
	}
	if c.MaxBuilds < 1 || c.MaxBuildContextMiB < 1 {
		return fmt.Errorf("--max-builds and --max-build-context must be at least 1: %w", errdefs.ErrInvalid)
	}
	if c.ReclaimEvery < time.Second || c.ReclaimEvery > 24*time.Hour {
		return fmt.Errorf("--reclaim-interval must be between 1s and 24h: %w", errdefs.ErrInvalid)
	}
	if c.Namespace == "" {
		return fmt.Errorf("--namespace must be given: %w", errdefs.ErrInvalid)
	}
	return checkNetwork(c.DefaultEgress, c.DNSUpstream, c.EgressPrivate)
}

// checkNetwork checks --default-egress, --dns-upstream and the ranges of
// --egress-private.
func checkNetwork(defaultEgress, dnsUpstream string, private []netip.Prefix) error {
	if defaultEgress != "allow" && defaultEgress != "deny" {
		return fmt.Errorf("--default-egress %q is not allow or deny: %w", defaultEgress, errdefs.ErrInvalid)
	}
	if dnsUpstream != "" {
		if _, port, err := net.SplitHostPort(dnsUpstream); err != nil || port == "" {
			return fmt.Errorf("--dns-upstream %q is not HOST:PORT: %w", dnsUpstream, errdefs.ErrInvalid)
		}
	}
	for _, p := range private {
		if _, err := policy.ParsePrivate(p.String()); err != nil {
			return fmt.Errorf("--egress-private: %w", err)
		}
	}
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

// readToken is the internal token: file's content if file is set, else
// token.
func readToken(token, file string) (string, error) {
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

// loadIdentity loads the cluster TLS of role from dir.
func loadIdentity(dir, role string) (*clustertls.Identity, error) {
	if dir == "" {
		return nil, fmt.Errorf("cluster traffic is TLS: give --cluster-tls DIR (or $AIRLOCK_CLUSTER_TLS) holding ca.crt, tls.crt and tls.key for the %s role; `airlock cluster-certs DIR` makes them: %w", role, errdefs.ErrInvalid)
	}
	return clustertls.Load(dir, role)
}

// sameSecret compares two secrets in constant time.
func sameSecret(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
