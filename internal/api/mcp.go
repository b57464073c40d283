package api

import (
	"net/http"

	"github.com/airlockhq/airlock/internal/service"
)

// serveMCP is /v1/mcp: airlock's tools over MCP's streamable HTTP
// transport (docs/mcp.md), stateless, so that GET and DELETE answer 405.
// Each tool call goes through this server in process with the request's
// key, whose tenancy and limits it has. The body is bounded by
// mcp.MaxRequestBytes (413 past it).
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request, _ service.Principal) error {
	s.mcp.ServeHTTP(w, r)
	return nil
}
