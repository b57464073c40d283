package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
	"github.com/airlockhq/airlock/internal/service"
)

// handler serves one control-plane route for an authenticated caller. It
// returns an error only before it has written anything.
type handler func(w http.ResponseWriter, r *http.Request, p service.Principal) error

type route struct {
	method, path string
	handle       handler
}

func (s *Server) routes() []route {
	return []route{
		{"POST", "/sandboxes", s.create(false)},
		{"POST", "/v2/sandboxes", s.create(true)},
		{"GET", "/sandboxes", s.listRunning},
		{"GET", "/v2/sandboxes", s.list},
		{"GET", "/sandboxes/{id}", s.get},
		{"DELETE", "/sandboxes/{id}", s.kill},
		{"POST", "/sandboxes/{id}/timeout", s.setTimeout},
		{"POST", "/sandboxes/{id}/refreshes", s.refresh},
		{"POST", "/sandboxes/{id}/pause", s.pause},
		{"POST", "/sandboxes/{id}/connect", s.connectRoute(false)},
		{"POST", "/v2/sandboxes/{id}/connect", s.connectRoute(true)},
		{"POST", "/sandboxes/{id}/resume", s.resume},
		{"PUT", "/sandboxes/{id}/network", s.setNetwork},
		{"GET", "/sandboxes/{id}/metrics", s.metrics},
		{"GET", "/sandboxes/{id}/logs", s.logs},
		{"GET", "/v2/sandboxes/{id}/logs", s.logs},

		{"POST", "/sandboxes/{id}/fork", s.fork},
		{"POST", "/sandboxes/{id}/snapshots", s.createSnapshot},
		{"GET", "/snapshots", s.listSnapshots},
		{"DELETE", "/snapshots/{id}", s.deleteSnapshot(false)},
		{"DELETE", "/templates/{id}", s.deleteSnapshot(true)},
		{"GET", "/sandboxes/metrics", unsupportedRoute("metrics of many sandboxes")},
	}
}

// templatesWhat names E2B's template routes, which airlock does not serve.
const templatesWhat = "E2B's template builds: build templates with airlock's native API (POST /v1/templates, docs/api.md)"

// unsupportedPrefixes are E2B's API areas airlock does not serve, with
// what to use instead.
var unsupportedPrefixes = []struct{ path, what string }{
	{"/snapshots", "this snapshot route"},
	{"/templates", templatesWhat},
	{"/v2/templates", templatesWhat},
	{"/v3/templates", templatesWhat},
	{"/volumes", "volumes"},
	{"/secrets", "E2B's secrets: airlock's native API has its own (POST /v1/secrets, docs/network.md)"},
	{"/teams", "teams"},
	{"/api-keys", "E2B's key management: use airlock's POST /v1/keys {\"format\": \"e2b\"}"},
	{"/access-tokens", "access tokens"},
	{"/nodes", "nodes"},
	{"/admin", "E2B's admin routes"},
}

func unsupportedRoute(what string) handler {
	return func(w http.ResponseWriter, r *http.Request, _ service.Principal) error {
		return fmt.Errorf("airlock's E2B API does not serve %s (%s %s); see docs/e2b.md: %w", what, r.Method, truncate(r.URL.Path, 100), errNotImplemented)
	}
}

// register puts the routes on the mux, one handler per path that picks
// the method, so that a path served for some methods answers 405 for the
// others, and an unknown path 404, both in E2B's error shape.
func (s *Server) register() {
	byPath := map[string]map[string]http.Handler{}
	var order []string
	for _, rt := range s.routes() {
		if byPath[rt.path] == nil {
			byPath[rt.path] = map[string]http.Handler{}
			order = append(order, rt.path)
		}
		h := rt.handle
		// A sandbox's info is its row, which any server reads.
		if strings.Contains(rt.path, "sandboxes/{id}") && !(rt.method == http.MethodGet && rt.path == "/sandboxes/{id}") {
			h = s.forwarded(h)
		}
		byPath[rt.path][rt.method] = s.authed(h)
	}
	for _, p := range order {
		handlers := byPath[p]
		var allow []string
		for m := range handlers {
			allow = append(allow, m)
		}
		slices.Sort(allow)
		// In an area airlock serves only in part (DELETE /templates/{id}
		// of a snapshot), the other methods are the area's 501.
		var rest http.Handler
		for _, u := range unsupportedPrefixes {
			if p == u.path || strings.HasPrefix(p, u.path+"/") {
				rest = s.authed(unsupportedRoute(u.what))
			}
		}
		s.mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			if h, ok := handlers[r.Method]; ok {
				h.ServeHTTP(w, r)
				return
			}
			if rest != nil {
				rest.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, Error{Code: http.StatusMethodNotAllowed,
				Message: fmt.Sprintf("%s %s is not served: use %s", r.Method, r.URL.Path, strings.Join(allow, " or "))})
		})
	}
	for _, u := range unsupportedPrefixes {
		h := s.authed(unsupportedRoute(u.what))
		if byPath[u.path] == nil {
			s.mux.Handle(u.path, h)
		}
		s.mux.Handle(u.path+"/", h)
	}
	s.mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("no route %s %s: see docs/e2b.md: %w", r.Method, truncate(r.URL.Path, 100), errdefs.ErrNotFound))
	})
}

// forwarded offers a call on one sandbox to Config.Forward before h.
func (s *Server) forwarded(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		if s.cfg.Forward != nil {
			if done, err := s.cfg.Forward(w, r, r.PathValue("id")); done || err != nil {
				return err
			}
		}
		return h(w, r, p)
	}
}

// authed authenticates the X-API-Key header (any case) and runs h.
func (s *Server) authed(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimSpace(r.Header.Get("X-API-Key"))
		if key == "" {
			writeError(w, fmt.Errorf("missing API key: send it in the X-API-Key header (E2B_API_KEY); make one with POST /v1/keys {\"format\": \"e2b\"} or `airlock key create --e2b`: %w", errdefs.ErrUnauthenticated))
			return
		}
		p, err := s.svc.Authenticate(r.Context(), key)
		if errors.Is(err, errdefs.ErrUnauthenticated) {
			err = fmt.Errorf("the API key in X-API-Key is not valid: use a key from POST /v1/keys {\"format\": \"e2b\"} or `airlock key create --e2b`: %w", errdefs.ErrUnauthenticated)
		}
		if err == nil {
			err = h(w, r, p)
		}
		if err != nil {
			writeError(w, err)
			if status(err) == http.StatusInternalServerError {
				s.log.Error("E2B request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
		}
	})
}

// notFound is the error for a sandbox p cannot see, or one E2B would not
// show; the SDKs turn its code 404 into "not found".
func notFound(id string) error {
	return fmt.Errorf("sandbox %q not found: %w", truncate(id, 80), errdefs.ErrNotFound)
}

// sandbox returns a sandbox p may see and E2B would show.
func (s *Server) sandbox(ctx context.Context, p service.Principal, id string) (apiv1.Sandbox, error) {
	sb, err := s.svc.GetSandbox(ctx, p, id)
	if err != nil {
		return sb, err
	}
	if e2bState(sb.State) == "" {
		if sb.State == apiv1.StateFailed && sb.LastError != nil {
			return sb, fmt.Errorf("sandbox %s not found: it failed (%s); kill it to free what it holds: %w", id, sb.LastError.Message, errdefs.ErrNotFound)
		}
		return sb, notFound(id)
	}
	return sb, nil
}

// unsupported is the 400 for an E2B option airlock does not have.
func unsupported(option, why string) error {
	return fmt.Errorf("%s is not supported by airlock's E2B API: %s (see docs/e2b.md): %w", option, why, errdefs.ErrInvalid)
}

// set reports whether an optional JSON value was given (and is not null).
func set(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// newSandbox is E2B's NewSandbox (POST /sandboxes) and NewSandboxV2 (POST
// /v2/sandboxes), which is the same but for secure.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResume       `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *createNetwork    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 json.RawMessage   `json:"mcp"`
	IAM                 *iam              `json:"iam"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
}

type autoResume struct {
	Enabled bool `json:"enabled"`
}

type iam struct {
	Tokens map[string]json.RawMessage `json:"tokens"`
}

// createNetwork is E2B's SandboxNetworkConfig.
type createNetwork struct {
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	Rules              json.RawMessage `json:"rules"`
	HTTPSPorts         []int           `json:"httpsPorts"`
}

// updateNetwork is E2B's SandboxNetworkUpdateConfig (PUT
// /sandboxes/{id}/network).
type updateNetwork struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	Rules               json.RawMessage `json:"rules"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

// emptyRules reports whether a rules object names no domain.
func emptyRules(raw json.RawMessage) bool {
	if !set(raw) {
		return true
	}
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && len(m) == 0
}

// templateRef is the airlock template an E2B template ID names. E2B's
// code interpreter template, "code-interpreter-v1", is airlock's
// "code-interpreter"; any other ID is an airlock ref as it is ("base",
// "base:latest", a name:tag or a sha256 digest).
func templateRef(id string) string {
	name, tag, hasTag := strings.Cut(id, ":")
	if name == "code-interpreter-v1" {
		name = "code-interpreter"
	}
	if hasTag {
		return name + ":" + tag
	}
	return name
}

// createRequest translates an E2B create into the native one. v2 is
// NewSandboxV2, whose timeout defaults to 300 s (NewSandbox's to 15 s).
// A templateID that is a snapshot's ID makes the sandbox from that
// checkpoint, with its environment and network unless the request sets
// them.
func createRequest(req newSandbox, v2 bool) (apiv1.CreateSandbox, error) {
	var out apiv1.CreateSandbox
	if req.TemplateID == "" {
		return out, fmt.Errorf("templateID is required (for example \"base\"): %w", errdefs.ErrInvalid)
	}
	if isSnapshotID(req.TemplateID) {
		// A snapshot's ID: the sandbox is made from that checkpoint.
		out.Checkpoint = req.TemplateID
	} else {
		out.Template = templateRef(req.TemplateID)
	}
	timeout := 15
	if v2 {
		timeout = 300
	}
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		return out, fmt.Errorf("timeout %d must be greater than 0 (seconds the sandbox lives without setTimeout): %w", timeout, errdefs.ErrInvalid)
	}
	out.TimeoutS = &timeout
	out.OnTimeout = "delete"
	if req.AutoPause != nil && *req.AutoPause {
		out.OnTimeout = "suspend"
	}
	if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		return out, unsupported("autoPauseMemory: false", "a paused sandbox always keeps its memory (airlock suspends it with its memory and device state)")
	}
	// autoResume: envd and port traffic to a sandbox its timeout paused
	// resumes it, as any call that needs it running does (docs/api.md,
	// "Idle sandboxes").
	out.WakeOnRequest = req.AutoResume != nil && req.AutoResume.Enabled
	if set(req.MCP) {
		return out, unsupported("mcp", "there is no MCP gateway")
	}
	if req.IAM != nil && len(req.IAM.Tokens) > 0 {
		return out, unsupported("iam", "there are no workload identity tokens")
	}
	if len(req.VolumeMounts) > 0 {
		return out, unsupported("volumeMounts", "there are no volumes")
	}
	// secure is accepted either way: every sandbox has an envd access
	// token, and the SDK sends it whenever the API returns one.
	var allowOut, denyOut []string
	if n := req.Network; n != nil {
		if n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic {
			return out, unsupported("network.allowPublicTraffic: false", "sandbox ports are reachable through the E2B listener without a traffic token")
		}
		if set(n.EgressProxy) {
			return out, unsupported("network.egressProxy", "egress cannot go through a SOCKS5 proxy; airlock's gateway dials out itself")
		}
		if n.MaskRequestHost != nil && *n.MaskRequestHost != "" {
			return out, unsupported("network.maskRequestHost", "the Host of requests to sandbox ports is passed as sent")
		}
		if !emptyRules(n.Rules) {
			return out, unsupported("network.rules", "use airlock's credential rules (PUT /v1/sandboxes/{id}/network, docs/network.md) to set headers at egress")
		}
		if len(n.HTTPSPorts) > 0 {
			return out, unsupported("network.httpsPorts", "sandbox ports are reached over plain HTTP")
		}
		allowOut, denyOut = n.AllowOut, n.DenyOut
	}
	// A sandbox whose request says nothing of egress gets the operator's
	// --default-egress (E2B's own default is open).
	if req.AllowInternetAccess != nil || len(allowOut) > 0 || len(denyOut) > 0 {
		pol, err := egressPolicy("network", req.AllowInternetAccess, allowOut, denyOut)
		if err != nil {
			return out, err
		}
		if out.Network, err = json.Marshal(pol); err != nil {
			return out, err
		}
	}
	out.Env, out.Metadata = req.EnvVars, req.Metadata
	return out, nil
}

// create is POST /sandboxes and POST /v2/sandboxes: it answers 201 once
// the sandbox runs.
func (s *Server) create(v2 bool) handler {
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		var req newSandbox
		if err := decode(w, r, &req, false); err != nil {
			return err
		}
		in, err := createRequest(req, v2)
		if err != nil {
			return err
		}
		so, err := s.svc.CreateSandbox(r.Context(), p, in)
		if err != nil {
			return err
		}
		id := so.Sandbox.ID
		op, err := s.waitOp(r.Context(), p, so.Operation.ID)
		if err != nil {
			// Nobody will get its ID: it goes.
			s.abandon(p, id)
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("sandbox %s did not start within %v, and was deleted: %w", id, s.cfg.WaitTimeout, errTimeout)
			}
			return err
		}
		if op.Status == apiv1.OpFailed {
			return opFailed("create sandbox "+id, op)
		}
		sb, err := s.svc.GetSandbox(r.Context(), p, id)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, s.sandboxView(sb))
		return nil
	}
}

// abandon deletes a sandbox whose create the caller stopped waiting for.
func (s *Server) abandon(p service.Principal, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.svc.DeleteSandbox(ctx, p, id); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		s.log.Warn("delete an abandoned sandbox", "sandbox", id, "err", err)
	}
}

// opFailed is the error of a failed operation: 429 when a limit was the
// cause, else 500, with the operation's reason.
func opFailed(what string, op apiv1.Operation) error {
	msg := "no reason recorded"
	if op.Error != nil {
		msg = op.Error.Message
		if op.Error.Code == apiv1.CodeResourceExhausted {
			return fmt.Errorf("%s: %s: %w", what, msg, errdefs.ErrExhausted)
		}
	}
	return fmt.Errorf("%s failed: %s", what, msg)
}

// waitOp waits for an operation to finish, at most the wait timeout; a
// wait that runs out is context.DeadlineExceeded.
func (s *Server) waitOp(ctx context.Context, p service.Principal, id string) (apiv1.Operation, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WaitTimeout)
	defer cancel()
	for {
		op, err := s.svc.GetOperation(ctx, p, id, 30*time.Second)
		if err != nil || op.Done() {
			return op, err
		}
		if err := ctx.Err(); err != nil {
			return op, err
		}
	}
}

// transitional reports whether a sandbox is on its way to another state.
func transitional(state string) bool {
	switch state {
	case apiv1.StateCreating, apiv1.StateSuspending, apiv1.StateWaking, apiv1.StateDeleting:
		return true
	}
	return false
}

// settled returns the sandbox once it is in no transitional state, at most
// the wait timeout later.
func (s *Server) settled(ctx context.Context, p service.Principal, id string) (apiv1.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WaitTimeout)
	defer cancel()
	changes, err := s.svc.Watch(ctx, p, id)
	if err != nil {
		return apiv1.Sandbox{}, err
	}
	sb, err := s.svc.GetSandbox(ctx, p, id)
	for err == nil && transitional(sb.State) {
		select {
		case v, ok := <-changes:
			if !ok {
				sb, err = s.svc.GetSandbox(ctx, p, id)
				if err == nil && transitional(sb.State) {
					err = ctx.Err()
					if err == nil {
						err = fmt.Errorf("sandbox %s is still %s: %w", id, sb.State, errTimeout)
					}
				}
				return sb, err
			}
			sb = v
		case <-ctx.Done():
			return sb, ctx.Err()
		}
	}
	return sb, err
}

// get is GET /sandboxes/{id}.
func (s *Server) get(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sb, err := s.sandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.detailView(sb))
	return nil
}

// kill is DELETE /sandboxes/{id}: 204 once the sandbox is gone (or the
// wait timeout passed: the delete goes on).
func (s *Server) kill(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	id := r.PathValue("id")
	so, err := s.svc.DeleteSandbox(r.Context(), p, id)
	if errors.Is(err, errdefs.ErrConflict) {
		return notFound(id) // deleted, or being deleted, already
	}
	if err != nil {
		return err
	}
	if op, err := s.waitOp(r.Context(), p, so.Operation.ID); err == nil && op.Status == apiv1.OpFailed {
		s.log.Warn("E2B kill: delete failed", "sandbox", id, "err", op.Error)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type timeoutRequest struct {
	Timeout *int `json:"timeout"`
}

// setTimeout is POST /sandboxes/{id}/timeout: the lease ends timeout
// seconds from now (longer or shorter than it was).
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req timeoutRequest
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	if req.Timeout == nil {
		return fmt.Errorf("timeout is required (seconds from now): %w", errdefs.ErrInvalid)
	}
	if *req.Timeout <= 0 {
		return fmt.Errorf("timeout %d must be greater than 0; kill the sandbox to end it now: %w", *req.Timeout, errdefs.ErrInvalid)
	}
	id := r.PathValue("id")
	if _, err := s.sandbox(r.Context(), p, id); err != nil {
		return err
	}
	if _, err := s.svc.Keep(r.Context(), p, id, req.Timeout); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type refreshRequest struct {
	Duration *int `json:"duration"`
}

// refresh is POST /sandboxes/{id}/refreshes: the lease lasts at least
// duration seconds (default 15, at most 3600) from now.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req refreshRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	d := 15
	if req.Duration != nil {
		d = *req.Duration
	}
	if d < 0 || d > 3600 {
		return fmt.Errorf("duration %d is out of bounds: use 0 to 3600 seconds: %w", d, errdefs.ErrInvalid)
	}
	id := r.PathValue("id")
	sb, err := s.sandbox(r.Context(), p, id)
	if err != nil {
		return err
	}
	if err := s.extend(r.Context(), p, sb, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// extend makes a sandbox's lease end no sooner than timeout seconds from
// now; a sandbox without a lease keeps having none.
func (s *Server) extend(ctx context.Context, p service.Principal, sb apiv1.Sandbox, timeout int) error {
	if timeout <= 0 || sb.ExpiresAt == nil || !sb.ExpiresAt.Before(time.Now().Add(time.Duration(timeout)*time.Second)) {
		return nil
	}
	_, err := s.svc.Keep(ctx, p, sb.ID, &timeout)
	return err
}

type pauseRequest struct {
	Memory *bool `json:"memory"`
}

// pause is POST /sandboxes/{id}/pause: airlock suspends the sandbox (its
// memory and device state go to disk and its VM ends) and answers 204
// when that is done; 409 when it is paused already. As in E2B, a paused
// sandbox has no timeout: its lease is dropped before the suspend (and
// put back if the suspend fails), and connect sets a new one.
func (s *Server) pause(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req pauseRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	if req.Memory != nil && !*req.Memory {
		return unsupported("memory: false", "a paused sandbox always keeps its memory")
	}
	id := r.PathValue("id")
	sb, err := s.sandbox(r.Context(), p, id)
	if err != nil {
		return err
	}
	if sb.State == apiv1.StateSuspended || sb.State == apiv1.StateSuspending {
		return fmt.Errorf("sandbox %s is already paused: %w", id, errdefs.ErrConflict)
	}
	none := 0
	if _, err := s.svc.Keep(r.Context(), p, id, &none); err != nil {
		return err
	}
	err = func() error {
		so, err := s.svc.Suspend(r.Context(), p, id)
		if err != nil {
			return err
		}
		op, err := s.waitOp(r.Context(), p, so.Operation.ID)
		if err != nil {
			return err
		}
		if op.Status == apiv1.OpFailed {
			return opFailed("pause sandbox "+id, op)
		}
		return nil
	}()
	if err != nil {
		s.restoreLease(p, sb)
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// restoreLease gives a sandbox back the lease it had, after a pause that
// did not happen.
func (s *Server) restoreLease(p service.Principal, sb apiv1.Sandbox) {
	if sb.ExpiresAt == nil {
		return
	}
	left := max(1, int(time.Until(*sb.ExpiresAt).Seconds()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.svc.Keep(ctx, p, sb.ID, &left); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		s.log.Warn("E2B pause: put the lease back", "sandbox", sb.ID, "err", err)
	}
}

// connectRequest is E2B's ConnectSandbox (timeout required) and
// ConnectSandboxV2 (timeout optional, default 300).
type connectRequest struct {
	Timeout *int  `json:"timeout"`
	Memory  *bool `json:"memory"`
}

// connectRoute is POST /sandboxes/{id}/connect and its v2: 200 and the
// Sandbox when it runs (its lease made no shorter than timeout), 201 when
// it was paused and is now woken (its lease set to timeout).
func (s *Server) connectRoute(v2 bool) handler {
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		var req connectRequest
		if err := decode(w, r, &req, v2); err != nil {
			return err
		}
		timeout := 300
		switch {
		case req.Timeout != nil:
			timeout = *req.Timeout
		case !v2:
			return fmt.Errorf("timeout is required (seconds from now): %w", errdefs.ErrInvalid)
		}
		if timeout <= 0 {
			return fmt.Errorf("timeout %d must be greater than 0: %w", timeout, errdefs.ErrInvalid)
		}
		if req.Memory != nil && !*req.Memory {
			return unsupported("memory: false", "a paused sandbox always resumes with its memory")
		}
		sb, woke, err := s.connect(r.Context(), p, r.PathValue("id"), timeout, false)
		if err != nil {
			return err
		}
		code := http.StatusOK
		if woke {
			code = http.StatusCreated
		}
		writeJSON(w, code, s.sandboxView(sb))
		return nil
	}
}

// resumeRequest is E2B's ResumedSandbox.
type resumeRequest struct {
	Timeout   *int  `json:"timeout"`
	AutoPause *bool `json:"autoPause"`
	Memory    *bool `json:"memory"`
}

// resume is the deprecated POST /sandboxes/{id}/resume: connect, but 409
// for a sandbox that runs.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req resumeRequest
	if err := decode(w, r, &req, true); err != nil {
		return err
	}
	timeout := 15
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout <= 0 {
		return fmt.Errorf("timeout %d must be greater than 0: %w", timeout, errdefs.ErrInvalid)
	}
	if req.AutoPause != nil && *req.AutoPause {
		return unsupported("autoPause on resume", "what a timeout does is set at create (autoPause there)")
	}
	if req.Memory != nil && !*req.Memory {
		return unsupported("memory: false", "a paused sandbox always resumes with its memory")
	}
	sb, _, err := s.connect(r.Context(), p, r.PathValue("id"), timeout, true)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.sandboxView(sb))
	return nil
}

// connect makes sure a sandbox runs, waking it when it is paused or
// suspended, and reports whether it woke it. A running sandbox's lease is
// made no shorter than timeout; a woken one's set to it. pausedOnly
// refuses a running sandbox with 409 (resume).
func (s *Server) connect(ctx context.Context, p service.Principal, id string, timeout int, pausedOnly bool) (apiv1.Sandbox, bool, error) {
	for attempt := 0; ; attempt++ {
		sb, err := s.settled(ctx, p, id)
		if err != nil {
			return sb, false, err
		}
		switch e2bState(sb.State) {
		case "":
			_, err := s.sandbox(ctx, p, id) // says why
			return sb, false, err
		case stateRunning:
			if pausedOnly {
				return sb, false, fmt.Errorf("sandbox %s is already running: %w", id, errdefs.ErrConflict)
			}
			return sb, false, s.extend(ctx, p, sb, timeout)
		}
		so, err := s.svc.Wake(ctx, p, id)
		if errors.Is(err, errdefs.ErrConflict) && attempt < 3 {
			continue // it changed meanwhile: look again
		}
		if err != nil {
			return sb, false, err
		}
		op, err := s.waitOp(ctx, p, so.Operation.ID)
		if err != nil {
			return sb, false, err
		}
		if op.Status == apiv1.OpFailed {
			return sb, false, opFailed("resume sandbox "+id, op)
		}
		sb, err = s.svc.Keep(ctx, p, id, &timeout)
		return sb, true, err
	}
}

// setNetwork is PUT /sandboxes/{id}/network: the egress rules are
// replaced (an omitted list is cleared); airlock credential rules the
// sandbox has stay.
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req updateNetwork
	if err := decode(w, r, &req, false); err != nil {
		return err
	}
	if set(req.EgressProxy) {
		return unsupported("egressProxy", "egress cannot go through a SOCKS5 proxy; airlock's gateway dials out itself")
	}
	if !emptyRules(req.Rules) {
		return unsupported("rules", "use airlock's credential rules (PUT /v1/sandboxes/{id}/network, docs/network.md) to set headers at egress")
	}
	pol, err := egressPolicy("network", req.AllowInternetAccess, req.AllowOut, req.DenyOut)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := s.sandbox(r.Context(), p, id)
	if err != nil {
		return err
	}
	if cur, err := policy.Parse(sb.Network); err == nil {
		pol.Credentials = cur.Credentials
	}
	raw, err := json.Marshal(pol)
	if err != nil {
		return err
	}
	if _, err := s.svc.SetNetwork(r.Context(), p, id, raw); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// sandboxMetric is E2B's SandboxMetric: bytes, and a CPU share in percent.
type sandboxMetric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// metrics is GET /sandboxes/{id}/metrics: the samples the server's usage
// history (Config.Usage) took of the sandbox, every few seconds while it
// ran, stamped from start to end (unix seconds, both optional and
// included), oldest first. A sandbox not sampled yet, or a server that
// keeps no history, answers an empty list.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var window [2]time.Time
	for i, k := range []string{"start", "end"} {
		vs, ok := r.URL.Query()[k]
		if !ok {
			continue
		}
		if len(vs) != 1 {
			return fmt.Errorf("%s is given %d times: give it once: %w", k, len(vs), errdefs.ErrInvalid)
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if err != nil || n < 0 || n > maxUnix {
			return fmt.Errorf("%s %q is not unix seconds (an integer from 0 to %d): %w", k, truncate(vs[0], 40), int64(maxUnix), errdefs.ErrInvalid)
		}
		window[i] = time.Unix(n, 0)
	}
	if !window[0].IsZero() && !window[1].IsZero() && window[0].After(window[1]) {
		return fmt.Errorf("start %d is after end %d: %w", window[0].Unix(), window[1].Unix(), errdefs.ErrInvalid)
	}
	sb, err := s.sandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := []sandboxMetric{}
	if s.cfg.Usage != nil {
		for _, m := range s.cfg.Usage.Window(sb.ID, window[0], window[1]) {
			t := m.Time.UTC()
			out = append(out, sandboxMetric{
				Timestamp: t.Format(time.RFC3339), TimestampUnix: t.Unix(),
				CPUCount: m.CPUCount, CPUUsedPct: math.Round(m.CPUUsedPct*100) / 100,
				MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache,
				DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// maxUnix is the latest start or end a metrics window takes: the end of
// the year 9999, as far as a date-time goes.
const maxUnix = 253402300799

// logsWhat names what the logs routes would serve: airlock keeps no log
// stream of a sandbox as E2B does (a template's start command writes to a
// file in the guest instead).
const logsWhat = "sandbox logs (the E2B CLI's sandbox logs): a template's start command writes its output to /var/log/airlock-start.log in the sandbox, and commands stream their own"

// logs is GET /sandboxes/{id}/logs and its v2: 501, for a sandbox the key
// may see (another tenant's is 404, as everywhere).
func (s *Server) logs(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if _, err := s.sandbox(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	return unsupportedRoute(logsWhat)(w, r, p)
}
