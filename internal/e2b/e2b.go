// Package e2b serves E2B's API over airlock's service, so that code written
// for E2B's SDKs runs against airlock unmodified (docs/e2b.md). It
// translates and does not reimplement: every control-plane route calls the
// service as the native API does, so tenancy, limits and state rules are
// the same on both paths.
//
// One listener carries both of E2B's faces. A request for a sandbox (an
// E2b-Sandbox-Id header, or a Host of "<port>-<sandboxID>.<domain>", as
// E2B's edge proxy routes them) goes to the sandbox: port 49983 to the envd
// handler, any other port through the sandbox's gateway to the guest. The
// rest is the control plane (POST /sandboxes and the like), authenticated
// by X-API-Key.
package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/checkpoint"
	"github.com/airlockhq/airlock/internal/e2b/envd"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/usage"
)

// DefaultEnvdVersion is the envd version reported to SDKs unless
// Config.EnvdVersion says otherwise: the one package envd is faithful to.
// The SDKs gate features on it (file metadata from 0.6.2, for one), so
// it must not claim more than the envd handler serves.
const DefaultEnvdVersion = envd.EnvdVersion

// EnvdPort is the guest port SDKs address envd on.
const EnvdPort = 49983

// Envd serves a sandbox's envd routes (process and filesystem RPCs,
// /files, /health, /envs). *envd.Server is the implementation; tests may
// put a fake in its place.
type Envd interface {
	Serve(w http.ResponseWriter, r *http.Request, req envd.Request)
}

// Config configures a Server.
type Config struct {
	// Service does the work. Required.
	Service *service.Service
	// Checkpoints keeps checkpoints, which are E2B's snapshots and what
	// forks are made from. Required.
	Checkpoints *checkpoint.Service
	// Log receives one line per request that failed inside airlock.
	Log *slog.Logger
	// Domain is the sandbox domain returned to SDKs ("domain" of a
	// Sandbox); empty returns null, and the SDK uses its own E2B_DOMAIN.
	Domain string
	// Envd serves sandbox traffic to port 49983. Required.
	Envd Envd
	// EnvdVersion is the envd version reported. Default DefaultEnvdVersion.
	EnvdVersion string
	// WaitTimeout bounds how long a create, connect, pause or kill waits
	// for its operation before answering 504. Default 5 minutes.
	WaitTimeout time.Duration
	// Usage is the history of what the sandboxes here used, which
	// getMetrics answers from; nil answers every sandbox's metrics with an
	// empty list. (In a cluster each node keeps its own sandboxes', and
	// the replicas forward the metrics route there.)
	Usage *usage.History
	// Forward, if set, is offered every request for one sandbox: its
	// traffic (envd and guest ports) and the control-plane routes that
	// name it, after the API key is checked. It answers true when it
	// served the request (a cluster's replica sends it to the sandbox's
	// node: cluster.Router.ForwardE2B); false leaves it to this server.
	Forward func(w http.ResponseWriter, r *http.Request, sandboxID string) (bool, error)
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Service == nil || c.Checkpoints == nil || c.Envd == nil {
		return errors.New("the E2B API needs a service, checkpoints and an envd handler")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.EnvdVersion == "" {
		c.EnvdVersion = DefaultEnvdVersion
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = 5 * time.Minute
	}
	if c.WaitTimeout < 0 {
		return fmt.Errorf("wait timeout %v is negative: %w", c.WaitTimeout, errdefs.ErrInvalid)
	}
	return CheckDomain(c.Domain)
}

// CheckDomain checks a sandbox domain given to SDKs (Config.Domain).
func CheckDomain(d string) error {
	if strings.ContainsAny(d, "/:@ ") {
		return fmt.Errorf("E2B domain %q is not a domain name: %w", d, errdefs.ErrInvalid)
	}
	return nil
}

// Server is the E2B-compatible API: control plane and sandbox traffic.
type Server struct {
	cfg Config
	svc *service.Service
	cps *checkpoint.Service
	log *slog.Logger
	mux *http.ServeMux
}

// New returns the server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, svc: cfg.Service, cps: cfg.Checkpoints, log: cfg.Log, mux: http.NewServeMux()}
	s.register()
	return s, nil
}

// ServeHTTP routes a request: to a sandbox when it names one, else to the
// control plane.
//
// A path that starts with several slashes is read as if it had one: SDKs
// join a base URL ending in "/" (E2B_SANDBOX_URL=http://host/) with paths
// that start with one.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "//") {
		r.URL.Path = "/" + strings.TrimLeft(r.URL.Path, "/")
		if r.URL.RawPath != "" {
			r.URL.RawPath = "/" + strings.TrimLeft(r.URL.RawPath, "/")
		}
	}
	t, ok, err := sandboxTarget(r)
	switch {
	case err != nil:
		writeError(w, err)
	case ok:
		if s.cfg.Forward != nil {
			if done, err := s.cfg.Forward(w, r, t.id); err != nil {
				writeError(w, err)
				return
			} else if done {
				return
			}
		}
		s.serveSandbox(w, r, t)
	default:
		if p := r.URL.Path; p == "" || p[0] != '/' || path.Clean(p) != p {
			writeError(w, fmt.Errorf("no route %s %s: see docs/e2b.md: %w", r.Method, truncate(r.URL.Path, 100), errdefs.ErrNotFound))
			return
		}
		s.mux.ServeHTTP(w, r)
	}
}

// errNotImplemented marks a route or option of E2B that airlock does not
// serve: 501.
var errNotImplemented = errors.New("not implemented")

// errTimeout marks a wait that ran out: 504.
var errTimeout = errors.New("timed out")

// Error is E2B's error body, {"code": <HTTP status>, "message": "…"}. The
// SDKs branch on code (404: not found, 409: already paused), not on the
// status.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// status is the HTTP status of err: E2B's own classes and what the
// transport says first, then errdefs' table.
func status(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errNotImplemented):
		return http.StatusNotImplemented
	case errors.Is(err, errTimeout), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable
	}
	return errdefs.ClassOf(err).HTTPStatus
}

// writeError answers err in E2B's shape. A 429 carries Retry-After, which
// the JS SDK honours with a retry.
func writeError(w http.ResponseWriter, err error) {
	code := status(err)
	if code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, code, Error{Code: code, Message: message(err)})
}

// message is err's text without the trailing error class, E2B's own
// classes among them.
func message(err error) string {
	return errdefs.Message(err, errNotImplemented, errTimeout)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"code":500,"message":"encode response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// maxJSONBody bounds a JSON request body.
const maxJSONBody = 1 << 20

// decode reads a JSON body into v. Unknown fields, wrong types, trailing
// data and bodies over maxJSONBody are refused, naming what was wrong. An
// empty body (chunked or not) leaves v as it is when optional, and is
// refused otherwise.
func decode(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	body := http.MaxBytesReader(w, r.Body, maxJSONBody)
	b, err := io.ReadAll(body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("the body is over %d bytes: %w", maxJSONBody, errdefs.ErrTooLarge)
		}
		return fmt.Errorf("read the body: %v: %w", err, errdefs.ErrInvalid)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		if optional {
			return nil
		}
		return fmt.Errorf("the body is empty: send a JSON object: %w", errdefs.ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te) && te.Field == "":
			return fmt.Errorf("the body must be a JSON object, not %s: %w", te.Value, errdefs.ErrInvalid)
		case errors.As(err, &te):
			return fmt.Errorf("field %q must be %s, not %s: %w", te.Field, kind(te.Type.String()), te.Value, errdefs.ErrInvalid)
		case errors.As(err, &se):
			return fmt.Errorf("the body is not valid JSON (at byte %d): %w", se.Offset, errdefs.ErrInvalid)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return fmt.Errorf("%s: airlock's E2B API does not know it (see docs/e2b.md): %w", strings.TrimPrefix(err.Error(), "json: "), errdefs.ErrInvalid)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return fmt.Errorf("the body's JSON ends early: %w", errdefs.ErrInvalid)
		default:
			return fmt.Errorf("the body is not a valid request: %v: %w", err, errdefs.ErrInvalid)
		}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the body has data after its JSON object: %w", errdefs.ErrInvalid)
	}
	return nil
}

// kind names the JSON value a Go type takes.
func kind(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "*int"):
		return "an integer"
	case t == "bool", t == "*bool":
		return "true or false"
	case t == "string", t == "*string":
		return "a string"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "an object"
	}
	return "an object"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
