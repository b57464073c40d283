// Package api serves airlock's HTTP API, version 1: it authenticates
// requests, decodes and bounds their input, calls the service, and maps
// errors to the contract's codes. Server-sent event streams loop on the
// request's context and end with the client or the server.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/builds"
	"github.com/airlockhq/airlock/internal/checkpoint"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/events"
	"github.com/airlockhq/airlock/internal/mcp"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/sessions"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/webhooks"
)

// MaxJSONBody bounds the body of a JSON request.
const MaxJSONBody = 1 << 20

// Config configures a Server.
type Config struct {
	// Service does the work on sandboxes, keys and secrets.
	Service *service.Service
	// Builds does the work on templates: builds, saves, build contexts
	// and the catalogue.
	Builds *builds.Service
	// Events serves GET /v1/events. Default: one over Store.
	Events *events.Service
	// Checkpoints serves checkpoints and forks. Default: one over Store
	// and Service.
	Checkpoints *checkpoint.Service
	// Webhooks serves /v1/webhooks. Default: one over Store and Secrets
	// that opens no range egress denies.
	Webhooks *webhooks.Service
	// Forward, if set, is offered every call on one sandbox (but reading
	// its record) and on one command, once the caller is authenticated:
	// in cluster mode it routes the call to the node that runs the
	// sandbox and returns true, or returns false for this server to
	// answer (a sandbox no node runs yet, or one the store lacks).
	Forward func(w http.ResponseWriter, r *http.Request, kind, id string) (bool, error)
	// Commands serves the command routes (sessions, attach, stdin,
	// signals, exec). Default Service.Commands().
	Commands *sessions.Commands
	// Store keeps idempotent answers.
	Store *store.Store
	// Log receives one line per failed request.
	Log *slog.Logger
	// Registry serves /metrics and receives the HTTP metrics.
	Registry *prometheus.Registry
	// MetricsOpen serves /metrics without a key (when bound to loopback).
	MetricsOpen bool
	// PingInterval is how often an idle event stream gets a ": ping"
	// comment. Default 15 s.
	PingInterval time.Duration
	// Version is the server's version, as /v1/mcp's initialize reports
	// it.
	Version string
	// Secrets seals the remembered answers of idempotent requests that
	// hold a secret (a new key, a secret's value) and keys their
	// fingerprints; nil keeps them as they are.
	Secrets *secrets.Box
}

// Server is the HTTP API.
type Server struct {
	cfg  Config
	svc  *service.Service
	cmds *sessions.Commands
	bld  *builds.Service
	log  *slog.Logger
	mux  *http.ServeMux
	mcp  http.Handler
	done chan struct{} // closed by Shutdown: event streams end

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	once sync.Once
}

// Route is one served method and path, in the OpenAPI {param} form.
type Route struct {
	Method, Path string
}

type auth int

const (
	authNone    auth = iota
	authKey          // an API key
	authAttach       // an API key or the command's attach token
	authMetrics      // an admin key unless metrics are open
)

// proxiedMethods are the methods a route without one (the ports proxy)
// is documented with; it serves any.
var proxiedMethods = []string{"GET", "POST", "PUT", "DELETE"}

// anyParams are the params of a route that passes its query on, as
// the ports proxy does.
var anyParams = []string{"*"}

type route struct {
	method, path string
	auth         auth
	// params are the query parameters the route takes (a name ending in
	// "." takes any parameter with that prefix); others are refused.
	params []string
	handle func(w http.ResponseWriter, r *http.Request, p service.Principal) error
}

func (s *Server) routes() []route {
	page := []string{"limit", "page_token"}
	path := []string{"path"}
	return []route{
		{"GET", "/healthz", authNone, nil, s.health},
		{"GET", "/metrics", authMetrics, nil, s.metrics},

		{"POST", "/v1/keys", authKey, nil, jsonCall(http.StatusCreated, s.createKey)},
		{"GET", "/v1/keys", authKey, page, s.listKeys},
		{"GET", "/v1/keys/{id}", authKey, nil, s.getKey},
		{"PATCH", "/v1/keys/{id}", authKey, nil, jsonCall(http.StatusOK, s.svc.SetKeyLimits)},
		{"DELETE", "/v1/keys/{id}", authKey, nil, s.deleteKey},

		{"GET", "/v1/operations/{id}", authKey, []string{"wait_s"}, s.getOperation},
		{"GET", "/v1/events", authKey, []string{"after_seq", "limit", "wait_s", "type"}, s.listEvents},
		{"POST", "/v1/webhooks", authKey, nil, jsonCall(http.StatusCreated, s.createWebhook)},
		{"GET", "/v1/webhooks", authKey, nil, s.listWebhooks},
		{"DELETE", "/v1/webhooks/{id}", authKey, nil, s.deleteWebhook},
		{"GET", "/v1/webhooks/{id}/deliveries", authKey, nil, s.webhookDeliveries},

		{"POST", "/v1/sandboxes", authKey, nil, jsonCall(http.StatusAccepted, s.createSandbox)},
		{"GET", "/v1/sandboxes", authKey, append([]string{"state", "metadata."}, page...), s.listSandboxes},
		{"GET", "/v1/sandboxes/{id}", authKey, nil, s.getSandbox},
		{"DELETE", "/v1/sandboxes/{id}", authKey, nil, s.deleteSandbox},
		{"GET", "/v1/sandboxes/{id}/events", authKey, nil, s.sandboxEvents},
		{"POST", "/v1/sandboxes/{id}/keep", authKey, nil, jsonCall(http.StatusOK, s.keep)},
		{"POST", "/v1/sandboxes/{id}/pause", authKey, nil, s.lifecycle(s.svc.Pause)},
		{"POST", "/v1/sandboxes/{id}/suspend", authKey, nil, s.lifecycle(s.svc.Suspend)},
		{"POST", "/v1/sandboxes/{id}/wake", authKey, nil, s.lifecycle(s.svc.Wake)},
		{"POST", "/v1/sandboxes/{id}/checkpoints", authKey, nil, optionalJSON(http.StatusAccepted, s.createCheckpoint)},
		{"POST", "/v1/sandboxes/{id}/fork", authKey, nil, jsonCall(http.StatusAccepted, s.fork)},
		{"POST", "/v1/sandboxes/{id}/rollback", authKey, nil, jsonCall(http.StatusAccepted, s.rollback)},
		{"GET", "/v1/checkpoints", authKey, append([]string{"sandbox_id"}, page...), s.listCheckpoints},
		{"GET", "/v1/checkpoints/{id}", authKey, nil, s.getCheckpoint},
		{"DELETE", "/v1/checkpoints/{id}", authKey, nil, s.deleteCheckpoint},

		{"POST", "/v1/sandboxes/{id}/commands", authKey, nil, jsonCall(http.StatusCreated, s.cmds.CreateCommand)},
		{"GET", "/v1/sandboxes/{id}/commands", authKey, page, s.listCommands},
		{"POST", "/v1/sandboxes/{id}/exec", authKey, nil, jsonCall(http.StatusOK, s.cmds.Exec)},
		{"GET", "/v1/commands/{id}", authKey, nil, s.getCommand},
		{"GET", "/v1/commands/{id}/attach", authAttach, nil, s.attach},
		{"POST", "/v1/commands/{id}/stdin", authKey, []string{"eof"}, s.stdin},
		{"POST", "/v1/commands/{id}/signal", authKey, nil, jsonAction(s.signal)},
		{"POST", "/v1/commands/{id}/resize", authKey, nil, jsonAction(s.resize)},

		{"PUT", "/v1/sandboxes/{id}/files", authKey, []string{"path", "mode"}, s.writeFile},
		{"GET", "/v1/sandboxes/{id}/files", authKey, path, s.readFile},
		{"DELETE", "/v1/sandboxes/{id}/files", authKey, []string{"path", "recursive"}, s.removeFile},
		{"GET", "/v1/sandboxes/{id}/fs/stat", authKey, path, s.stat},
		{"GET", "/v1/sandboxes/{id}/fs/list", authKey, []string{"path", "depth"}, s.list},
		{"POST", "/v1/sandboxes/{id}/fs/mkdir", authKey, nil, jsonAction(s.mkdir)},
		{"POST", "/v1/sandboxes/{id}/fs/move", authKey, nil, jsonAction(s.move)},
		{"GET", "/v1/sandboxes/{id}/archive", authKey, path, s.archiveOut},
		{"PUT", "/v1/sandboxes/{id}/archive", authKey, path, s.archiveIn},

		{"PUT", "/v1/sandboxes/{id}/network", authKey, nil, jsonCall(http.StatusOK, s.setNetwork)},
		{"GET", "/v1/sandboxes/{id}/egress-log", authKey, []string{"limit"}, s.egressLog},
		{"GET", "/v1/sandboxes/{id}/metrics", authKey, nil, s.sandboxMetrics},
		{"", "/v1/sandboxes/{id}/ports/{port}/{path...}", authKey, anyParams, s.ports},
		{"GET", "/v1/sandboxes/{id}/tunnel/{port}", authKey, nil, s.tunnel},

		{"POST", "/v1/secrets", authKey, nil, s.putSecret},
		{"GET", "/v1/secrets", authKey, page, s.listSecrets},
		{"DELETE", "/v1/secrets/{name}", authKey, nil, s.deleteSecret},

		{"POST", "/v1/mcp", authKey, nil, s.serveMCP},
		{"GET", "/v1/mcp", authKey, nil, s.serveMCP},
		{"DELETE", "/v1/mcp", authKey, nil, s.serveMCP},

		{"GET", "/v1/templates", authKey, page, s.listTemplates},
		{"POST", "/v1/templates", authKey, nil, jsonCall(http.StatusAccepted, s.createTemplate)},
		{"GET", "/v1/templates/{ref}", authKey, nil, s.getTemplate},
		{"DELETE", "/v1/templates/{ref}", authKey, nil, s.deleteTemplate},
		{"GET", "/v1/templates/{ref}/build-log", authKey, nil, s.buildLog},
		{"PUT", "/v1/build-contexts", authKey, nil, s.putBuildContext},
		{"POST", "/v1/sandboxes/{id}/template", authKey, nil, jsonCall(http.StatusAccepted, s.saveSandbox)},
	}
}

// Routes lists what the server serves.
func Routes() []Route {
	var s Server
	var out []Route
	for _, rt := range s.routes() {
		p := strings.ReplaceAll(rt.path, "...}", "}")
		if rt.method != "" {
			out = append(out, Route{Method: rt.method, Path: p})
			continue
		}
		for _, m := range proxiedMethods {
			out = append(out, Route{Method: m, Path: p})
		}
	}
	return out
}

// New returns the API server.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 15 * time.Second
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Commands == nil {
		cfg.Commands = cfg.Service.Commands()
	}
	if cfg.Events == nil {
		cfg.Events = events.New(events.Config{Store: cfg.Store, Log: cfg.Log})
	}
	if cfg.Checkpoints == nil {
		cfg.Checkpoints = checkpoint.New(checkpoint.Config{Store: cfg.Store, Sandboxes: cfg.Service, Log: cfg.Log})
	}
	if cfg.Webhooks == nil {
		cfg.Webhooks = webhooks.New(webhooks.Config{Store: cfg.Store, Secrets: cfg.Secrets, Log: cfg.Log})
	}
	s := &Server{cfg: cfg, svc: cfg.Service, cmds: cfg.Commands, bld: cfg.Builds, log: cfg.Log, mux: http.NewServeMux(), done: make(chan struct{})}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_http_requests_total", Help: "HTTP requests by route and status.",
	}, []string{"method", "route", "status"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "airlock_http_request_duration_seconds", Help: "HTTP request durations by route (event streams excluded).",
		Buckets: prometheus.DefBuckets,
	}, []string{"method", "route"})
	cfg.Registry.MustRegister(s.requests, s.latency)
	s.mcp = mcp.Handler(s, cfg.Version, cfg.Log)
	for _, rt := range s.routes() {
		pattern := rt.path
		if rt.method != "" {
			pattern = rt.method + " " + pattern
		}
		s.mux.Handle(pattern, s.wrap(rt))
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.requests.WithLabelValues(r.Method, "unmatched", "404").Inc()
		writeError(w, fmt.Errorf("no route %s %s: see docs/api.md: %w", r.Method, truncate(r.URL.Path, 100), errdefs.ErrNotFound))
	})
	return s
}

// ServeHTTP serves the API. A path that is not clean (with "..", "." or
// "//" in it) names nothing: it answers 404 rather than the mux's
// redirect to its cleaned form.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.Path; p == "" || p[0] != '/' || path.Clean(p) != p && path.Clean(p)+"/" != p {
		s.requests.WithLabelValues(r.Method, "unmatched", "404").Inc()
		writeError(w, fmt.Errorf("no route %s %s: see docs/api.md: %w", r.Method, truncate(r.URL.Path, 100), errdefs.ErrNotFound))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Shutdown ends the server's event streams; the http.Server's own
// Shutdown waits for them to return.
func (s *Server) Shutdown() { s.once.Do(func() { close(s.done) }) }

// statusWriter records the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		err := s.serve(sw, r, rt)
		if err != nil {
			if sw.wrote {
				// Headers are out: the only way left to say it failed is
				// to break the connection.
				s.log.Warn("request failed mid-response", "method", r.Method, "path", r.URL.Path, "err", err)
				panic(http.ErrAbortHandler)
			}
			writeError(sw, err)
			if errdefs.ClassOf(err).Err == nil {
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
		}
		s.requests.WithLabelValues(r.Method, rt.path, strconv.Itoa(sw.status)).Inc()
		if !strings.HasSuffix(rt.path, "/attach") && !strings.HasSuffix(rt.path, "/events") {
			s.latency.WithLabelValues(r.Method, rt.path).Observe(time.Since(start).Seconds())
		}
	})
}

func (s *Server) serve(w *statusWriter, r *http.Request, rt route) error {
	var p service.Principal
	switch rt.auth {
	case authKey, authAttach, authMetrics:
		if rt.auth == authMetrics && s.cfg.MetricsOpen {
			break
		}
		token, err := bearer(r)
		if err != nil {
			return err
		}
		if rt.auth == authAttach && strings.HasPrefix(token, "act_") {
			// The token is checked where the command runs.
			if s.cfg.Forward != nil {
				if done, err := s.cfg.Forward(w, r, ForwardCommand, r.PathValue("id")); done || err != nil {
					return err
				}
			}
			return s.attachWithToken(w, r, token)
		}
		p, err = s.svc.Authenticate(r.Context(), token)
		if err != nil {
			return err
		}
		if rt.auth == authMetrics && !p.Admin() {
			return fmt.Errorf("metrics need an admin key: %w", errdefs.ErrPermission)
		}
	}
	if kind, param := forwardKind(rt); kind != "" && s.cfg.Forward != nil {
		if done, err := s.cfg.Forward(w, r, kind, r.PathValue(param)); done || err != nil {
			return err
		}
	}
	proxied := len(rt.params) == 1 && rt.params[0] == anyParams[0]
	if rt.path != "/metrics" && !proxied {
		if _, err := query(r, rt.params...); err != nil {
			return err
		}
	}
	if key := r.Header.Get("Idempotency-Key"); key != "" && r.Method != http.MethodGet && !proxied {
		return s.idempotent(w, r, rt, p, key)
	}
	return rt.handle(w, r, p)
}

// What Forward is offered, and the id it is given: a sandbox's ID, a
// command's, none for a build to start or a build context to upload, a
// template ref for a build log.
const (
	ForwardSandbox      = "sandbox"
	ForwardCommand      = "command"
	ForwardBuild        = "build"
	ForwardBuildLog     = "build-log"
	ForwardBuildContext = "build-context"
)

// forwardKind says what of a route's call Forward is offered, and the
// path parameter that names it: the calls on one sandbox but reading its
// record, those on one command, a template build, a build context's
// upload and a build's log.
func forwardKind(rt route) (kind, param string) {
	switch {
	case rt.method == http.MethodGet && rt.path == "/v1/sandboxes/{id}":
		return "", ""
	case strings.HasPrefix(rt.path, "/v1/sandboxes/{id}"):
		return ForwardSandbox, "id"
	case strings.HasPrefix(rt.path, "/v1/commands/{id}"):
		return ForwardCommand, "id"
	case rt.method == http.MethodPost && rt.path == "/v1/templates":
		return ForwardBuild, ""
	case rt.method == http.MethodPut && rt.path == "/v1/build-contexts":
		return ForwardBuildContext, ""
	case rt.path == "/v1/templates/{ref}/build-log":
		return ForwardBuildLog, "ref"
	}
	return "", ""
}

func bearer(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("missing API key: send \"Authorization: Bearer <key>\" (the admin key is in $AIRLOCK_HOME/admin.key): %w", errdefs.ErrUnauthenticated)
	}
	return strings.TrimSpace(token), nil
}

// writeError answers err in the contract's shape: the status and code of
// its class (errdefs.ClassOf), and its message without the class.
func writeError(w http.ResponseWriter, err error) {
	class := errdefs.ClassOf(err)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		class = errdefs.ClassOf(errdefs.ErrTooLarge)
	}
	if errors.Is(err, context.Canceled) {
		class = errdefs.ClassOf(errdefs.ErrUnavailable)
	}
	body := apiv1.ErrorBody{Error: apiv1.Error{Code: class.Code, Message: errdefs.Message(err)}}
	var d interface{ Details() map[string]any }
	if errors.As(err, &d) {
		body.Error.Details = d.Details()
	}
	if class.Code == apiv1.CodeResourceExhausted {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, class.HTTPStatus, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// decode reads a JSON body into v: unknown fields, wrong types, trailing
// data and bodies over MaxJSONBody are refused.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, MaxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &mbe):
			return fmt.Errorf("the body is over %d bytes: %w", MaxJSONBody, errdefs.ErrTooLarge)
		case errors.Is(err, io.EOF):
			return fmt.Errorf("the body is empty: send a JSON object: %w", errdefs.ErrInvalid)
		case errors.As(err, &te) && te.Field == "":
			return fmt.Errorf("the body must be a JSON object, not %s: %w", te.Value, errdefs.ErrInvalid)
		case errors.As(err, &te):
			return fmt.Errorf("field %q must be %s, not %s: %w", te.Field, te.Type, te.Value, errdefs.ErrInvalid)
		case errors.As(err, &se):
			return fmt.Errorf("the body is not valid JSON (at byte %d): %w", se.Offset, errdefs.ErrInvalid)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return fmt.Errorf("%s: remove it (see docs/api.md): %w", strings.TrimPrefix(err.Error(), "json: "), errdefs.ErrInvalid)
		default:
			return fmt.Errorf("the body is not a valid request: %v: %w", err, errdefs.ErrInvalid)
		}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("the body is over %d bytes: %w", MaxJSONBody, errdefs.ErrTooLarge)
		}
		return fmt.Errorf("the body has data after its JSON object: %w", errdefs.ErrInvalid)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
