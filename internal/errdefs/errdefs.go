// Package errdefs holds the few classes of error that airlock's components
// return. Callers test them with errors.Is; only the edges (the CLI, the HTTP
// API) turn them into exit codes, status codes and user-facing messages.
package errdefs

import "errors"

var (
	// ErrInvalid marks a request that is wrong in itself: bad values, bad paths.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound marks a reference to something that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict marks a request the current state does not allow.
	ErrConflict = errors.New("conflict")
	// ErrExhausted marks a request refused because a limit or quota is reached.
	ErrExhausted = errors.New("resource exhausted")
	// ErrPrecondition marks a host that is not ready: setup not run, a tool or
	// a privilege missing. The message says what to do.
	ErrPrecondition = errors.New("failed precondition")
	// ErrUnavailable marks a failure that may go away on retry.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnauthenticated marks a request without valid credentials.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermission marks a caller whose credentials do not allow the request.
	ErrPermission = errors.New("permission denied")
	// ErrTooLarge marks a request whose body is over its size limit.
	ErrTooLarge = errors.New("payload too large")
)

// IsUserError reports whether err is the caller's to fix (bad input or a host
// not yet set up), as opposed to a failure inside airlock.
func IsUserError(err error) bool {
	return errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) ||
		errors.Is(err, ErrPrecondition) || errors.Is(err, ErrExhausted) ||
		errors.Is(err, ErrConflict) || errors.Is(err, ErrUnauthenticated) ||
		errors.Is(err, ErrPermission) || errors.Is(err, ErrTooLarge)
}
