package api

import (
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/template"
)

// waitOp waits for operation id to finish and returns it.
func (s *secretServer) waitOp(t *testing.T, key, id string) apiv1.Operation {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var op apiv1.Operation
		s.must(t, 200, "GET", "/v1/operations/"+id+"?wait_s=5", key, "", &op)
		if op.Done() {
			return op
		}
	}
	t.Fatalf("operation %s did not finish", id)
	return apiv1.Operation{}
}

// waitState waits for sandbox id to be in state want.
func (s *secretServer) waitState(t *testing.T, key, id, want string) apiv1.Sandbox {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var sb apiv1.Sandbox
	for time.Now().Before(deadline) {
		s.must(t, 200, "GET", "/v1/sandboxes/"+id, key, "", &sb)
		if sb.State == want {
			return sb
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sandbox %s is %s, not %s", id, sb.State, want)
	return sb
}

// Checkpoints and forks through the API, as a user key would use and
// attack them: a checkpoint of a running sandbox becomes ready with its
// event; sandboxes are made from it and by a fork; another key finds
// none of it; the key's checkpoints limit holds; bad input is refused
// and changes nothing.
func TestCheckpointsAPI(t *testing.T) {
	s := newSecretServer(t)
	if _, err := s.rt.AddTemplate("base", template.Settings{VCPUs: 1, MemoryMiB: 256, DiskMiB: 512}); err != nil {
		t.Fatal(err)
	}
	var so apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.user, `{"template": "base", "env": {"A": "1"}}`, &so)
	src := so.Sandbox.ID
	s.waitState(t, s.user, src, apiv1.StateRunning)

	var co apiv1.CheckpointOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+src+"/checkpoints", s.user, `{"name": "before-migration"}`, &co)
	c := co.Checkpoint
	if !strings.HasPrefix(c.ID, "chk") || c.SandboxID != src || c.Name != "before-migration" || c.State != apiv1.CheckpointCreating ||
		c.VCPUs != 1 || c.MemoryMiB != 256 || c.DiskMiB != 512 || co.Operation.Kind != apiv1.OpCheckpoint || co.Operation.TargetID != src {
		t.Fatalf("checkpoint answer %+v", co)
	}
	if op := s.waitOp(t, s.user, co.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("checkpoint operation %+v", op)
	}
	s.must(t, 200, "GET", "/v1/checkpoints/"+c.ID, s.user, "", &c)
	if c.State != apiv1.CheckpointReady || c.SizeBytes <= 0 || c.Template.Ref == "" {
		t.Fatalf("checkpoint after its operation: %+v", c)
	}
	// The source is as it was, and the change is an event.
	if sb := s.waitState(t, s.user, src, apiv1.StateRunning); sb.LastError != nil {
		t.Fatalf("source after the checkpoint: %+v", sb)
	}
	var evs apiv1.Events
	s.must(t, 200, "GET", "/v1/events?type=checkpoint.*", s.user, "", &evs)
	if len(evs.Items) != 1 || evs.Items[0].Type != apiv1.EventCheckpointReady || evs.Items[0].SandboxID != src ||
		!strings.Contains(string(evs.Items[0].Data), c.ID) {
		t.Fatalf("checkpoint events %+v", evs.Items)
	}

	// A sandbox from it, with the checkpoint's template and environment.
	var child apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes", s.user, `{"checkpoint": "`+c.ID+`"}`, &child)
	if child.Sandbox.Template.Ref != c.Template.Ref || child.Sandbox.MemoryMiB != 256 {
		t.Fatalf("a sandbox from the checkpoint: %+v", child.Sandbox)
	}
	s.waitState(t, s.user, child.Sandbox.ID, apiv1.StateRunning)

	// The source rolls back to its checkpoint, under the same ID.
	var rb apiv1.SandboxOperation
	s.must(t, 202, "POST", "/v1/sandboxes/"+src+"/rollback", s.user, `{"checkpoint": "`+c.ID+`"}`, &rb)
	if rb.Operation.Kind != apiv1.OpRollback || rb.Sandbox.ID != src || rb.Sandbox.State != apiv1.StateWaking {
		t.Fatalf("rollback answer %+v", rb)
	}
	if op := s.waitOp(t, s.user, rb.Operation.ID); op.Status != apiv1.OpSucceeded {
		t.Fatalf("rollback operation %+v", op)
	}
	s.waitState(t, s.user, src, apiv1.StateRunning)

	// A fork: a checkpoint and three sandboxes in one call.
	var f apiv1.Forked
	s.must(t, 202, "POST", "/v1/sandboxes/"+src+"/fork", s.user, `{"count": 3, "timeout_s": 600, "metadata": {"run": "a"}}`, &f)
	if len(f.Sandboxes) != 3 || f.Operation.Kind != apiv1.OpFork || !strings.HasPrefix(f.Checkpoint, "chk") {
		t.Fatalf("fork answer %+v", f)
	}
	for _, sb := range f.Sandboxes {
		if sb.Metadata["run"] != "a" || sb.ExpiresAt == nil {
			t.Errorf("fork child %+v", sb)
		}
		s.waitState(t, s.user, sb.ID, apiv1.StateRunning)
	}
	var list apiv1.List[apiv1.Checkpoint]
	s.must(t, 200, "GET", "/v1/checkpoints?sandbox_id="+src, s.user, "", &list)
	if len(list.Items) != 2 || list.Items[0].ID != c.ID || list.Items[1].ID != f.Checkpoint {
		t.Fatalf("checkpoints of the source: %+v", list)
	}
	var page apiv1.List[apiv1.Checkpoint]
	s.must(t, 200, "GET", "/v1/checkpoints?limit=1", s.user, "", &page)
	if len(page.Items) != 1 || page.NextPageToken == "" {
		t.Fatalf("a page of one: %+v", page)
	}
	s.must(t, 200, "GET", "/v1/checkpoints?limit=1&page_token="+page.NextPageToken, s.user, "", &page)
	if len(page.Items) != 1 || page.Items[0].ID != f.Checkpoint {
		t.Fatalf("the second page: %+v", page)
	}

	// Another key: nothing of it exists.
	var k apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.admin, `{"name": "other", "role": "user"}`, &k)
	s.must(t, 404, "GET", "/v1/checkpoints/"+c.ID, k.Key, "", nil)
	s.must(t, 404, "DELETE", "/v1/checkpoints/"+c.ID, k.Key, "", nil)
	s.must(t, 404, "POST", "/v1/sandboxes", k.Key, `{"checkpoint": "`+c.ID+`"}`, nil)
	s.must(t, 404, "POST", "/v1/sandboxes/"+src+"/checkpoints", k.Key, "", nil)
	s.must(t, 404, "POST", "/v1/sandboxes/"+src+"/fork", k.Key, `{"count": 1}`, nil)
	s.must(t, 404, "POST", "/v1/sandboxes/"+src+"/rollback", k.Key, `{"checkpoint": "`+c.ID+`"}`, nil)
	var theirs apiv1.List[apiv1.Checkpoint]
	s.must(t, 200, "GET", "/v1/checkpoints", k.Key, "", &theirs)
	if len(theirs.Items) != 0 {
		t.Fatalf("another key lists %+v", theirs)
	}

	// Bad input: refused, and no checkpoint more.
	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes/" + src + "/checkpoints", `{"name": 5}`},
		{"POST", "/v1/sandboxes/" + src + "/checkpoints", `{"name": "a\u0000b"}`},
		{"POST", "/v1/sandboxes/" + src + "/checkpoints", `{"name": "` + strings.Repeat("n", 200) + `"}`},
		{"POST", "/v1/sandboxes/" + src + "/checkpoints", `{"nme": "x"}`},
		{"POST", "/v1/sandboxes/" + src + "/fork", `{"count": 0}`},
		{"POST", "/v1/sandboxes/" + src + "/fork", `{"count": 101}`},
		{"POST", "/v1/sandboxes/" + src + "/fork", `{"count": "3"}`},
		{"POST", "/v1/sandboxes/" + src + "/fork", `{"count": 1, "metadata": {"": "x"}}`},
		{"POST", "/v1/sandboxes", `{"checkpoint": "chk../../etc"}`},
		{"POST", "/v1/sandboxes", `{"checkpoint": "` + c.ID + `", "vcpus": 2}`},
		{"POST", "/v1/sandboxes", `{"checkpoint": "` + c.ID + `", "template": "other"}`},
		{"POST", "/v1/sandboxes", `{"checkpoint": "` + c.ID + `", "disk_mib": 100}`},
		{"POST", "/v1/sandboxes/" + src + "/rollback", `{}`},
		{"POST", "/v1/sandboxes/" + src + "/rollback", `{"checkpoint": 5}`},
		{"POST", "/v1/sandboxes/" + src + "/rollback", `{"checkpoint": "chk../../etc"}`},
		{"POST", "/v1/sandboxes/" + src + "/rollback", `{"checkpoint": "` + c.ID + `", "at": 1}`},
		{"POST", "/v1/sandboxes/" + child.Sandbox.ID + "/rollback", `{"checkpoint": "` + c.ID + `"}`},
		{"GET", "/v1/checkpoints?page_token=zzz", ""},
		{"GET", "/v1/checkpoints?limit=5000", ""},
		{"GET", "/v1/checkpoints?state=ready", ""},
	} {
		a := s.do(t, bad.method, bad.path, s.user, bad.body)
		if a.status != 400 {
			t.Errorf("%s %s %s: %d %s, want 400", bad.method, bad.path, bad.body, a.status, a.body)
		}
	}
	s.must(t, 404, "GET", "/v1/checkpoints/chk"+strings.Repeat("a", 5000), s.user, "", nil)
	s.must(t, 404, "GET", "/v1/checkpoints?sandbox_id=sbx%00", s.user, "", nil)
	s.must(t, 404, "POST", "/v1/sandboxes", s.user, `{"checkpoint": "chkmissing00000000000"}`, nil)
	s.must(t, 404, "POST", "/v1/sandboxes/"+src+"/rollback", s.user, `{"checkpoint": "chkmissing00000000000"}`, nil)
	s.must(t, 404, "POST", "/v1/sandboxes/sbxmissing/rollback", s.user, `{"checkpoint": "`+c.ID+`"}`, nil)
	s.must(t, 200, "GET", "/v1/checkpoints", s.user, "", &list)
	if len(list.Items) != 2 {
		t.Fatalf("bad input changed the checkpoints: %+v", list)
	}

	// The key's limit: two held, at most two.
	s.must(t, 200, "PATCH", "/v1/keys/"+s.userID, s.admin, `{"limits": {"checkpoints": 2}}`, nil)
	a := s.must(t, 429, "POST", "/v1/sandboxes/"+src+"/checkpoints", s.user, "", nil)
	if !strings.Contains(string(a.body), "checkpoints=2") {
		t.Errorf("over the limit: %s", a.body)
	}
	// Deleted: gone, and room for another.
	s.must(t, 204, "DELETE", "/v1/checkpoints/"+c.ID, s.user, "", nil)
	s.must(t, 404, "GET", "/v1/checkpoints/"+c.ID, s.user, "", nil)
	s.must(t, 404, "POST", "/v1/sandboxes", s.user, `{"checkpoint": "`+c.ID+`"}`, nil)
	s.must(t, 202, "POST", "/v1/sandboxes/"+src+"/checkpoints", s.user, "", &co)
	s.waitOp(t, s.user, co.Operation.ID)
	s.must(t, 200, "GET", "/v1/events?type=checkpoint.deleted", s.user, "", &evs)
	if len(evs.Items) != 1 || !strings.Contains(string(evs.Items[0].Data), c.ID) {
		t.Fatalf("deleted events %+v", evs.Items)
	}
}
