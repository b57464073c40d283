package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/builds"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// Catalogue is what the service asks of the templates' side
// (builds.Service): the templates a cluster's catalogue names, and the
// reclaim of template storage that a sandbox's end may free.
type Catalogue interface {
	// ResolveCatalogued resolves a template ref the runtime's store
	// lacks; ok is false when there is no catalogue to ask (a single
	// host), and the runtime's answer stands.
	ResolveCatalogued(ctx context.Context, ref string) (t template.Template, ok bool, err error)
	// HoldImages keeps the template images from Reclaim until release:
	// for what is between choosing an image and recording its use.
	HoldImages() (release func())
	// Reclaim removes the template storage nothing refers to any more.
	Reclaim(ctx context.Context) (int64, error)
}

// noCatalogue is the Catalogue of a service made without one (tests): no
// catalogue, nothing reclaimed.
type noCatalogue struct{}

func (noCatalogue) ResolveCatalogued(context.Context, string) (template.Template, bool, error) {
	return template.Template{}, false, nil
}
func (noCatalogue) HoldImages() func()                     { return func() {} }
func (noCatalogue) Reclaim(context.Context) (int64, error) { return 0, nil }

// resolveSpec is the runtime's Resolve, which in cluster mode also takes a
// template from the catalogue.
func (s *Service) resolveSpec(ctx context.Context, want sandbox.Spec) (sandbox.Spec, template.Template, error) {
	spec, tpl, err := s.rt.Resolve(want)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return spec, tpl, err
	}
	ctpl, ok, cerr := s.catalogue.ResolveCatalogued(ctx, spec.Template)
	if !ok {
		return spec, tpl, err
	}
	if cerr != nil {
		return spec, ctpl, cerr
	}
	spec, err = s.rt.Fit(spec, ctpl)
	return spec, ctpl, err
}

// reclaim reclaims template storage after a sandbox's end, logging what
// fails.
func (s *Service) reclaim() {
	if _, err := s.catalogue.Reclaim(s.ctx); err != nil {
		s.log.Warn("reclaim template storage", "err", err)
	}
}

// The service is the sandbox side of builds.
var _ builds.Sandboxes = (*Service)(nil)

// BootBuildVM makes and starts a build sandbox's VM in a start slot: it
// is not a sandbox of the API (no row, no lease).
func (s *Service) BootBuildVM(ctx context.Context, spec sandbox.Spec) (builds.VM, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.slots }()
	box, err := s.rt.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return box, nil
}

// HoldForSave marks sandbox id as being saved as a template, if p may
// and it is running, paused or suspended here with no other operation
// in flight: other lifecycle requests then wait (delete) or are refused
// until release. ending marks the save as recording its end.
func (s *Service) HoldForSave(ctx context.Context, bp builds.Principal, id string) (ending, release func(), err error) {
	p := Principal{KeyID: bp.KeyID, Role: apiv1.RoleUser}
	if bp.Admin {
		p.Role = apiv1.RoleAdmin
	}
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return nil, nil, err
	}
	if err := s.lockSettled(ctx, id); err != nil {
		return nil, nil, err
	}
	if f, ok := s.busy[id]; ok {
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("sandbox %s has a %s operation in flight: wait for it and retry: %w", id, f.kind, errdefs.ErrConflict)
	}
	if sb, err = s.st.GetSandbox(ctx, id); err != nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	saveable := []string{apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended}
	if !contains(saveable, sb.State) || s.live[id] == nil {
		s.mu.Unlock()
		return nil, nil, fmt.Errorf("sandbox %s is %s: saving it as a template needs it %s: %w", id, sb.State, orList(saveable), errdefs.ErrConflict)
	}
	f := &inflight{kind: "save", done: make(chan struct{})}
	s.busy[id] = f
	s.mu.Unlock()
	release = func() {
		s.mu.Lock()
		if s.busy[id] == f {
			delete(s.busy, id)
		}
		s.mu.Unlock()
		close(f.done)
	}
	ending = func() {
		s.mu.Lock()
		f.ending = true
		s.mu.Unlock()
	}
	return ending, release, nil
}

// DiskSaver returns the call that copies the disk of sandbox id, in
// state, to dst: a suspended sandbox's from its directory, another's
// from its VM.
func (s *Service) DiskSaver(id, state string) (func(ctx context.Context, dst string) error, error) {
	s.mu.Lock()
	lv := s.live[id]
	s.mu.Unlock()
	if lv == nil {
		return nil, fmt.Errorf("sandbox %s is no longer here: %w", id, errdefs.ErrConflict)
	}
	return func(ctx context.Context, dst string) error {
		if state == apiv1.StateSuspended {
			return s.rt.SaveSuspendedDisk(ctx, id, dst)
		}
		box, _, err := lv.vm()
		if err != nil {
			return err
		}
		return box.SaveDisk(ctx, dst)
	}, nil
}

// AdmitBuild refuses a build by key when the key is at its build limit.
func (s *Service) AdmitBuild(ctx context.Context, key string) error {
	l, err := s.limitsOf(ctx, key)
	if err != nil {
		return err
	}
	u, err := s.st.KeyUsage(ctx, key)
	if err != nil {
		return err
	}
	return within(key, l, u, want{builds: 1})
}

// KeyLimits are the limits in force for key.
func (s *Service) KeyLimits(ctx context.Context, key string) (apiv1.Limits, error) {
	return s.limitsOf(ctx, key)
}

// EgressBounds is what no network policy may open on this host.
func (s *Service) EgressBounds() policy.Bounds { return s.egressBounds() }

// CheckFreeDisk refuses work that writes large files under dir when the
// disk is short of Config.MinFreeDiskBytes.
func (s *Service) CheckFreeDisk(dir string) error { return s.checkFreeDisk(dir) }

// GuardSpace reads r, stopping with errdefs.ErrExhausted as the disk of
// dir passes Config.MinFreeDiskBytes.
func (s *Service) GuardSpace(r io.Reader, dir string) io.Reader {
	return &spaceGuard{r: r, s: s, dir: dir}
}

// FlattenLimit bounds what an image may unpack to in dir.
func (s *Service) FlattenLimit(dir string) (limit int64, room bool, err error) {
	return s.flattenLimit(dir)
}

// OperationStarted counts a build's operation as started.
func (s *Service) OperationStarted(op store.Operation) { s.m.opStarted(op.Kind) }

// OperationFinished wakes those waiting for a build's operation and
// counts it as finished.
func (s *Service) OperationFinished(op store.Operation, took time.Duration) {
	s.opFinished(op.ID)
	s.m.opFinished(op.Kind, op.Status, took)
}
