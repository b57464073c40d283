package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
)

// setNetwork is PUT /v1/sandboxes/{id}/network.
func (s *Server) setNetwork(ctx context.Context, p service.Principal, id string, req json.RawMessage) (apiv1.Sandbox, error) {
	return s.svc.SetNetwork(ctx, p, id, req)
}

// egressLog is GET /v1/sandboxes/{id}/egress-log.
func (s *Server) egressLog(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q, _ := url.ParseQuery(r.URL.RawQuery)
	limit, err := intParam(q, "limit", 0)
	if err != nil {
		return err
	}
	out, err := s.svc.EgressLog(r.Context(), p, r.PathValue("id"), limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// ports is ANY /v1/sandboxes/{id}/ports/{port}/{path...}: HTTP, and
// WebSocket upgrades, proxied to a port a process in the sandbox listens
// on, through the sandbox's gateway. The caller's API key is not passed on.
func (s *Server) ports(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535: %w", truncate(r.PathValue("port"), 20), errdefs.ErrInvalid)
	}
	// Check now, so that a sandbox that cannot be reached answers in the
	// API's own shape rather than as a proxy error.
	conn, err := s.svc.DialPort(r.Context(), p, id, port)
	if err != nil {
		if errdefs.IsUserError(err) || errors.Is(err, errdefs.ErrUnavailable) {
			return err
		}
		badGateway(w, id, port, err)
		return nil
	}
	first := conn
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.URL.Path = "/" + r.PathValue("path")
			pr.Out.URL.RawPath = ""
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Idempotency-Key")
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				if c := first; c != nil {
					first = nil
					return c, nil
				}
				return s.svc.DialPort(ctx, p, id, port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			badGateway(w, id, port, err)
		},
	}
	proxy.ServeHTTP(w, r)
	if first != nil {
		first.Close()
	}
	return nil
}

// badGateway answers 502 for a port of the sandbox that did not answer,
// in the API's error shape.
func badGateway(w http.ResponseWriter, id string, port int, err error) {
	writeJSON(w, http.StatusBadGateway, apiv1.ErrorBody{Error: apiv1.Error{
		Code:    apiv1.CodeUnavailable,
		Message: fmt.Sprintf("nothing answered on port %d of sandbox %s (%v): start a server listening there", port, id, err),
	}})
}

// tunnelProtocol is the Upgrade token of GET /v1/sandboxes/{id}/tunnel/{port}.
const tunnelProtocol = "airlock-tcp"

// tunnel is GET /v1/sandboxes/{id}/tunnel/{port} with "Upgrade:
// airlock-tcp": the connection becomes a TCP stream to port in the
// sandbox (what `airlock port-forward` uses).
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return fmt.Errorf("port %q is not a number from 1 to 65535: %w", truncate(r.PathValue("port"), 20), errdefs.ErrInvalid)
	}
	id := r.PathValue("id")
	guest, err := s.svc.DialPort(r.Context(), p, id, port)
	if err != nil {
		if errdefs.IsUserError(err) || errors.Is(err, errdefs.ErrUnavailable) {
			return err
		}
		badGateway(w, id, port, err)
		return nil
	}
	defer guest.Close()
	// Checked after the sandbox, so that an unknown one is 404 whatever
	// the headers.
	if !strings.EqualFold(r.Header.Get("Upgrade"), tunnelProtocol) {
		return fmt.Errorf("a tunnel needs the headers \"Connection: Upgrade\" and \"Upgrade: %s\": %w", tunnelProtocol, errdefs.ErrInvalid)
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return fmt.Errorf("take over the connection: %w", err)
	}
	defer client.Close()
	w.(*statusWriter).status = http.StatusSwitchingProtocols
	if _, err := io.WriteString(client, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+tunnelProtocol+"\r\n\r\n"); err != nil {
		return nil
	}
	done := make(chan struct{}, 2)
	go func() {
		// Bytes the client sent after its request are in brw's buffer.
		io.Copy(guest, brw.Reader)
		closeWrite(guest)
		done <- struct{}{}
	}()
	go func() {
		io.Copy(client, guest)
		closeWrite(client)
		done <- struct{}{}
	}()
	select {
	case <-done:
		<-done
	case <-s.done:
	}
	return nil
}

// closeWrite half-closes c when it can, so the peer reads end-of-file.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
