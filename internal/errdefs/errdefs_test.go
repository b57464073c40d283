package errdefs_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestClassOf pins the one table: for each class, what the native API,
// E2B's REST and envd APIs and the CLI make of an error wrapping it.
func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		class   error
		code    string
		status  int
		connect string
		exit    int
		user    bool
	}{
		{"invalid", errdefs.ErrInvalid, apiv1.CodeInvalidArgument, http.StatusBadRequest, "invalid_argument", 2, true},
		{"not found", errdefs.ErrNotFound, apiv1.CodeNotFound, http.StatusNotFound, "not_found", 2, true},
		{"conflict", errdefs.ErrConflict, apiv1.CodeConflict, http.StatusConflict, "failed_precondition", 2, true},
		{"exhausted", errdefs.ErrExhausted, apiv1.CodeResourceExhausted, http.StatusTooManyRequests, "resource_exhausted", 2, true},
		{"precondition", errdefs.ErrPrecondition, apiv1.CodeUnavailable, http.StatusServiceUnavailable, "failed_precondition", 2, true},
		{"unavailable", errdefs.ErrUnavailable, apiv1.CodeUnavailable, http.StatusServiceUnavailable, "unavailable", 1, false},
		{"unauthenticated", errdefs.ErrUnauthenticated, apiv1.CodeUnauthenticated, http.StatusUnauthorized, "unauthenticated", 2, true},
		{"permission", errdefs.ErrPermission, apiv1.CodePermissionDenied, http.StatusForbidden, "permission_denied", 2, true},
		{"too large", errdefs.ErrTooLarge, apiv1.CodePayloadTooLarge, http.StatusRequestEntityTooLarge, "resource_exhausted", 2, true},
		{"no class", nil, apiv1.CodeInternal, http.StatusInternalServerError, "internal", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := errors.New("boom")
			if tc.class != nil {
				err = fmt.Errorf("start sandbox sbx1: %v: %w", err, tc.class)
			}
			c := errdefs.ClassOf(err)
			if c.Err != tc.class {
				t.Errorf("ClassOf(%q).Err = %v, want %v", err, c.Err, tc.class)
			}
			if c.Code != tc.code || c.HTTPStatus != tc.status || c.ConnectCode != tc.connect || c.ExitCode != tc.exit {
				t.Errorf("ClassOf(%q) = code %q, HTTP %d, Connect %q, exit %d; want %q, %d, %q, %d",
					err, c.Code, c.HTTPStatus, c.ConnectCode, c.ExitCode, tc.code, tc.status, tc.connect, tc.exit)
			}
			if got := errdefs.IsUserError(err); got != tc.user {
				t.Errorf("IsUserError(%q) = %v, want %v", err, got, tc.user)
			}
			want := "start sandbox sbx1: boom"
			if tc.class == nil {
				want = "boom"
			}
			if got := errdefs.Message(err); got != want {
				t.Errorf("Message(%q) = %q, want %q", err, got, want)
			}
		})
	}
}

// TestClassOfPrecedence: an error that carries two classes takes the
// first in the table, and one that is unavailable as well as the user's
// to fix is still the user's.
func TestClassOfPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"not found before conflict", fmt.Errorf("x: %w: %w", errdefs.ErrConflict, errdefs.ErrNotFound), errdefs.ErrNotFound},
		{"precondition before unavailable", fmt.Errorf("x: %w: %w", errdefs.ErrUnavailable, errdefs.ErrPrecondition), errdefs.ErrPrecondition},
		{"joined", errors.Join(errors.New("a"), fmt.Errorf("b: %w", errdefs.ErrExhausted)), errdefs.ErrExhausted},
		{"a class's text is no class", errors.New("x: not found"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errdefs.ClassOf(tc.err).Err; got != tc.want {
				t.Errorf("ClassOf(%q).Err = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestMessage(t *testing.T) {
	errExtra := errors.New("not implemented")
	for _, tc := range []struct {
		name  string
		err   error
		extra []error
		want  string
	}{
		{"flattened cause keeps its text", fmt.Errorf("create: %v: %w", fmt.Errorf("no template x: %w", errdefs.ErrNotFound), errdefs.ErrInvalid), nil, "create: no template x: not found"},
		{"class in the middle stays", fmt.Errorf("%w: retry later", errdefs.ErrUnavailable), nil, "unavailable: retry later"},
		{"the class alone", errdefs.ErrConflict, nil, "conflict"},
		{"an edge's own class", fmt.Errorf("route x: %w", errExtra), []error{errExtra}, "route x"},
		{"an edge's class it does not pass", fmt.Errorf("route x: %w", errExtra), nil, "route x: not implemented"},
		{"two classes, both cut", fmt.Errorf("x: %w: %w", errdefs.ErrPermission, errdefs.ErrUnavailable), nil, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errdefs.Message(tc.err, tc.extra...); got != tc.want {
				t.Errorf("Message(%q) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// TestByCode: a client reads each code and status back as its class, and
// "unavailable" and 503, which two classes answer, as the one to retry.
func TestByCode(t *testing.T) {
	for _, tc := range []struct {
		code   string
		status int
		want   error
	}{
		{apiv1.CodeInvalidArgument, http.StatusBadRequest, errdefs.ErrInvalid},
		{apiv1.CodeUnauthenticated, http.StatusUnauthorized, errdefs.ErrUnauthenticated},
		{apiv1.CodePermissionDenied, http.StatusForbidden, errdefs.ErrPermission},
		{apiv1.CodeNotFound, http.StatusNotFound, errdefs.ErrNotFound},
		{apiv1.CodeConflict, http.StatusConflict, errdefs.ErrConflict},
		{apiv1.CodePayloadTooLarge, http.StatusRequestEntityTooLarge, errdefs.ErrTooLarge},
		{apiv1.CodeResourceExhausted, http.StatusTooManyRequests, errdefs.ErrExhausted},
		{apiv1.CodeUnavailable, http.StatusServiceUnavailable, errdefs.ErrUnavailable},
		{apiv1.CodeInternal, http.StatusInternalServerError, nil},
		{"teapot", http.StatusTeapot, nil},
	} {
		t.Run(tc.code, func(t *testing.T) {
			if got := errdefs.ByCode(tc.code).Err; got != tc.want {
				t.Errorf("ByCode(%q).Err = %v, want %v", tc.code, got, tc.want)
			}
			c := errdefs.ByHTTPStatus(tc.status)
			if c.Err != tc.want {
				t.Errorf("ByHTTPStatus(%d).Err = %v, want %v", tc.status, c.Err, tc.want)
			}
			want := tc.code
			if tc.want == nil {
				want = apiv1.CodeInternal
			}
			if c.Code != want {
				t.Errorf("ByHTTPStatus(%d).Code = %q, want %q", tc.status, c.Code, want)
			}
		})
	}
}
