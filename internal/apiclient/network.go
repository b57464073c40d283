package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
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
