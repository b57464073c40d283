// Package service is airlock's control plane: it keeps the desired state of
// sandboxes, operations and keys in the store, drives the runtime toward
// it in the background, and re-adopts what is running when the server
// starts again. The command sessions of its sandboxes are
// internal/sessions' (Commands), which the service tells of each
// sandbox's lifecycle: it resumes their commands after a wake or an
// adoption and ends them when a sandbox's VM or the sandbox goes. The HTTP layer (internal/api) calls it and maps its
// errors; nothing here knows about HTTP.
//
// Lifetimes: a request never owns a VM. Lifecycle work runs under the
// service's context, ended by Close; each live sandbox has its own context,
// ended when it is deleted or the service closes. Close leaves VMs running
// (they are started detached) so the next server re-adopts them.
package service

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/idle"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/sessions"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// Config configures a Service.
type Config struct {
	// Dir is the data directory.
	Dir datadir.Dir
	// Runtime boots and adopts sandboxes: RuntimeOf(rt) of the host's
	// *sandbox.Runtime, or of a sandboxtest.Runtime in tests.
	Runtime Runtime
	// Templates is the template store. Default Runtime.Templates().
	Templates *template.Store
	// Clock tells the time, of records and of leases. Default the
	// system's.
	Clock Clock
	// Store keeps the desired state.
	Store *store.Store
	// Log receives the service's diagnostics.
	Log *slog.Logger
	// Metrics counts what the service does; nil counts nothing.
	Metrics *Metrics
	// CommandMetrics counts command sessions (sessions.NewMetrics); nil
	// counts nothing.
	CommandMetrics *sessions.Metrics
	// MaxSandboxes caps the sandboxes that hold a VM (running or starting).
	// Default 32.
	MaxSandboxes int
	// MaxStarts caps the sandboxes booting at once; further creates wait
	// in line. Default twice the host's CPUs.
	MaxStarts int
	// MaxQueuedStarts caps the creates waiting for a start slot; past it a
	// create is refused. Default 64.
	MaxQueuedStarts int
	// ShutdownGrace is how long Close waits for lifecycle work in flight.
	// Default 10 s.
	ShutdownGrace time.Duration
	// DefaultEgress is the egress of a sandbox created without a network
	// policy: "deny" (the default) or "allow".
	DefaultEgress string
	// DefaultLimits are the limits of a user key where it has none of its
	// own (airlock serve --default-limits); admin keys have only their own.
	DefaultLimits apiv1.Limits
	// MemoryBudgetMiB caps the memory of this host's sandboxes' VMs, those
	// running, paused and being created or woken: a create or wake past it
	// is refused. Default the host's RAM less 1 GiB. Warm pool members are
	// the operator's to size and are not counted.
	MemoryBudgetMiB int64
	// EgressPrivate are the parts of the private ranges (RFC 1918, CGNAT)
	// a policy may open by naming an address in them literally (airlock
	// serve --egress-private). A policy naming any other private address,
	// or an always-denied one, is refused. The runtime's gateways must be
	// given the same ranges.
	EgressPrivate []netip.Prefix
	// Secrets seals and opens the values of stored secrets (POST
	// /v1/secrets) for credential rules. Nil: the server keeps no secrets,
	// and every secret call is refused with an error wrapping
	// errdefs.ErrPrecondition.
	Secrets *secrets.Box
	// TokenKey is the server secret, at least 32 bytes, from which each
	// sandbox's envd access token is derived (SandboxAccessToken), so that
	// the token is the same on every connect without being stored. The
	// server keeps it in $AIRLOCK_HOME/e2b-token.key. Empty: the service
	// makes a random one, and the tokens then change when it restarts.
	TokenKey []byte
	// Catalogue is the templates' side (builds.Service): the templates a
	// cluster's catalogue names, and the reclaim of template storage a
	// sandbox's end may free. Nil: no catalogue, nothing reclaimed.
	Catalogue Catalogue
	// MinFreeDiskBytes is the free space, in bytes, below which creates,
	// wakes, template builds and sandbox saves are refused: each checks
	// the filesystem it writes to under Dir first and, with less free,
	// fails with an error wrapping errdefs.ErrExhausted before anything
	// is recorded. 0 (the default) checks nothing.
	MinFreeDiskBytes int64
	// Warm are the warm pools to keep (sandbox.Runtime.StartPools): each
	// holds its number of clones of a template ready, so that a create
	// that fits one runs only the sandbox's own part. Members count
	// against MaxSandboxes: the pool makes no member while the host is at
	// its cap, and a create that would put the host over it destroys
	// members first (a member never takes a sandbox's place).
	Warm []sandbox.PoolSpec
	// NodeConfig, with its Node set, makes this the service of a
	// cluster node (airlock node).
	NodeConfig
	// FrontConfig, with its Front set, makes this the service of a
	// cluster's API replica (airlock serve --cluster kubernetes). With
	// neither, the service is a single host's.
	FrontConfig
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Runtime == nil || c.Store == nil {
		return errors.New("service needs a runtime and a store")
	}
	if c.Templates == nil {
		c.Templates = c.Runtime.Templates()
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.MaxSandboxes == 0 {
		c.MaxSandboxes = 32
	}
	if c.MaxStarts == 0 {
		c.MaxStarts = 2 * runtime.NumCPU()
	}
	if c.MaxQueuedStarts == 0 {
		c.MaxQueuedStarts = 64
	}
	if (c.Node != "" || c.Front) && len(c.Warm) > 0 {
		return errors.New("cluster mode keeps no warm pools yet")
	}
	if c.Node != "" && c.Front {
		return errors.New("a service is a cluster node's or an API replica's, not both")
	}
	if c.Catalogue == nil {
		c.Catalogue = noCatalogue{}
	}
	if c.MemoryBudgetMiB == 0 {
		c.MemoryBudgetMiB = max(hostMemoryMiB()-1024, 1024)
	}
	if c.MemoryBudgetMiB < 0 {
		return fmt.Errorf("memory budget %d MiB is negative: %w", c.MemoryBudgetMiB, errdefs.ErrInvalid)
	}
	if err := checkLimits("default limits", &c.DefaultLimits); err != nil {
		return err
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	switch c.DefaultEgress {
	case "":
		c.DefaultEgress = "deny"
	case "allow", "deny":
	default:
		return fmt.Errorf("default egress %q is not \"allow\" or \"deny\": %w", c.DefaultEgress, errdefs.ErrInvalid)
	}
	switch n := len(c.TokenKey); {
	case n == 0:
		// Tokens change on restart. crypto/rand.Read never fails: it
		// crashes the program instead.
		c.TokenKey = make([]byte, tokenKeySize)
		rand.Read(c.TokenKey)
	case n < tokenKeySize:
		return fmt.Errorf("the token key is %d bytes, under %d: %w", n, tokenKeySize, errdefs.ErrInvalid)
	default:
		c.TokenKey = slices.Clone(c.TokenKey)
	}
	if c.MinFreeDiskBytes < 0 {
		return fmt.Errorf("the free disk space to keep is %d bytes, under 0: %w", c.MinFreeDiskBytes, errdefs.ErrInvalid)
	}
	if c.MaxSandboxes < 1 || c.MaxStarts < 1 || c.MaxQueuedStarts < 0 {
		return fmt.Errorf("limits must be positive (max sandboxes %d, max starts %d, queued starts %d): %w",
			c.MaxSandboxes, c.MaxStarts, c.MaxQueuedStarts, errdefs.ErrInvalid)
	}
	return nil
}

// Service is the control plane.
type Service struct {
	cfg Config
	log *slog.Logger
	st  *store.Store
	rt  Runtime
	m   *Metrics

	templates *template.Store
	clock     Clock
	cmds      *sessions.Commands // command sessions of the sandboxes looked after here
	idle      *idle.Tracker      // what uses each sandbox looked after here, for idle_s
	role      role               // the part this server plays: one host, or a cluster's replica or node

	ctx     context.Context // lifecycle work; cancelled by Close
	cancel  context.CancelFunc
	work    sync.WaitGroup // lifecycle goroutines and the reconcile loop
	slots   chan struct{}  // start slots, MaxStarts of them
	closing chan struct{}  // closed by Close: the reconcile loop ends

	catalogue Catalogue // templates a cluster's catalogue names; Reclaim

	mu       sync.Mutex           // guards the fields below
	live     map[string]*live     // sandboxes this server looks after (with a VM, or suspended)
	creating map[string]*creation // creates in flight
	waking   map[string]int64     // wakes of suspended sandboxes in flight: the memory they will hold
	busy     map[string]*inflight // lifecycle operations in flight, by sandbox
	watchers map[string]map[chan apiv1.Sandbox]struct{}
	opWait   map[string]chan struct{} // closed when the operation finishes
	making   map[string]chan struct{} // checkpoints being made here: closed once recorded
	states   map[string]int           // sandboxes per state, for metrics
	closed   bool
}

// creation is a create in flight.
type creation struct {
	cancel    context.CancelFunc
	done      chan struct{}
	memoryMiB int64 // what its VM will hold, for the memory budget
}

// New starts the service in the role cfg gives it: unless it runs no VMs
// (an API replica), it recovers what an earlier server left (adopts
// running VMs, ends operations that were in flight) before it returns.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		cfg: cfg, log: cfg.Log, st: cfg.Store, rt: cfg.Runtime, m: cfg.Metrics,
		templates: cfg.Templates, clock: cfg.Clock, catalogue: cfg.Catalogue, role: newRole(cfg),
		ctx: sctx, cancel: cancel,
		slots:    make(chan struct{}, cfg.MaxStarts),
		closing:  make(chan struct{}),
		live:     map[string]*live{},
		creating: map[string]*creation{},
		waking:   map[string]int64{},
		busy:     map[string]*inflight{},
		watchers: map[string]map[chan apiv1.Sandbox]struct{}{},
		opWait:   map[string]chan struct{}{},
		making:   map[string]chan struct{}{},
		states:   map[string]int{},
	}
	s.idle = idle.New(s.clockNow)
	s.cmds = sessions.New(sessions.Config{Dir: cfg.Dir, Store: cfg.Store, Sandboxes: sandboxes{s}, Log: cfg.Log,
		Now: s.now, Metrics: cfg.CommandMetrics, Streamed: s.m.streamed})
	if !s.role.holdsVMs() {
		// The nodes hold the VMs, and each recovers and leases its own.
		s.m.setStates(map[string]int{})
		return s, nil
	}
	if err := s.recover(ctx); err != nil {
		cancel()
		s.releaseAll()
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	s.m.setStates(s.stateCounts())
	if err := s.rt.StartPools(s.ctx, s.cfg.Warm, s.poolRoom); err != nil {
		cancel()
		s.releaseAll()
		return nil, err
	}
	s.work.Add(1)
	go s.reconcile()
	return s, nil
}

// poolRoom says whether a warm pool may start one more member: the host
// is below its cap on VMs, counting the pools' members, and its disk has
// the room a create would ask for.
func (s *Service) poolRoom() bool {
	members := 0
	for _, p := range s.rt.Pools() {
		members += p.Ready
	}
	s.mu.Lock()
	n := s.vmCount()
	closed := s.closed
	s.mu.Unlock()
	return !closed && n+members < s.cfg.MaxSandboxes && s.checkFreeDisk(s.cfg.Dir.Sandboxes()) == nil
}

// Close stops lifecycle work, waiting up to the shutdown grace for
// operations in flight, and lets go of every sandbox without stopping it.
func (s *Service) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.work.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownGrace):
		s.log.Warn("lifecycle work still in flight at shutdown; the next start finishes or fails it")
	}
	s.cancel()
	// Pool members are no sandbox's: they end with the server.
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	s.rt.StopPools(pctx)
	pcancel()
	s.releaseAll()
	<-done
}

func (s *Service) releaseAll() {
	s.mu.Lock()
	lives := make([]*live, 0, len(s.live))
	for _, lv := range s.live {
		lives = append(lives, lv)
	}
	s.mu.Unlock()
	for _, lv := range lives {
		lv.release()
	}
}

// Principal is the caller of a request: the API key it authenticated
// with (tenancy.Principal, which the command sessions check as well).
type Principal = tenancy.Principal

// Commands is the command sessions of the sandboxes this service looks
// after: the edges call it for the command routes.
func (s *Service) Commands() *sessions.Commands { return s.cmds }

func (s *Service) now() time.Time { return s.clockNow().UTC().Truncate(time.Millisecond) }

// clockNow is the time by the service's clock; the system's for a Service
// made without New (in tests).
func (s *Service) clockNow() time.Time {
	if s.clock == nil {
		return time.Now()
	}
	return s.clock.Now()
}

// dataFile is a path under the sandbox's directory.
func (s *Service) sandboxDir(id string) string { return s.cfg.Dir.Sandbox(id) }
