package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/store"
)

// Bounds of the egress log listing.
const (
	defaultEgressLog = 100
	maxEgressLog     = 1000
)

// parseNetwork reads a NetworkPolicy from a request: absent means the
// host's default egress with no rules. Every credential must name a secret
// the owner has stored.
func (s *Service) parseNetwork(ctx context.Context, owner string, raw json.RawMessage) (policy.Policy, json.RawMessage, error) {
	p := policy.Policy{Egress: s.cfg.DefaultEgress}
	if len(raw) > 0 && string(raw) != "null" {
		var err error
		if p, err = policy.Parse(raw); err != nil {
			return p, nil, err
		}
	}
	p = p.Normalized()
	if err := s.egressBounds().Check(p, "network"); err != nil {
		return p, nil, err
	}
	if names := p.Secrets(); len(names) > 0 {
		if err := s.CheckSecrets(ctx, owner, names); err != nil {
			return p, nil, err
		}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return p, nil, err
	}
	return p, b, nil
}

// egressBounds is what no policy may open on this host: the gateway's
// address, the host's own, the always-denied ranges and the private ones
// the operator did not open.
func (s *Service) egressBounds() policy.Bounds {
	host, err := gateway.HostAddrs()
	if err != nil {
		s.log.Warn("network policy: the host's addresses are unknown; its gateways still deny them", "err", err)
	}
	return policy.Bounds{Gateway: netip.MustParseAddr(gateway.GatewayIP), Host: host, Private: s.cfg.EgressPrivate}
}

// mayChangeCredentials refuses a change to sb's credential rules by any
// key but the one that owns it. A rule names a secret of the owner's and
// the host it is sent to: another key, an admin's among them, could aim
// the owner's secret at a host of its own and read it there. Policies
// whose credential rules stay as they were are anyone's to set who may
// see the sandbox.
func mayChangeCredentials(p Principal, sb store.Sandbox, next policy.Policy) error {
	if p.KeyID == sb.Owner || slices.Equal(storedPolicy(sb).Credentials, next.Normalized().Credentials) {
		return nil
	}
	return fmt.Errorf("only the key that created sandbox %s may add, change or remove its credential rules: they send that key's secrets: %w", sb.ID, errdefs.ErrPermission)
}

// storedPolicy is the policy recorded for sb; a row without one (made
// before sandboxes had networks) denies all egress.
func storedPolicy(sb store.Sandbox) policy.Policy {
	if len(sb.Network) == 0 {
		return policy.Policy{Egress: "deny"}
	}
	p, err := policy.Parse(sb.Network)
	if err != nil {
		return policy.Policy{Egress: "deny"}
	}
	return p.Normalized()
}

// SetNetwork replaces a sandbox's egress policy. A running or paused
// sandbox's gateway applies it at once, closing open connections it
// forbids; a suspended one's wakes with it.
func (s *Service) SetNetwork(ctx context.Context, p Principal, id string, raw json.RawMessage) (apiv1.Sandbox, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return apiv1.Sandbox{}, err
	}
	if len(raw) == 0 || string(raw) == "null" {
		return apiv1.Sandbox{}, fmt.Errorf("the body must be a NetworkPolicy, for example {\"egress\": \"deny\", \"allow\": [\"example.com\"]}: %w", errdefs.ErrInvalid)
	}
	pol, stored, err := s.parseNetwork(ctx, sb.Owner, raw)
	if err != nil {
		return apiv1.Sandbox{}, err
	}
	if err := mayChangeCredentials(p, sb, pol); err != nil {
		return apiv1.Sandbox{}, err
	}
	// One lifecycle change at a time: the VM must not come or go while
	// its gateway is given the policy.
	if err := s.lockSettled(ctx, id); err != nil {
		return apiv1.Sandbox{}, err
	}
	if f := s.busy[id]; f != nil {
		s.mu.Unlock()
		return apiv1.Sandbox{}, fmt.Errorf("sandbox %s has a %s operation in flight: wait for it and retry: %w", id, f.kind, errdefs.ErrConflict)
	}
	if _, ok := s.creating[id]; ok {
		s.mu.Unlock()
		return apiv1.Sandbox{}, fmt.Errorf("sandbox %s is being created: retry when it runs: %w", id, errdefs.ErrConflict)
	}
	f := &inflight{kind: "network", done: make(chan struct{})}
	s.busy[id] = f
	lv := s.live[id]
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, id)
		s.mu.Unlock()
		close(f.done)
	}()
	switch sb.State {
	case apiv1.StateRunning, apiv1.StatePaused, apiv1.StateSuspended:
	default:
		return apiv1.Sandbox{}, fmt.Errorf("sandbox %s is %s: only a running, paused or suspended sandbox has a network to change: %w", id, sb.State, errdefs.ErrConflict)
	}
	if lv == nil {
		return apiv1.Sandbox{}, fmt.Errorf("sandbox %s is not looked after by this server: %w", id, errdefs.ErrUnavailable)
	}
	if box, _, err := lv.vm(); err == nil {
		if err := box.SetNetwork(pol); err != nil {
			return apiv1.Sandbox{}, fmt.Errorf("apply the network policy: %w", err)
		}
	} else if err := s.rt.SetNetworkRecord(id, pol); err != nil {
		return apiv1.Sandbox{}, fmt.Errorf("record the network policy: %w", err)
	}
	s.mu.Lock()
	cur, err := s.st.GetSandbox(ctx, id)
	if err == nil {
		cur.Network, cur.UpdatedAt = stored, s.now()
		err = s.st.UpdateSandbox(ctx, cur)
	}
	s.mu.Unlock()
	if err != nil {
		return apiv1.Sandbox{}, fmt.Errorf("record the network policy: %w", err)
	}
	s.publish(cur)
	return s.sandboxView(cur), nil
}

// EgressLog lists the newest entries of a sandbox's egress log: every
// flow and DNS query its gateway judged.
func (s *Service) EgressLog(ctx context.Context, p Principal, id string, limit int) (apiv1.List[apiv1.EgressEvent], error) {
	out := apiv1.List[apiv1.EgressEvent]{Items: []apiv1.EgressEvent{}}
	if _, err := s.getOwned(ctx, p, id); err != nil {
		return out, err
	}
	switch {
	case limit == 0:
		limit = defaultEgressLog
	case limit < 0 || limit > maxEgressLog:
		return out, fmt.Errorf("limit %d is out of bounds: use 1 to %d: %w", limit, maxEgressLog, errdefs.ErrInvalid)
	}
	var events []gateway.Event
	var err error
	if _, box, verr := s.liveVM(id); verr == nil {
		events, err = box.EgressLog(limit)
	} else {
		events, err = s.rt.EgressLog(id, limit)
	}
	if err != nil {
		return out, fmt.Errorf("read the egress log: %w", err)
	}
	for _, e := range events {
		out.Items = append(out.Items, apiv1.EgressEvent{
			Time: e.Time, Proto: e.Proto, Phase: e.Phase, Count: e.Count, Host: e.Host, IP: e.IP, Port: e.Port,
			Verdict: e.Verdict, Reason: e.Reason, BytesOut: e.BytesOut, BytesIn: e.BytesIn,
		})
	}
	return out, nil
}

// DialPort opens a TCP connection to port in a running sandbox, through its
// gateway: the inbound path of the ports proxy.
func (s *Service) DialPort(ctx context.Context, p Principal, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is out of bounds: use 1 to 65535: %w", port, errdefs.ErrInvalid)
	}
	if _, err := s.getOwned(ctx, p, id); err != nil {
		return nil, err
	}
	// The connection uses the sandbox, which it may wake, until closed.
	release, err := s.use(ctx, id)
	if err != nil {
		return nil, err
	}
	_, box, err := s.liveVM(id)
	if err != nil {
		release()
		return nil, err
	}
	if box.Paused() {
		release()
		return nil, fmt.Errorf("sandbox %s is paused: wake it first: %w", id, errdefs.ErrConflict)
	}
	c, err := box.DialGuest(ctx, uint16(port))
	if err != nil {
		release()
		return nil, err
	}
	return &usedConn{Conn: c, release: release}, nil
}

// usedConn is a connection to a sandbox's port, which uses the sandbox
// until it is closed.
type usedConn struct {
	net.Conn
	release func()
}

func (c *usedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// SandboxSecret returns the value of secret name for sandbox id's
// credential rules: a secret of the key that created the sandbox.
func (s *Service) SandboxSecret(ctx context.Context, id, name string) (string, error) {
	sb, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	return s.SecretValue(ctx, sb.Owner, name)
}
