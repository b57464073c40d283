package cluster

import (
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// NodeGate lets through to a node's internal API, served over the
// cluster TLS, the callers whose certificate's role may ask for what they
// ask: an API replica's anything, another node's only the template
// images (TemplatesPath). Any other is errdefs.ErrPermission.
func NodeGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		role := clustertls.PeerRole(r)
		templates := strings.HasPrefix(path.Clean(r.URL.Path)+"/", TemplatesPath)
		if role == clustertls.RoleServer || role == clustertls.RoleNode && templates {
			next.ServeHTTP(w, r)
			return
		}
		api.WriteError(w, fmt.Errorf("a caller with the certificate of %q may not ask a node for %s: a node's internal API answers the cluster's servers, and other nodes for template images only: %w",
			role, r.URL.Path, errdefs.ErrPermission))
	})
}

// ServerGate lets through to an API replica's internal listener the
// callers with a node's or a replica's certificate.
func ServerGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if role := clustertls.PeerRole(r); role != clustertls.RoleNode && role != clustertls.RoleServer {
			api.WriteError(w, fmt.Errorf("a server's internal listener answers the cluster's nodes: %w", errdefs.ErrPermission))
			return
		}
		next.ServeHTTP(w, r)
	})
}
