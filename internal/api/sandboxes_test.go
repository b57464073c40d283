package api

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/template"
)

// A create retried under its Idempotency-Key makes one sandbox: the retry
// gets the first answer back, a different request under the same key is
// refused, and another key makes another sandbox.
func TestCreateSandboxIdempotency(t *testing.T) {
	s := newSecretServer(t)
	if _, err := s.rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	body := `{"template": "base"}`
	first := s.do(t, "POST", "/v1/sandboxes", s.user, body, "Idempotency-Key", "c1")
	again := s.do(t, "POST", "/v1/sandboxes", s.user, body, "Idempotency-Key", "c1")
	if first.status != 202 || again.status != 202 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, retry %d %s (replayed %q)", first.status, first.body, again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	if other := s.do(t, "POST", "/v1/sandboxes", s.user, `{"template": "base", "metadata": {"a": "b"}}`, "Idempotency-Key", "c1"); other.status != 409 {
		t.Fatalf("another create under the same Idempotency-Key: %d %s", other.status, other.body)
	}
	second := s.do(t, "POST", "/v1/sandboxes", s.user, body, "Idempotency-Key", "c2")
	if second.status != 202 {
		t.Fatalf("a create under another key: %d %s", second.status, second.body)
	}
	ids := map[string]bool{}
	for _, a := range []answer{first, second} {
		var so apiv1.SandboxOperation
		if err := json.Unmarshal(a.body, &so); err != nil {
			t.Fatal(err)
		}
		ids[so.Sandbox.ID] = true
		op, err := s.svc.GetOperation(context.Background(), service.Principal{Role: apiv1.RoleAdmin}, so.Operation.ID, 10*time.Second)
		if err != nil || op.Status != apiv1.OpSucceeded {
			t.Fatalf("create %s: %s %+v, %v", so.Sandbox.ID, op.Status, op.Error, err)
		}
		if g := s.rt.State(so.Sandbox.ID); g != sandboxtest.Running {
			t.Fatalf("sandbox %s's guest is %q", so.Sandbox.ID, g)
		}
	}
	if n := s.rt.Calls(sandboxtest.StepCreate); len(ids) != 2 || n != 2 {
		t.Fatalf("sandboxes %v, runtime creates %d; want two of each", ids, n)
	}
}
