package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/store"
)

// Idle sandboxes (docs/api.md, "Idle sandboxes"). What uses a sandbox is
// told to s.idle (internal/idle): the calls that need it running hold it
// through use, its running commands and open streams through the
// command sessions (Sandboxes.Hold, Use). Once a second applyIdle
// suspends or pauses, as its on_idle says, each sandbox this server runs
// that nothing has used for its idle_s. A call that needs a paused or
// suspended sandbox that wakes on request wakes it and waits (use).

// OnIdle values.
const (
	OnIdleSuspend = "suspend"
	OnIdlePause   = "pause"
)

// maxIdle bounds idle_s: a year, as a lease.
const maxIdle = maxLease

// wakeWait is how long a call waits for the wake of the sandbox it needs.
const wakeWait = 60 * time.Second

// idleSettings checks a create's idle_s and on_idle and returns them with
// on_idle's default.
func idleSettings(idleS *int, onIdle string) (int, string, error) {
	n := 0
	if idleS != nil {
		n = *idleS
	}
	if n < 0 || n > maxIdle {
		return 0, "", fmt.Errorf("idle_s %d is out of bounds: use 0 (never idle) to %d: %w", n, maxIdle, errdefs.ErrInvalid)
	}
	switch onIdle {
	case "":
		onIdle = OnIdleSuspend
	case OnIdleSuspend, OnIdlePause:
	default:
		return 0, "", fmt.Errorf("on_idle %q is not \"suspend\" or \"pause\": %w", fields.Truncate(onIdle, 40), errdefs.ErrInvalid)
	}
	return n, onIdle, nil
}

// applyIdle suspends or pauses the sandboxes due.
func (s *Service) applyIdle() {
	s.mu.Lock()
	var due []*live
	for id, lv := range s.live {
		if lv.idleS <= 0 || s.busy[id] != nil || !s.idle.Due(id, lv.idleS) {
			continue
		}
		// Suspended (no VM), or paused already with nothing more to do.
		if box := lv.vmBox(); box == nil || lv.onIdle == OnIdlePause && box.Paused() {
			continue
		}
		due = append(due, lv)
	}
	s.mu.Unlock()
	for _, lv := range due {
		if err := s.goIdle(lv); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			// Over a limit, say: try again after another idle_s, not
			// every second.
			s.idle.Touch(lv.id)
			s.log.Warn("idle: suspend or pause", "sandbox", lv.id, "err", err)
		}
	}
}

// goIdle suspends or pauses the idle sandbox lv, as its on_idle says,
// recording a sandbox.idle event with the operation. A conflict says it
// was not due after all: in use again, paused already (for a pause), or
// under another operation.
func (s *Service) goIdle(lv *live) error {
	system := Principal{Role: apiv1.RoleAdmin}
	kind, transitional := apiv1.OpSuspend, apiv1.StateSuspending
	if lv.onIdle == OnIdlePause {
		kind, transitional = apiv1.OpPause, ""
	}
	since, _ := s.idle.Quiet(lv.id)
	data, err := json.Marshal(struct {
		IdleS     int       `json:"idle_s"`
		OnIdle    string    `json:"on_idle"`
		IdleSince time.Time `json:"idle_since"`
	}{lv.idleS, kind, since.UTC()})
	if err != nil {
		return err
	}
	if kind == apiv1.OpSuspend {
		cur, err := s.st.GetSandbox(s.ctx, lv.id)
		if err != nil {
			return err
		}
		if err := s.admitSuspend(s.ctx, cur); err != nil {
			return err
		}
	}
	var from string
	sb, op, f, err := s.beginOpLocked(s.ctx, system, lv.id, kind, transitional, &from,
		&idleBegin{quiet: func() bool { return s.idle.Due(lv.id, lv.idleS) }, data: data})
	if err != nil {
		return err
	}
	s.log.Info("idle: "+kind, "sandbox", lv.id, "idle_s", lv.idleS)
	if kind == apiv1.OpPause {
		go s.runPause(sb, op, f)
	} else {
		go s.runSuspend(sb, op, f, from)
	}
	return nil
}

// use readies sandbox id, which the caller may use, for a call that
// needs it running, and holds it in use until release. A sandbox that
// wakes on request and is paused or suspended (or on its way there) is
// woken, once for any number of calls at the same time, and waited for
// up to wakeWait. Any other sandbox is left as it is: the caller's own
// check answers for its state.
func (s *Service) use(ctx context.Context, id string) (release func(), err error) {
	// The hold comes first, under s.mu: an idle suspend beginning now
	// either sees it and does not begin, or has begun and is waited for
	// below (beginOpLocked checks quiet under s.mu).
	s.mu.Lock()
	release = s.idle.Hold(id)
	s.mu.Unlock()
	if err := s.wakeForUse(ctx, id); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// wakeForUse wakes sandbox id if it wakes on request and is not running,
// and waits until it runs, its wake fails or wakeWait passes.
func (s *Service) wakeForUse(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, wakeWait)
	defer cancel()
	system := Principal{Role: apiv1.RoleAdmin}
	for {
		sb, err := s.st.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if !sb.WakeOnRequest {
			return nil
		}
		s.mu.Lock()
		f := s.busy[id]
		s.mu.Unlock()
		switch {
		case f != nil:
			// A suspend, pause or wake in flight: wait for its end and
			// look again.
		case sb.State == apiv1.StateRunning:
			return nil
		case sb.State == apiv1.StatePaused || sb.State == apiv1.StateSuspended:
			so, err := s.Wake(ctx, system, id)
			switch {
			case errors.Is(err, errdefs.ErrConflict):
				// Another call's wake (or another operation) began first.
			case err != nil:
				return fmt.Errorf("wake sandbox %s: %w", id, err)
			default:
				op, err := s.GetOperation(ctx, system, so.Operation.ID, wakeWait)
				if err != nil {
					return err
				}
				if op.Error != nil {
					return fmt.Errorf("wake sandbox %s: %s: %w", id, op.Error.Message, errdefs.ErrConflict)
				}
				continue
			}
		default:
			return nil // creating, failed, deleting: the caller's check answers
		}
		if f != nil {
			select {
			case <-f.done:
				continue
			case <-ctx.Done():
			}
		} else {
			// A wake that lost the race to another: its operation is
			// marked busy by now, or has ended; look again shortly.
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
			}
		}
		return fmt.Errorf("sandbox %s did not wake within %s: retry: %w", id, wakeWait, errdefs.ErrUnavailable)
	}
}

// UseSandbox readies sandbox id for a call of p's that needs it running,
// as the command sessions' Use does, for the edges' own traffic (E2B
// envd and ports): the call uses the sandbox until release.
func (s *Service) UseSandbox(ctx context.Context, p Principal, id string) (release func(), err error) {
	if _, err := s.getOwned(ctx, p, id); err != nil {
		return nil, err
	}
	return s.use(ctx, id)
}

// idleView fills v's idle settings from sb.
func idleView(v *apiv1.Sandbox, sb store.Sandbox) {
	v.IdleS, v.OnIdle, v.WakeOnRequest = sb.IdleS, sb.OnIdle, sb.WakeOnRequest
	if v.OnIdle == "" {
		v.OnIdle = OnIdleSuspend
	}
}
