package e2b

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/e2b/envd"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
)

// target is the sandbox and guest port a request is for.
type target struct {
	id   string
	port int
}

// sandboxIDPattern is what E2B accepts as a sandbox ID in a Host.
var sandboxIDPattern = regexp.MustCompile(`^[a-z0-9]+$`)

// sandboxTarget reads which sandbox a request is for, as E2B's edge proxy
// does: a Host whose left-most label is "<port>-<sandboxID>" (any domain
// after it), else the E2b-Sandbox-Id header with E2b-Sandbox-Port (default
// 49983). ok false: neither, so the request is for the control plane.
func sandboxTarget(r *http.Request) (t target, ok bool, err error) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, _ := strings.Cut(strings.ToLower(host), ".")
	if ps, id, found := strings.Cut(label, "-"); found && sandboxIDPattern.MatchString(id) {
		if port, err := strconv.Atoi(ps); err == nil && port >= 1 && port <= 65535 && ps[0] != '0' {
			return target{id: id, port: port}, true, nil
		}
	}
	id, ps := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if id == "" && ps == "" {
		return t, false, nil
	}
	if id == "" {
		return t, false, fmt.Errorf("E2b-Sandbox-Port needs E2b-Sandbox-Id, the sandbox the request is for: %w", errdefs.ErrInvalid)
	}
	port := EnvdPort
	if ps != "" {
		if port, err = strconv.Atoi(ps); err != nil || port < 1 || port > 65535 {
			return t, false, fmt.Errorf("E2b-Sandbox-Port %q is not a port number from 1 to 65535: %w", truncate(ps, 20), errdefs.ErrInvalid)
		}
	}
	return target{id: id, port: port}, true, nil
}

// proxyError is the body of E2B's proxy errors: the sandbox, a message
// and the status again.
type proxyError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}

// badGateway answers 502 in the proxy's shape. The SDKs read a 502 as
// "the sandbox is not running".
func badGateway(w http.ResponseWriter, id, msg string) {
	writeJSON(w, http.StatusBadGateway, proxyError{SandboxID: id, Message: msg, Code: http.StatusBadGateway})
}

// serveSandbox serves sandbox traffic. It carries no API key: the
// sandbox's owner is its principal, so every call keeps the owner's
// tenancy. Port 49983 is envd, told whether X-Access-Token is the
// sandbox's token; any other port is proxied to the guest without a token,
// as E2B serves sandbox ports publicly by default.
func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, t target) {
	owner, err := s.svc.SandboxOwner(r.Context(), t.id)
	if errors.Is(err, errdefs.ErrNotFound) {
		badGateway(w, t.id, "The sandbox was not found")
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	// The request uses the sandbox while it lasts; one created with
	// autoResume is woken by it.
	release, err := s.svc.UseSandbox(r.Context(), owner, t.id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			badGateway(w, t.id, "The sandbox was not found")
		} else {
			badGateway(w, t.id, fmt.Sprintf("The sandbox could not be resumed: %v", message(err)))
		}
		return
	}
	defer release()
	sb, err := s.svc.GetSandbox(r.Context(), owner, t.id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			badGateway(w, t.id, "The sandbox was not found")
		} else {
			writeError(w, err)
		}
		return
	}
	switch {
	case e2bState(sb.State) == "":
		badGateway(w, t.id, "The sandbox was not found")
		return
	case sb.State != apiv1.StateRunning:
		badGateway(w, t.id, fmt.Sprintf("The sandbox is %s, not running: connect to it (Sandbox.connect) to resume it", sb.State))
		return
	}
	if t.port == EnvdPort {
		s.cfg.Envd.Serve(w, r, envd.Request{
			Principal:  owner,
			SandboxID:  t.id,
			Authorized: s.svc.CheckSandboxAccessToken(t.id, r.Header.Get("X-Access-Token")),
		})
		return
	}
	s.proxyPort(w, r, owner, t)
}

// proxyPort proxies HTTP, and WebSocket upgrades, to a port in the
// sandbox, through its gateway, as the native ports proxy does. The path
// and query pass as they are; the envd access token does not.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, owner service.Principal, t target) {
	// Dial now, so that a closed port answers in E2B's shape.
	conn, err := s.svc.DialPort(r.Context(), owner, t.id, t.port)
	if err != nil {
		badGateway(w, t.id, fmt.Sprintf("The sandbox is running but nothing listens on port %d (%v)", t.port, message(err)))
		return
	}
	first := conn
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del("X-Access-Token")
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				if c := first; c != nil {
					first = nil
					return c, nil
				}
				return s.svc.DialPort(ctx, owner, t.id, t.port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			badGateway(w, t.id, fmt.Sprintf("port %d of the sandbox did not answer: %v", t.port, err))
		},
	}
	proxy.ServeHTTP(w, r)
	if first != nil {
		first.Close()
	}
}
