// Package tenancy says who made a request and what it may see. A
// Principal is the API key a request authenticated with: an admin key
// sees and touches everything, any other key only what it owns. The
// service and the command sessions both check ownership with it, so that
// a key sees only its own sandboxes and their commands on every path.
package tenancy

import "github.com/airlockhq/airlock/internal/apiv1"

// Principal is the caller of a request: the API key it authenticated with.
type Principal struct {
	KeyID string
	Role  string
}

// Admin reports whether p may see and touch everything.
func (p Principal) Admin() bool { return p.Role == apiv1.RoleAdmin }

// Owns reports whether p may see a resource owned by the key owner.
func (p Principal) Owns(owner string) bool { return p.Admin() || p.KeyID == owner }
