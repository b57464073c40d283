package sandbox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway"
	"github.com/airlockhq/airlock/internal/gateway/mitm"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/vm"
)

// NetworkConfig is what every sandbox's gateway shares: where names are
// resolved, which roots verify the upstreams of intercepted hosts, the
// counters, and the per-sandbox limits.
type NetworkConfig struct {
	// DNSUpstream is the resolver (HOST:PORT) the gateways ask; empty
	// means the host's, from /etc/resolv.conf.
	DNSUpstream string
	// RootCAs verifies upstream TLS for hosts with credentials; nil means
	// the host's roots (SSL_CERT_FILE is honoured).
	RootCAs *x509.CertPool
	// Metrics counts flows, bytes and DNS queries; nil counts nothing.
	Metrics *gateway.Metrics
	// Limits bound each sandbox's flows, handshakes and DNS queries.
	Limits gateway.Limits
	// Private are the parts of the private ranges (RFC 1918, CGNAT) the
	// operator opened (airlock serve --egress-private): a policy's allow
	// entry naming an address in them literally admits it.
	Private []netip.Prefix
	// Secret returns the value of the secret name for sandbox id's
	// credential rules; nil means there are no secrets, and credential
	// rules fail closed.
	Secret func(ctx context.Context, id, name string) (string, error)
}

// Files of a sandbox's gateway in its directory.
const (
	// EgressLogName is the egress log: every flow and DNS query, JSON
	// lines in two rotating segments of egressLogBytes.
	EgressLogName = "egress.log"
	// gatewayDirName holds the sandbox's CA (certificate and key), which
	// never enters the VM.
	gatewayDirName = "gateway"
)

// egressLogBytes bounds each of the egress log's two segments.
const egressLogBytes = 1 << 20

// caName is the common name of sandbox id's CA.
func caName(id string) string { return "airlock sandbox " + id + " gateway CA" }

// startGateway connects a gateway to the network device of the sandbox's
// VM, with the sandbox's policy. A VM without a network device (one made
// before sandboxes had networks) gets none.
func (r *Runtime) startGateway(ctx context.Context, s *Sandbox, netMAC string) error {
	if netMAC == "" {
		return nil
	}
	ca, err := mitm.LoadOrCreateCA(filepath.Join(s.Dir, gatewayDirName), caName(s.ID))
	if err != nil {
		return fmt.Errorf("sandbox CA: %w", err)
	}
	events, err := gateway.OpenLog(filepath.Join(s.Dir, EgressLogName), egressLogBytes)
	if err != nil {
		return fmt.Errorf("egress log: %w", err)
	}
	nc := r.cfg.Network
	secret := func(ctx context.Context, name string) (string, error) {
		if nc.Secret == nil {
			return "", fmt.Errorf("secret %q: sandboxes have no secrets here: %w", name, errdefs.ErrNotFound)
		}
		return nc.Secret(ctx, s.ID, name)
	}
	g, err := gateway.Start(ctx, gateway.Config{
		Socket:      s.vm.NetSocket(),
		Policy:      s.Spec.policy(),
		CA:          ca,
		Secret:      secret,
		DNSUpstream: nc.DNSUpstream,
		RootCAs:     nc.RootCAs,
		Log:         s.log.With("component", "gateway"),
		Events:      events,
		Metrics:     nc.Metrics,
		Limits:      nc.Limits,
		Private:     nc.Private,
	})
	if err != nil {
		events.Close()
		return fmt.Errorf("start gateway: %w", err)
	}
	s.mu.Lock()
	s.gw, s.ca, s.events = g, ca, events
	s.mu.Unlock()
	return nil
}

// gatewayStep starts the sandbox's gateway once its VM's QEMU runs.
func (r *Runtime) gatewayStep(s *Sandbox, cfg *vm.Config) step {
	return step{"start gateway", func(ctx context.Context) error {
		return r.startGateway(ctx, s, cfg.NetMAC)
	}, func() { s.closeGateway() }}
}

// linkStep tells the guest its network link is up, once its gateway is
// connected and any saved state (whose link was down) restored.
func linkStep(s *Sandbox) step {
	return step{"network link up", func(ctx context.Context) error {
		return s.linkUp(ctx)
	}, nil}
}

// linkUp sets the VM's network link up when it has a gateway.
func (s *Sandbox) linkUp(ctx context.Context) error {
	if s.Gateway() == nil {
		return nil
	}
	return s.vm.SetLink(ctx, true)
}

// closeGateway ends the sandbox's gateway and its log, if it has them.
// Guest flows end with it; the guest's interface stays configured for the
// next gateway.
func (s *Sandbox) closeGateway() {
	s.mu.Lock()
	g, events := s.gw, s.events
	s.gw, s.events = nil, nil
	s.mu.Unlock()
	if g != nil {
		g.Close()
	}
	if events != nil {
		events.Close()
	}
}

// guestNetwork is the network part of the guest's init: its address, the
// gateway as router and resolver, and the CA to trust; nil without a
// gateway.
func (s *Sandbox) guestNetwork() *agentproto.NetworkConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gw == nil {
		return nil
	}
	return &agentproto.NetworkConfig{
		MAC:     gateway.GuestMAC,
		Address: gateway.GuestIP + "/" + strconv.Itoa(gateway.PrefixLen),
		Gateway: gateway.GatewayIP,
		MTU:     gateway.MTU,
		CACert:  s.ca.CertPEM(),
	}
}

// policy is the spec's network policy; no policy denies all egress.
func (spec Spec) policy() policy.Policy {
	if spec.Network == nil {
		return policy.Policy{Egress: "deny"}
	}
	return *spec.Network
}

// Gateway is the sandbox's gateway, or nil when its VM has no network
// device (or is suspended).
func (s *Sandbox) Gateway() *gateway.Gateway {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gw
}

// SetNetwork replaces the sandbox's network policy: its gateway judges
// every new flow by it, and closes open flows it forbids. The policy is
// also recorded for the sandbox's next wake.
func (s *Sandbox) SetNetwork(p policy.Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p = p.Normalized()
	if g := s.Gateway(); g != nil {
		if err := g.SetPolicy(p); err != nil {
			return err
		}
	}
	return recordNetwork(s.Dir, p)
}

// SetNetworkRecord records policy p for the next wake of suspended
// sandbox id, as SetNetwork does for a running one.
func (r *Runtime) SetNetworkRecord(id string, p policy.Policy) error {
	if !ValidID(id) {
		return invalidID(id)
	}
	if err := p.Validate(); err != nil {
		return err
	}
	return recordNetwork(r.cfg.Dir.Sandbox(id), p.Normalized())
}

// recordNetwork writes p into the record of the sandbox in dir. A sandbox
// without a record cannot be woken, so it needs none.
func recordNetwork(dir string, p policy.Policy) error {
	rec, err := readRecord(dir)
	if err != nil {
		return nil
	}
	rec.Spec.Network = &p
	return writeRecord(dir, rec)
}

// EgressLog lists the newest limit entries of the sandbox's egress log.
func (s *Sandbox) EgressLog(limit int) ([]gateway.Event, error) {
	s.mu.Lock()
	events := s.events
	s.mu.Unlock()
	if events == nil {
		return readEgressLog(s.Dir, limit)
	}
	return events.List(limit)
}

// EgressLog lists the newest limit entries of the egress log of sandbox
// id while no Sandbox of this process has it open: one that is suspended.
func (r *Runtime) EgressLog(id string, limit int) ([]gateway.Event, error) {
	if !ValidID(id) {
		return nil, invalidID(id)
	}
	return readEgressLog(r.cfg.Dir.Sandbox(id), limit)
}

func readEgressLog(dir string, limit int) ([]gateway.Event, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil // a deleted sandbox: its log went with it
	}
	l, err := gateway.OpenLog(filepath.Join(dir, EgressLogName), egressLogBytes)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return l.List(limit)
}

// DialGuest opens a TCP connection to port in the sandbox's guest,
// through its gateway.
func (s *Sandbox) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	g := s.Gateway()
	if g == nil {
		return nil, fmt.Errorf("sandbox %s has no network: %w", s.ID, errdefs.ErrPrecondition)
	}
	return g.DialGuest(ctx, port)
}
