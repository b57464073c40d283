package api

import (
	"crypto/subtle"
	"fmt"
	"net/http"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// NodeTokenHeader carries the cluster's internal token on requests to a
// node agent's internal API, beside the caller's own API key.
const NodeTokenHeader = "Airlock-Node-Token"

// MinNodeTokenLen is the shortest internal token a node accepts.
const MinNodeTokenLen = 32

// RequireNodeToken serves h only to requests that carry token in
// NodeTokenHeader: a node's internal API answers the cluster's servers,
// never a client that reached its port. Everything else is answered 401
// before h sees it.
func RequireNodeToken(token string, h http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(NodeTokenHeader)
		if got == "" {
			writeError(w, fmt.Errorf("this is an airlock node's internal API: send the cluster's internal token in %s (clients use the cluster's API): %w", NodeTokenHeader, errdefs.ErrUnauthenticated))
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			writeError(w, fmt.Errorf("the internal token in %s is not this node's: check that every server and node is given the same token: %w", NodeTokenHeader, errdefs.ErrUnauthenticated))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// WriteError answers err in the contract's shape, with the status its
// class maps to, for a handler outside this package (the cluster's
// router).
func WriteError(w http.ResponseWriter, err error) { writeError(w, err) }
