package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// SetNetwork replaces a sandbox's egress policy (a NetworkPolicy as JSON).
func (c *Client) SetNetwork(ctx context.Context, id string, policy json.RawMessage, opts ...CallOption) (apiv1.Sandbox, error) {
	var out apiv1.Sandbox
	err := c.call(ctx, http.MethodPut, p("v1", "sandboxes", id, "network"), nil, policy, &out, opts)
	return out, err
}

// EgressLog lists the newest entries of a sandbox's egress log, at most
// limit of them (0: the server's default).
func (c *Client) EgressLog(ctx context.Context, id string, limit int) (apiv1.List[apiv1.EgressEvent], error) {
	var out apiv1.List[apiv1.EgressEvent]
	var q url.Values
	if limit > 0 {
		q = url.Values{"limit": {strconv.Itoa(limit)}}
	}
	err := c.call(ctx, http.MethodGet, p("v1", "sandboxes", id, "egress-log"), q, nil, &out, nil)
	return out, err
}

// TunnelProtocol is the Upgrade token of a tunnel to a sandbox's port.
const TunnelProtocol = "airlock-tcp"

// Tunnel opens a TCP stream to port in a running sandbox through the
// server (GET /v1/sandboxes/{id}/tunnel/{port}, upgraded): what one end
// writes the other reads.
func (c *Client) Tunnel(ctx context.Context, id string, port int) (net.Conn, error) {
	resp, err := c.do(ctx, request{
		method: http.MethodGet, path: p("v1", "sandboxes", id, "tunnel", strconv.Itoa(port)),
		opts: []CallOption{upgrade(TunnelProtocol)},
	})
	if err != nil {
		return nil, err
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("tunnel to sandbox %s port %d: the server answered %s, not an upgrade", id, port, resp.Status)
	}
	return &tunnelConn{ReadWriteCloser: rw}, nil
}

// upgrade asks for a protocol upgrade to proto.
func upgrade(proto string) CallOption {
	return func(o *callOptions) { o.upgrade = proto }
}

// tunnelConn is an upgraded HTTP connection as a net.Conn.
type tunnelConn struct {
	io.ReadWriteCloser
}

func (t *tunnelConn) LocalAddr() net.Addr              { return tunnelAddr{} }
func (t *tunnelConn) RemoteAddr() net.Addr             { return tunnelAddr{} }
func (t *tunnelConn) SetDeadline(time.Time) error      { return nil }
func (t *tunnelConn) SetReadDeadline(time.Time) error  { return nil }
func (t *tunnelConn) SetWriteDeadline(time.Time) error { return nil }
func (tunnelAddr) Network() string                     { return "airlock-tunnel" }
func (tunnelAddr) String() string                      { return "airlock-tunnel" }

type tunnelAddr struct{}

// Port sends an HTTP request to port in a running sandbox through the
// server's ports proxy (/v1/sandboxes/{id}/ports/{port}/{path}) and
// returns the answer of what listens there, whatever its status; the
// caller closes its body. The server's own refusals, in the API's error
// shape (no such sandbox, nothing listening there: 502), are an *Error
// instead.
func (c *Client) Port(ctx context.Context, id string, port int, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	resp, err := c.do(ctx, request{
		method: method, path: p("v1", "sandboxes", id, "ports", strconv.Itoa(port)) + "/" + strings.TrimLeft(path, "/"),
		body: body, ctype: contentType, raw: true,
	})
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("sandbox %s port %d: read the answer: %w", id, port, err)
	}
	var eb apiv1.ErrorBody
	if json.Unmarshal(head, &eb) == nil && eb.Error.Code != "" {
		resp.Body.Close()
		return nil, &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message, Details: eb.Error.Details}
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	return resp, nil
}
