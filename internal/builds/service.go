package builds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/imagebuild"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// Config configures a Service.
type Config struct {
	// Dir is the data directory: build logs go to builds/, uploaded
	// build contexts to build-contexts/.
	Dir datadir.Dir
	// Store keeps the builds, their operations and, in a cluster, the
	// catalogue of templates built on the nodes.
	Store *store.Store
	// Templates is the template store builds read from and write to.
	Templates *template.Store
	// Runtime is the host's sandbox runtime, for what a build asks of
	// it directly (its image tools, removing a build sandbox an earlier
	// server left, reclaiming template snapshots).
	Runtime Runtime
	// Clock tells the time of records. Default the system's.
	Clock Clock
	// Log receives the diagnostics of builds and of Reclaim.
	Log *slog.Logger
	// Metrics counts what builds do; nil counts nothing.
	Metrics *Metrics
	// DefaultEgress is the egress of a build's sandbox made without a
	// network policy: "deny" (the default) or "allow", as the
	// sandboxes'.
	DefaultEgress string
	// TrustedRegistries, if not empty, are the registries (host[:port])
	// a template build may pull docker:// images from; others are refused
	// before anything is fetched. Only a registry named here may be at a
	// loopback or private address.
	TrustedRegistries []string
	// RegistryHostCredentials lets a pull without registry_auth use the
	// host's docker config for the registry it names.
	RegistryHostCredentials bool
	// MaxBuilds caps the template builds running at once (each boots a
	// sandbox); further builds wait. Default 1.
	MaxBuilds int
	// MaxContextBytes caps an uploaded build context. Default 1 GiB.
	MaxContextBytes int64
	// ShutdownGrace is how long Close waits for builds in flight.
	// Default 10 s.
	ShutdownGrace time.Duration
	// NoReclaim keeps every template image and snapshot: for a server
	// that shares its templates directory with one that owns it (the
	// bench's), whose sandboxes it cannot see.
	NoReclaim bool
	// Role is the server's part in a cluster, as far as builds and the
	// catalogue care. The zero Role is a single host's.
	Role Role
}

// Role is what a cluster makes of a server's builds. On a single host
// (the zero Role) a build runs here and tags its result in the template
// store; a cluster's node builds too but records its results in the
// store's catalogue; an API replica builds nothing (its router sends
// builds to a node) and reads the catalogue.
type Role struct {
	// Node, if set, is this cluster node's name: builds run here,
	// recorded as this node's, and their results are tagged in the
	// catalogue.
	Node string
	// Front, if set, makes this a cluster's API replica: builds, build
	// contexts and saves are refused, and nothing is recovered at start.
	Front bool
	// NodeDown, for Front, says why a node cannot be reached now (""
	// when it can); a build in progress there shows Unavailable.
	NodeDown func(node string) string
	// FetchTemplate, for a Node, gets a template image the node lacks,
	// by digest, from the cluster (cluster.TemplateFetcher).
	FetchTemplate func(ctx context.Context, digest string) (template.Template, error)
	// ReclaimEvery, for a Node, is how often it reclaims template storage
	// besides after its own builds and deletes: a template deleted
	// through a replica, or a sandbox deleted on another node, may have
	// been the last user of an image here. Default 5 min.
	ReclaimEvery time.Duration
}

// clustered says whether the role is a cluster's: a node's or an API
// replica's.
func (r Role) clustered() bool { return r.Node != "" || r.Front }

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Store == nil || c.Templates == nil || c.Runtime == nil {
		return errors.New("builds need a store, a template store and a runtime")
	}
	if c.Role.Node != "" && c.Role.Front {
		return errors.New("builds are a cluster node's or an API replica's, not both")
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	switch c.DefaultEgress {
	case "":
		c.DefaultEgress = "deny"
	case "allow", "deny":
	default:
		return fmt.Errorf("default egress %q is not \"allow\" or \"deny\": %w", c.DefaultEgress, errdefs.ErrInvalid)
	}
	if c.MaxBuilds == 0 {
		c.MaxBuilds = 1
	}
	if c.MaxBuilds < 1 {
		return fmt.Errorf("max builds %d is under 1: %w", c.MaxBuilds, errdefs.ErrInvalid)
	}
	if c.MaxContextBytes == 0 {
		c.MaxContextBytes = 1 << 30
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Role.ReclaimEvery == 0 {
		c.Role.ReclaimEvery = 5 * time.Minute
	}
	return nil
}

// Runtime is what builds ask of the host's sandbox runtime directly: the
// service's Runtime and *sandbox.Runtime have these.
type Runtime interface {
	// BuildTools are the image tools of a template build in dir.
	BuildTools(dir string) (sandbox.ImageTools, func(), error)
	// Remove removes a sandbox without a VM in this process: here, a
	// build sandbox an earlier server left.
	Remove(ctx context.Context, id string) error
	// ReclaimSnapshots removes the template snapshots keep does not keep.
	ReclaimSnapshots(keep func(digest string, current bool) bool) (int64, error)
}

// Sandboxes is what builds ask of the sandbox side (internal/service):
// boot a build's VM, copy a sandbox's disk for a save, and the checks
// and records builds share with sandboxes (a key's limits, free disk,
// egress bounds, operations).
type Sandboxes interface {
	// BootBuildVM makes and starts the VM of a build sandbox, taking its
	// turn among the sandboxes' starts. It has no row and no lease.
	BootBuildVM(ctx context.Context, spec sandbox.Spec) (VM, error)
	// HoldForSave marks p's sandbox id as being saved, when it may be:
	// other lifecycle work on it waits or is refused until release.
	// ending is called just before the save is recorded finished.
	HoldForSave(ctx context.Context, p Principal, id string) (ending, release func(), err error)
	// DiskSaver returns the call that copies the disk of sandbox id,
	// whose row says it is in state, to a file; it fails if the sandbox
	// is no longer on this server.
	DiskSaver(id, state string) (func(ctx context.Context, dst string) error, error)

	// AdmitBuild refuses a build by key when the key is at a limit.
	AdmitBuild(ctx context.Context, key string) error
	// KeyLimits are the limits in force for key.
	KeyLimits(ctx context.Context, key string) (apiv1.Limits, error)
	// EgressBounds is what no network policy may open on this host.
	EgressBounds() policy.Bounds

	// CheckFreeDisk refuses work that writes large files under dir when
	// the disk is short of the space the server keeps free.
	CheckFreeDisk(dir string) error
	// GuardSpace reads r, stopping when the disk of dir runs short.
	GuardSpace(r io.Reader, dir string) io.Reader
	// FlattenLimit bounds what an image may unpack to in dir; room says
	// the disk, not the fixed bound, set it.
	FlattenLimit(dir string) (limit int64, room bool, err error)

	// OperationStarted and OperationFinished count a build's operation
	// with the sandboxes', and wake those waiting for it.
	OperationStarted(op store.Operation)
	OperationFinished(op store.Operation, took time.Duration)
}

// VM is a build sandbox's running VM: what a build calls on it.
type VM interface {
	SandboxID() string
	Agent() *agentclient.Client
	Exec(ctx context.Context, req agentproto.ExecRequest, stdio agentclient.Stdio) (*agentclient.Process, error)
	Wait(p *agentclient.Process) (agentproto.Exit, error)
	SaveDisk(ctx context.Context, dst string) error
	Destroy(ctx context.Context) error
}

// Principal is the caller of a request, as the service authenticated it.
type Principal struct {
	KeyID string
	Admin bool
}

// Clock tells the time of records.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Service runs template builds and saves and keeps the catalogue of
// templates: it lists, shows and deletes them, resolves a template the
// host's store lacks through the cluster's catalogue, and reclaims what
// nothing refers to.
//
// Lifetimes: builds run under the Service's context, ended by Close; a
// request never owns one. On a node, a goroutine reclaims template
// storage every Role.ReclaimEvery until Close.
type Service struct {
	cfg  Config
	log  *slog.Logger
	st   *store.Store
	rt   Runtime
	m    *Metrics
	role Role

	templates *template.Store
	contexts  *imagebuild.Contexts // uploaded build contexts
	builds    *Set                 // builds in progress, with their own slots and lock

	// sandboxes runs build VMs and saves; set by Serve, before which
	// nothing calls it.
	sandboxes Sandboxes

	ctx    context.Context // builds; cancelled by Close
	cancel context.CancelFunc
	work   sync.WaitGroup // builds in flight and the reclaim loop

	// reclaimMu is held exclusively by Reclaim and shared by whatever is
	// between choosing a template image and recording its use (a
	// sandbox's create before its row exists, a build's cache hit).
	reclaimMu sync.RWMutex

	closing chan struct{} // closed by Close: the reclaim loop ends

	mu     sync.Mutex // guards closed
	closed bool
}

// maxQueuedBuilds bounds the builds running or waiting on one server.
const maxQueuedBuilds = 16

// New makes the builds of a server. Unless the server is a cluster's API
// replica, it first fails the builds an earlier server (or this node)
// left unfinished and removes what they left, as it must before the
// sandbox side recovers the operations in flight.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bctx, cancel := context.WithCancel(context.Background())
	b := &Service{
		cfg: cfg, log: cfg.Log, st: cfg.Store, rt: cfg.Runtime, m: cfg.Metrics, role: cfg.Role,
		templates: cfg.Templates,
		contexts:  imagebuild.OpenContexts(filepath.Join(cfg.Dir.Root, "build-contexts")),
		builds:    NewSet(cfg.MaxBuilds, maxQueuedBuilds),
		ctx:       bctx, cancel: cancel,
		closing: make(chan struct{}),
	}
	if cfg.Role.Front {
		return b, nil
	}
	if err := b.recoverBuilds(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("recover builds: %w", err)
	}
	return b, nil
}

// Serve lets b take builds and saves, which boot and copy on sandboxes.
// It is called once, after the sandbox side is made and before any
// request reaches b.
func (b *Service) Serve(sandboxes Sandboxes) {
	b.sandboxes = sandboxes
	if b.role.Node != "" {
		b.work.Add(1)
		go b.reclaimLoop()
	}
}

// reclaimLoop reclaims template storage every Role.ReclaimEvery until
// Close.
func (b *Service) reclaimLoop() {
	defer b.work.Done()
	t := time.NewTicker(b.role.ReclaimEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-b.closing:
			return
		case <-t.C:
		}
		if _, err := b.Reclaim(b.ctx); err != nil && b.ctx.Err() == nil {
			b.log.Warn("reclaim template storage", "err", err)
		}
	}
}

// Close refuses new builds, waits up to the shutdown grace for those in
// flight, then cuts them short: the next start fails them with a reason.
func (b *Service) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.closing)
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.work.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(b.cfg.ShutdownGrace):
		b.log.Warn("template builds still in flight at shutdown; the next start fails them")
	}
	b.cancel()
	<-done
}

// MaxContextBytes is the largest build context the server takes.
func (b *Service) MaxContextBytes() int64 { return b.cfg.MaxContextBytes }

// HoldImages keeps the template images from Reclaim until release is
// called: for whatever is between choosing an image and recording its
// use.
func (b *Service) HoldImages() (release func()) {
	b.reclaimMu.RLock()
	return b.reclaimMu.RUnlock
}

func (b *Service) now() time.Time { return b.cfg.Clock.Now().UTC().Truncate(time.Millisecond) }

var _ Clock = systemClock{}
