// Package errdefs holds the few classes of error that airlock's components
// return, and how each edge shows them. Callers test a class with
// errors.Is; the edges (the CLI, the HTTP API, the E2B APIs) look the
// error up with ClassOf for their status, code or exit status, and show
// Message to the person.
//
// A class is carried by wrapping its sentinel last, as in
// fmt.Errorf("...: %v: %w", err, errdefs.ErrInvalid), so that the error's
// text ends with the class's name (": invalid argument"); Message cuts it
// off again, as the status already says it.
//
// This package stays free of net/http: the guest agent imports it.
package errdefs

import (
	"errors"
	"strings"
)

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

// Class is an error class and what each edge makes of it.
type Class struct {
	// Err is the class's sentinel; nil for an error of no class, a
	// failure inside airlock.
	Err error
	// Code is the native API's error code (apiv1.Code*, docs/api.md),
	// also what a failed operation records.
	Code string
	// HTTPStatus is the status the native API and E2B's REST API answer.
	HTTPStatus int
	// ConnectCode is the code E2B's envd API (the Connect protocol) answers.
	ConnectCode string
	// ExitCode is the CLI's exit status: 2 for an error the user can fix
	// (bad input, setup not run), 1 for the rest.
	ExitCode int
}

// classes is the one table from class to what the edges show. An error
// that carries more than one class takes the first row it matches. The
// HTTP statuses are written as numbers so that the guest agent, which
// imports this package, does not link net/http; the tests check them
// against net/http's names and the codes against apiv1's.
var classes = []Class{
	{ErrInvalid, "invalid_argument", 400, "invalid_argument", 2},
	{ErrNotFound, "not_found", 404, "not_found", 2},
	{ErrConflict, "conflict", 409, "failed_precondition", 2},
	{ErrExhausted, "resource_exhausted", 429, "resource_exhausted", 2},
	{ErrUnauthenticated, "unauthenticated", 401, "unauthenticated", 2},
	{ErrPermission, "permission_denied", 403, "permission_denied", 2},
	{ErrTooLarge, "payload_too_large", 413, "resource_exhausted", 2},
	// A host that is not ready is the operator's to fix (exit 2), but to
	// an API caller it is a server that cannot serve yet.
	{ErrPrecondition, "unavailable", 503, "failed_precondition", 2},
	{ErrUnavailable, "unavailable", 503, "unavailable", 1},
}

// unclassed is the row of an error of no class.
var unclassed = Class{nil, "internal", 500, "internal", 1}

// ClassOf is err's class: the first row of the table that err matches
// with errors.Is, or the internal class (Err nil) when none does.
func ClassOf(err error) Class {
	for _, c := range classes {
		if errors.Is(err, c.Err) {
			return c
		}
	}
	return unclassed
}

// ByCode is the class a client reads in an answer with the native API's
// error code code: the internal class (Err nil) for a code of no class, and
// ErrUnavailable for "unavailable", which ErrPrecondition also answers.
func ByCode(code string) Class {
	return reverseFind(func(c Class) bool { return c.Code == code })
}

// ByHTTPStatus is the class a client reads in an answer of the native API
// with status and no error code (a proxy answered, say), as ByCode.
func ByHTTPStatus(status int) Class {
	return reverseFind(func(c Class) bool { return c.HTTPStatus == status })
}

// reverseFind is the last row of the table that match accepts, or the
// internal class. From the end, so that of two classes that answer the
// same (precondition and unavailable) the one a client can act on, retry,
// is read.
func reverseFind(match func(Class) bool) Class {
	for i := len(classes) - 1; i >= 0; i-- {
		if match(classes[i]) {
			return classes[i]
		}
	}
	return unclassed
}

// IsUserError reports whether err is the caller's to fix (bad input or a host
// not yet set up), as opposed to a failure inside airlock.
func IsUserError(err error) bool {
	return ClassOf(err).ExitCode == 2
}

// trimOrder is the order in which Message cuts class names off the end of
// a text; it differs from the table's only for a text that ends with two.
var trimOrder = []error{ErrInvalid, ErrNotFound, ErrConflict, ErrExhausted, ErrPrecondition,
	ErrUnavailable, ErrUnauthenticated, ErrPermission, ErrTooLarge}

// Message is err's text for a person: without the name of the class that
// ends it (": invalid argument"), as the status or exit code carries the
// class. An edge with classes of its own (such as E2B's "not implemented")
// passes them as extra; they are cut after errdefs' own.
func Message(err error, extra ...error) string {
	msg := err.Error()
	for _, list := range [][]error{trimOrder, extra} {
		for _, class := range list {
			if errors.Is(err, class) {
				msg = strings.TrimSuffix(msg, ": "+class.Error())
			}
		}
	}
	return msg
}
