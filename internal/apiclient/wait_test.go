package apiclient

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestWaitSandbox: it polls a creating sandbox until it runs, and a
// sandbox that failed to start is an error with the server's reason.
func TestWaitSandbox(t *testing.T) {
	var polls atomic.Int32
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sbxslow":
			state := apiv1.StateCreating
			if polls.Add(1) >= 3 {
				state = apiv1.StateRunning
			}
			writeJSON(w, 200, apiv1.Sandbox{ID: "sbxslow", State: state})
		case "/v1/sandboxes/sbxbad":
			writeJSON(w, 200, apiv1.Sandbox{ID: "sbxbad", State: apiv1.StateFailed, LastError: &apiv1.Status{Message: "boot timed out"}})
		default:
			writeJSON(w, 404, apiv1.ErrorBody{Error: apiv1.Error{Code: "not_found", Message: "no such sandbox"}})
		}
	}))
	ctx := context.Background()
	if sb, err := c.WaitSandbox(ctx, "sbxslow"); err != nil || sb.State != apiv1.StateRunning || polls.Load() != 3 {
		t.Fatalf("a sandbox that comes up: %+v, %v after %d polls", sb, err, polls.Load())
	}
	if sb, err := c.WaitSandbox(ctx, "sbxbad"); err == nil || !strings.Contains(err.Error(), "boot timed out") || sb.State != apiv1.StateFailed {
		t.Fatalf("a sandbox that failed: %+v, %v", sb, err)
	}
	if _, err := c.WaitSandbox(ctx, "sbxnone"); err == nil || !strings.Contains(err.Error(), "no such sandbox") {
		t.Fatalf("no sandbox: %v", err)
	}
}
