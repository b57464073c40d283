package e2b

import (
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// clientID is the constant E2B's API returns in the deprecated, required
// clientID field.
const clientID = "6532622b"

// farFuture is the endAt of a sandbox without a lease: it has no end.
var farFuture = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// E2B's sandbox states.
const (
	stateRunning = "running"
	statePaused  = "paused"
)

// e2bState is how E2B names an airlock state: "running" or "paused", or
// "" for a sandbox E2B would not show (deleted, being deleted, failed).
//
// A paused airlock sandbox (vCPUs stopped, memory resident) is "paused"
// too: like a suspended one, it runs nothing and answers no traffic until
// connect wakes it. A creating one is "running" (create answers once it
// runs), a waking one "paused" (it is not usable yet).
func e2bState(state string) string {
	switch state {
	case apiv1.StateCreating, apiv1.StateRunning:
		return stateRunning
	case apiv1.StatePaused, apiv1.StateSuspending, apiv1.StateSuspended, apiv1.StateWaking:
		return statePaused
	}
	return ""
}

// templateID is how a sandbox's template is shown to SDKs: its name, with
// the tag when it is not "latest".
func templateID(sb apiv1.Sandbox) string {
	return strings.TrimSuffix(sb.Template.Ref, ":latest")
}

// alias is the name of a sandbox's template.
func alias(sb apiv1.Sandbox) string {
	name, _, _ := strings.Cut(sb.Template.Ref, ":")
	return name
}

// Sandbox is E2B's Sandbox: the answer to create and connect.
type Sandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// lifecycle is E2B's SandboxLifecycle.
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// ListedSandbox is E2B's ListedSandbox: one item of a list.
type ListedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// SandboxDetail is E2B's SandboxDetail: the answer to GET /sandboxes/{id}.
type SandboxDetail struct {
	ListedSandbox
	EnvdAccessToken     string      `json:"envdAccessToken"`
	AllowInternetAccess *bool       `json:"allowInternetAccess"`
	Domain              *string     `json:"domain"`
	Network             networkView `json:"network"`
	Lifecycle           lifecycle   `json:"lifecycle"`
}

func (s *Server) domain() *string {
	if s.cfg.Domain == "" {
		return nil
	}
	d := s.cfg.Domain
	return &d
}

func (s *Server) sandboxView(sb apiv1.Sandbox) Sandbox {
	return Sandbox{
		TemplateID: templateID(sb), SandboxID: sb.ID, Alias: alias(sb), ClientID: clientID,
		EnvdVersion: s.cfg.EnvdVersion, EnvdAccessToken: s.svc.SandboxAccessToken(sb.ID),
		Domain: s.domain(),
	}
}

func (s *Server) listedView(sb apiv1.Sandbox) ListedSandbox {
	end := farFuture
	if sb.ExpiresAt != nil {
		end = sb.ExpiresAt.UTC()
	}
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return ListedSandbox{
		TemplateID: templateID(sb), Alias: alias(sb), SandboxID: sb.ID, ClientID: clientID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end,
		CPUCount: sb.VCPUs, MemoryMB: sb.MemoryMiB, DiskSizeMB: sb.DiskMiB,
		Metadata: md, State: e2bState(sb.State), EnvdVersion: s.cfg.EnvdVersion,
	}
}

func (s *Server) detailView(sb apiv1.Sandbox) SandboxDetail {
	net, internet := viewNetwork(sb.Network)
	onTimeout := "kill"
	if sb.OnTimeout == "suspend" {
		onTimeout = "pause"
	}
	return SandboxDetail{
		ListedSandbox:       s.listedView(sb),
		EnvdAccessToken:     s.svc.SandboxAccessToken(sb.ID),
		AllowInternetAccess: internet, Domain: s.domain(), Network: net,
		Lifecycle: lifecycle{AutoResume: sb.WakeOnRequest, OnTimeout: onTimeout},
	}
}
