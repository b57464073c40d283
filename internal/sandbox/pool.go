package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// A warm pool keeps clones of one template's warm snapshot ready, each
// past its restore and agent session: QEMU runs, the guest runs, the
// session is open, but the guest has no identity yet (the template VM's
// placeholder hostname and CA; its clock and entropy are set again when a
// create takes it) and the disk is at the snapshot's size. A create that a member fits takes it under
// the member's ID (Claim, then Create with that ID), and what is left to
// do is the sandbox's part: its policy on the gateway, the disk grown,
// reinit (clock, fresh entropy, hostname, the gateway's CA, environment)
// and one check of the template's server. The pool then makes another.
//
// Members are real sandbox directories, marked by poolMarkName until a
// create takes them; their VMs are detached, as every sandbox's is under
// the service. A runtime that starts removes the members a process before
// it left (New), so none outlives its server for long.

// poolMarkName marks a sandbox directory as a pool member no create took.
const poolMarkName = "pool-member"

// PoolSpec asks for a warm pool: Size clones of Template ready.
type PoolSpec struct {
	Template string
	Size     int
}

// ParsePoolSpec reads "N" or "N:TEMPLATE" (the template defaults to
// "base"), as `airlock serve --warm` takes it.
func ParsePoolSpec(s string) (PoolSpec, error) {
	n, tpl, _ := strings.Cut(s, ":")
	size, err := strconv.Atoi(n)
	if err != nil || strconv.Itoa(size) != n || size < 0 || size > maxPoolSize {
		return PoolSpec{}, fmt.Errorf("warm pool %q: want N or N:TEMPLATE with N from 0 to %d: %w", s, maxPoolSize, errdefs.ErrInvalid)
	}
	if tpl == "" {
		tpl = "base"
	}
	return PoolSpec{Template: tpl, Size: size}, nil
}

// maxPoolSize bounds one pool: each member is a running VM.
const maxPoolSize = 64

// poolRetry is the longest a pool waits after a member failed to start
// before it tries again; it starts at a second and doubles.
const poolRetry = time.Minute

// pool is one template's warm pool.
type pool struct {
	r    *Runtime
	ref  string // the template as asked for, resolved again on each fill
	size int
	// room says whether the host may run one more VM; nil always may.
	room func() bool

	mu      sync.Mutex
	ready   []*Sandbox          // members no create took
	claimed map[string]*Sandbox // taken by Claim, waiting for Create
	closed  bool
	// noRoom is whether the fill loop's last pass found the pool short
	// and the host without room for a member.
	noRoom bool

	kick chan struct{} // wakes the fill loop
	done chan struct{} // closed when the fill loop ends
}

// PoolStatus is what Pools reports of one pool.
type PoolStatus struct {
	Template string
	Size     int
	Ready    int
	// WaitingForRoom is whether the pool is short of its size and its
	// last fill found no room on the host for a member (the cap on VMs).
	WaitingForRoom bool
}

// StartPools starts a warm pool for each spec, filling in the background
// until ctx ends or StopPools. A template that cannot have a warm
// snapshot (a start command without a readiness check), or that does not
// exist, is an error and starts nothing. room, when not nil, is asked
// before each member is made: the host's cap on VMs is the caller's.
func (r *Runtime) StartPools(ctx context.Context, specs []PoolSpec, room func() bool) error {
	var pools []*pool
	for _, ps := range specs {
		if ps.Size == 0 {
			continue
		}
		spec, tpl, err := r.Resolve(Spec{Template: ps.Template})
		if err != nil {
			return fmt.Errorf("warm pool of %s: %w", ps.Template, err)
		}
		if !startsWarm(spec, tpl) {
			return fmt.Errorf("warm pool of %s: the template starts a server with no readiness check, so its clones cannot come with it running: give it a ready_cmd or ready_port: %w", ps.Template, errdefs.ErrInvalid)
		}
		pools = append(pools, &pool{r: r, ref: ps.Template, size: ps.Size, room: room,
			claimed: map[string]*Sandbox{}, kick: make(chan struct{}, 1), done: make(chan struct{})})
	}
	r.mu.Lock()
	r.pools = append(r.pools, pools...)
	r.mu.Unlock()
	for _, p := range pools {
		go p.fill(ctx)
	}
	return nil
}

// Pools reports the warm pools: how many members each has ready.
func (r *Runtime) Pools() []PoolStatus {
	r.mu.Lock()
	pools := r.pools
	r.mu.Unlock()
	var out []PoolStatus
	for _, p := range pools {
		p.mu.Lock()
		out = append(out, PoolStatus{Template: p.ref, Size: p.size, Ready: len(p.ready), WaitingForRoom: p.noRoom})
		p.mu.Unlock()
	}
	return out
}

// StopPools ends the warm pools and destroys their members, claimed ones
// too unless a create has taken them since.
func (r *Runtime) StopPools(ctx context.Context) {
	r.mu.Lock()
	pools := r.pools
	r.pools = nil
	r.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		p.closed = true
		members := append(p.ready, mapValues(p.claimed)...)
		p.ready, p.claimed = nil, map[string]*Sandbox{}
		p.mu.Unlock()
		p.wake()
		<-p.done
		for _, sb := range members {
			p.destroy(ctx, sb, "the pool stopped")
		}
	}
}

func mapValues(m map[string]*Sandbox) []*Sandbox {
	out := make([]*Sandbox, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// Claim takes a ready pool member that a sandbox of the resolved spec
// (Resolve; its Template may be the digest) can be made of, and returns
// its ID: the caller creates the sandbox
// with Create and that ID (or gives the member back with Unclaim). No
// member fits when the spec asks for another template, size or boot, or
// for what the member's template VM did not do the same way (startsWarm).
func (r *Runtime) Claim(spec Spec) (string, bool) {
	r.mu.Lock()
	pools := r.pools
	r.mu.Unlock()
	if len(pools) == 0 || spec.ID != "" || spec.ColdBoot || spec.AuxPort || r.cfg.ColdBoot {
		return "", false
	}
	tpl, err := r.templates.Resolve(spec.Template)
	if err != nil {
		return "", false
	}
	for _, p := range pools {
		if id, ok := p.claim(spec, tpl.Digest); ok {
			return id, true
		}
	}
	return "", false
}

// ShedPoolMember destroys one ready member of a pool, to make room on the
// host for a sandbox the pools do not serve, and reports whether there
// was one. The pool makes it again once the host has room.
func (r *Runtime) ShedPoolMember(ctx context.Context) bool {
	r.mu.Lock()
	pools := r.pools
	r.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		var sb *Sandbox
		if n := len(p.ready); n > 0 {
			sb = p.ready[n-1]
			p.ready = p.ready[:n-1]
		}
		p.mu.Unlock()
		if sb != nil {
			p.destroy(ctx, sb, "the host needs its room")
			return true
		}
	}
	return false
}

// Unclaim gives back a member Claim took and no create used: it is
// destroyed (its ID has been seen), and the pool makes another.
func (r *Runtime) Unclaim(id string) {
	if sb, p := r.takeClaimed(id); sb != nil {
		p.destroy(context.Background(), sb, "its create did not go ahead")
		p.wake()
	}
}

// takeClaimed removes the member id from its pool's claims.
func (r *Runtime) takeClaimed(id string) (*Sandbox, *pool) {
	r.mu.Lock()
	pools := r.pools
	r.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		sb := p.claimed[id]
		delete(p.claimed, id)
		p.mu.Unlock()
		if sb != nil {
			return sb, p
		}
	}
	return nil, nil
}

// claim takes a member of the template of digest that fits spec.
func (p *pool) claim(spec Spec, digest string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, sb := range p.ready {
		m := sb.Spec
		if sb.Template.Digest != digest {
			continue
		}
		// The disk grows to the spec's size; startsWarm says it is no
		// smaller than the member's.
		if m.VCPUs != spec.VCPUs || m.MemoryMiB != spec.MemoryMiB || m.Detach != spec.Detach || !startsWarm(spec, sb.Template) {
			continue
		}
		if sb.vm.Exited() {
			continue // the fill loop removes it
		}
		p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
		p.claimed[sb.ID] = sb
		p.wake()
		return sb.ID, true
	}
	return "", false
}

// wake has the fill loop look again.
func (p *pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill keeps the pool at its size: it drops members whose VM died or
// whose template moved on, and makes one member at a time while there are
// fewer than size and the host has room.
func (p *pool) fill(ctx context.Context) {
	defer close(p.done)
	log := p.r.log.With("pool", p.ref)
	backoff := time.Second
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed || ctx.Err() != nil {
			return
		}
		spec, tpl, err := p.r.Resolve(Spec{Template: p.ref})
		if err != nil {
			log.Warn("warm pool: the template is not usable", "err", err)
		}
		var stale []*Sandbox
		p.mu.Lock()
		kept := p.ready[:0]
		for _, sb := range p.ready {
			if sb.vm.Exited() || err == nil && sb.Template.Digest != tpl.Digest {
				stale = append(stale, sb)
			} else {
				kept = append(kept, sb)
			}
		}
		p.ready = kept
		short := err == nil && len(p.ready) < p.size
		p.mu.Unlock()
		for _, sb := range stale {
			p.destroy(context.Background(), sb, "its VM exited or its template changed")
		}
		roomy := short && (p.room == nil || p.room())
		p.mu.Lock()
		p.noRoom = short && !roomy
		p.mu.Unlock()
		if roomy {
			spec.ID, spec.Detach = NewID(), true
			began := time.Now()
			sb, err := p.r.cloneVM(ctx, spec, tpl, true)
			if err == nil {
				p.mu.Lock()
				if p.closed {
					p.mu.Unlock()
					p.destroy(context.Background(), sb, "the pool stopped")
					return
				}
				p.ready = append(p.ready, sb)
				p.mu.Unlock()
				log.Debug("warm pool member ready", "sandbox", sb.ID, "took", time.Since(began))
				backoff = time.Second
				continue
			}
			if ctx.Err() != nil {
				return
			}
			log.Warn("warm pool: a member failed to start", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, poolRetry)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// destroy ends a member no sandbox uses.
func (p *pool) destroy(ctx context.Context, sb *Sandbox, why string) {
	if err := sb.Destroy(ctx); err != nil {
		p.r.log.Warn("warm pool: destroying a member", "sandbox", sb.ID, "why", why, "err", err)
	}
}

// warmUpStep runs, in a pool member, what a create and its first command
// will run: a reinit that keeps the placeholder identity, and a command.
// Under TCG the code a guest runs is translated on first use, per QEMU
// process, and a restored clone's QEMU starts with nothing translated: a
// warm clone's first reinit and first command took about 330 and 300 ms
// here, against tens of milliseconds afterwards. A member does that work
// before any create waits for it. What it runs leaves nothing behind: the
// clock and entropy are set again by the create's reinit, and the command
// is `true`, or nothing in an image without a shell.
func warmUpStep(sb *Sandbox) step {
	return step{"warm up", func(ctx context.Context) error {
		entropy := make([]byte, 64)
		rand.Read(entropy)
		if _, err := sb.agent.Reinit(ctx, agentproto.ReinitRequest{
			TimeUnixNano: time.Now().UnixNano(), Entropy: entropy, Placeholder: true,
		}); err != nil {
			return sb.explain(err)
		}
		p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "true"}, TimeoutMS: 30_000}, agentclient.Stdio{})
		if agentclient.HasCode(err, agentproto.CodeNotFound) {
			return nil // no shell in this image
		}
		if err != nil {
			return err
		}
		_, err = sb.Wait(p)
		return err
	}, nil}
}

// finishPooled makes the claimed member sb the sandbox of spec: its
// directory stops being a pool member's, its record and gateway take the
// spec, the disk grows to the spec's size and the guest gets its identity
// (identitySteps). The steps' timings start afresh: the member's making
// was not the create's. On failure the member is destroyed.
func (r *Runtime) finishPooled(ctx context.Context, sb *Sandbox, spec Spec) (*Sandbox, error) {
	sb.Spec = spec
	sb.Timings = nil
	var snapErr error
	steps := []step{
		{"take warm pool member", func(context.Context) error {
			rec, err := readRecord(sb.Dir)
			if err != nil {
				return err
			}
			pinned := spec
			if sb.Template.Digest != "" {
				pinned.Template = sb.Template.Digest
			}
			rec.Spec = pinned
			if err := writeRecord(sb.Dir, rec); err != nil {
				return err
			}
			if g := sb.Gateway(); g != nil {
				if err := g.SetPolicy(spec.policy()); err != nil {
					return err
				}
			}
			if err := os.Remove(filepath.Join(sb.Dir, poolMarkName)); err != nil {
				return err
			}
			return sb.usable()
		}, nil},
		growStep(sb),
	}
	steps = append(steps, r.identitySteps(sb, &snapErr)...)
	if err := runSteps(ctx, steps, &sb.Timings); err != nil {
		if derr := sb.Destroy(context.WithoutCancel(ctx)); derr != nil {
			r.log.Warn("destroying a warm pool member whose create failed", "sandbox", sb.ID, "err", derr)
		}
		if snapErr != nil && ctx.Err() == nil {
			r.log.Warn("a warm pool member's server was not ready", "sandbox", sb.ID, "err", snapErr)
		}
		return nil, fmt.Errorf("create sandbox from the warm pool: %w", err)
	}
	sb.Timings.Split("reinit guest", sb.Init.Timings)
	go sb.watch()
	sb.log.Debug("sandbox made of a warm pool member", "pid", sb.vm.PID())
	return sb, nil
}

// removePoolLeftovers removes the pool members a process before this
// runtime left in the data directory: their VMs run on, detached, and no
// create took them.
func (r *Runtime) removePoolLeftovers(ctx context.Context) {
	ents, err := os.ReadDir(r.cfg.Dir.Sandboxes())
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !ValidID(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(r.cfg.Dir.Sandbox(e.Name()), poolMarkName)); err != nil {
			continue
		}
		err := r.Remove(ctx, e.Name())
		switch {
		case errors.Is(err, errdefs.ErrConflict):
			// Another live process owns it: its pool's.
		case err != nil:
			r.log.Warn("remove a warm pool member left by an earlier server", "sandbox", e.Name(), "err", err)
		default:
			r.log.Info("removed a warm pool member left by an earlier server", "sandbox", e.Name())
		}
	}
}
