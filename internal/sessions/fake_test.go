package sessions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// The fake runtime's VMs are what commands run on.
var _ VM = (*sandboxtest.VM)(nil)

// sandboxes is a hand-written Sandboxes: the sandboxes are the store's,
// and the ones this server looks after are those a test puts in live.
type sandboxes struct {
	st *store.Store

	mu    sync.Mutex          // guards live and holds
	live  map[string]*liveBox // by sandbox ID
	holds map[string]int      // uses not yet released (Use, Hold), by sandbox ID
	uses  map[string]int      // calls of Use, by sandbox ID
}

// liveBox is a sandbox looked after here: its lifetime, and its VM with
// the VM's context while it has one.
type liveBox struct {
	ctx      context.Context
	cancel   context.CancelFunc
	vm       VM
	vmCtx    context.Context
	vmCancel context.CancelFunc
}

func (f *sandboxes) Owned(ctx context.Context, p tenancy.Principal, id string) (store.Sandbox, error) {
	sb, err := f.st.GetSandbox(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && !p.Owns(sb.Owner) {
		return store.Sandbox{}, fmt.Errorf("sandbox %s not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, err
}

func (f *sandboxes) Running(ctx context.Context, p tenancy.Principal, id string) error {
	sb, err := f.Owned(ctx, p, id)
	if err != nil {
		return err
	}
	if _, _, err := f.VM(id); sb.State != apiv1.StateRunning || err != nil {
		return fmt.Errorf("sandbox %s is %s, not running: %w", id, sb.State, errdefs.ErrConflict)
	}
	return nil
}

func (f *sandboxes) Use(ctx context.Context, id string) (func(), error) {
	f.mu.Lock()
	f.uses[id]++
	f.mu.Unlock()
	return f.Hold(id), nil
}

func (f *sandboxes) Hold(id string) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.holds[id]--
		})
	}
}

// held returns the uses of sandbox id not yet released.
func (f *sandboxes) held(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holds[id]
}

func (f *sandboxes) Live(id string) (context.Context, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb := f.live[id]
	if lb == nil {
		return nil, false
	}
	return lb.ctx, true
}

func (f *sandboxes) VM(id string) (VM, context.Context, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb := f.live[id]
	if lb == nil || lb.vm == nil {
		return nil, nil, fmt.Errorf("sandbox %s has no running VM: %w", id, errdefs.ErrConflict)
	}
	return lb.vm, lb.vmCtx, nil
}

// look makes sandbox id one this server looks after, with vm (nil: a
// suspended one).
func (f *sandboxes) look(id string, vm VM) {
	ctx, cancel := context.WithCancel(context.Background())
	lb := &liveBox{ctx: ctx, cancel: cancel}
	if vm != nil {
		lb.vm = vm
		lb.vmCtx, lb.vmCancel = context.WithCancel(ctx)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[id] = lb
}

// setVM gives sandbox id a VM (nil: none), ending the last one's context.
func (f *sandboxes) setVM(id string, vm VM) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lb := f.live[id]
	if lb.vmCancel != nil {
		lb.vmCancel()
	}
	lb.vm, lb.vmCtx, lb.vmCancel = nil, nil, nil
	if vm != nil {
		lb.vm = vm
		lb.vmCtx, lb.vmCancel = context.WithCancel(lb.ctx)
	}
}

// let ends sandbox id's lifetime here.
func (f *sandboxes) let(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if lb := f.live[id]; lb != nil {
		lb.cancel()
		delete(f.live, id)
	}
}

// fixture is Commands over a store in a temp directory and the fake
// sandboxes.
type fixture struct {
	dir datadir.Dir
	st  *store.Store
	sb  *sandboxes
	c   *Commands
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(dir.Store())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sb := &sandboxes{st: st, live: map[string]*liveBox{}, holds: map[string]int{}, uses: map[string]int{}}
	c := New(Config{Dir: dir, Store: st, Sandboxes: sb, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	return &fixture{dir: dir, st: st, sb: sb, c: c}
}

// testWriter writes a log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
