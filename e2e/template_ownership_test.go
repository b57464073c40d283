package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestTemplateOwnership drives the rule docs/api.md states for who may
// point a tag at new content or delete it: an admin key any tag; a user
// key a name:tag that does not exist yet (and was never built by another
// key), or one whose last build or save it made itself. Builds here are
// env-only steps, which start no VM; saves copy a running sandbox's disk.
func TestTemplateOwnership(t *testing.T) {
	s := buildServer(t)
	newKey := func(name string) string {
		t.Helper()
		var k apiv1.KeyCreated
		s.must(t, 201, "POST", "/v1/keys", s.key, apiv1.CreateKey{Name: name, Role: apiv1.RoleUser}, &k)
		t.Cleanup(func() { s.call(t, "DELETE", "/v1/keys/"+k.ID, s.key, nil) })
		return k.Key
	}
	alice, bob := newKey("owner-alice"), newKey("owner-bob")

	// build posts an env-only build with key and, when it is accepted,
	// waits for it to succeed; it returns the answer's status and body.
	build := func(key, name, tag, env string) (int, string) {
		t.Helper()
		req := apiv1.CreateTemplate{Name: name, Tag: tag, From: "tiny", Steps: []apiv1.BuildStep{{Env: map[string]string{"BUILT_BY": env}}}}
		status, b := s.call(t, "POST", "/v1/templates", key, req)
		if status == 202 {
			if op := waitOpOf(t, s, key, b); op.Status != apiv1.OpSucceeded {
				t.Fatalf("build %s:%s with %s failed: %+v", name, tag, env, op.Error)
			}
		}
		return status, string(b)
	}
	save := func(key, sbx, name, tag string) (int, string) {
		t.Helper()
		status, b := s.call(t, "POST", "/v1/sandboxes/"+sbx+"/template", key, apiv1.SaveTemplate{Name: name, Tag: tag})
		if status == 202 {
			if op := waitOpOf(t, s, key, b); op.Status != apiv1.OpSucceeded {
				t.Fatalf("save of %s as %s:%s failed: %+v", sbx, name, tag, op.Error)
			}
		}
		return status, string(b)
	}
	del := func(key, ref string) (int, string) {
		t.Helper()
		status, b := s.call(t, "DELETE", "/v1/templates/"+ref, key, nil)
		return status, string(b)
	}
	digest := func(ref string) string {
		t.Helper()
		var tpl apiv1.Template
		s.must(t, 200, "GET", "/v1/templates/"+ref, s.key, nil, &tpl)
		return tpl.Digest
	}
	want := func(what string, wantStatus int, status int, body string) {
		t.Helper()
		if status != wantStatus {
			t.Fatalf("%s: %d %s, want %d", what, status, body, wantStatus)
		}
		if wantStatus == 403 && (!strings.Contains(body, `"permission_denied"`) || !strings.Contains(body, "was not built with this key")) {
			t.Fatalf("%s: %s, want permission_denied saying the tag was not built with this key", what, body)
		}
	}

	aliceSbx := s.createSandbox(t, alice, apiv1.CreateSandbox{Template: "tiny"})
	bobSbx := s.createSandbox(t, bob, apiv1.CreateSandbox{Template: "tiny"})
	tinyDigest := digest("tiny:latest")

	// Its own tag: a user key builds a new one, saves over it and builds
	// over it again.
	st, b := build(alice, "owned", "v1", "alice-1")
	want("alice builds the new owned:v1", 202, st, b)
	st, b = save(alice, aliceSbx.ID, "owned", "v1")
	want("alice saves her sandbox over her owned:v1", 202, st, b)
	st, b = build(alice, "owned", "v1", "alice-2")
	want("alice builds over her owned:v1", 202, st, b)
	owned := digest("owned:v1")

	// Another key's tag: neither a build nor a save moves it, and it
	// cannot be deleted.
	st, b = build(bob, "owned", "v1", "bob")
	want("bob builds over alice's owned:v1", 403, st, b)
	st, b = save(bob, bobSbx.ID, "owned", "v1")
	want("bob saves over alice's owned:v1", 403, st, b)
	st, b = del(bob, "owned:v1")
	want("bob deletes alice's owned:v1", 403, st, b)
	if got := digest("owned:v1"); got != owned {
		t.Fatalf("owned:v1 moved to %s after refused writes, want %s", got, owned)
	}

	// A built-in: a user key neither builds nor saves over it nor
	// deletes it, but may make a new tag of the same name.
	st, b = build(bob, "tiny", "latest", "bob")
	want("bob builds over the built-in tiny:latest", 403, st, b)
	st, b = save(bob, bobSbx.ID, "tiny", "latest")
	want("bob saves over the built-in tiny:latest", 403, st, b)
	st, b = del(alice, "tiny:latest")
	want("alice deletes the built-in tiny:latest", 403, st, b)
	if got := digest("tiny:latest"); got != tinyDigest {
		t.Fatalf("tiny:latest moved to %s after refused writes, want %s", got, tinyDigest)
	}
	st, b = save(bob, bobSbx.ID, "tiny", "bob")
	want("bob saves his sandbox as the new tag tiny:bob", 202, st, b)
	st, b = del(alice, "tiny:bob")
	want("alice deletes bob's tiny:bob", 403, st, b)
	st, b = del(bob, "tiny:bob")
	want("bob deletes his tiny:bob", 204, st, b)

	// The owner deletes its own tag. Its last build stays on record, so
	// the name:tag stays the owner's: another user key still may not
	// build it.
	st, b = del(alice, "owned:v1")
	want("alice deletes her owned:v1", 204, st, b)
	s.must(t, 404, "GET", "/v1/templates/owned:v1", s.key, nil, nil)
	st, b = build(bob, "owned", "v1", "bob")
	want("bob builds alice's deleted owned:v1", 403, st, b)

	// An admin key replaces a user's tag; the tag's last build is then the
	// admin's, and the user may no longer replace or delete it.
	st, b = build(bob, "bobs", "v1", "bob")
	want("bob builds the new bobs:v1", 202, st, b)
	st, b = build(s.key, "bobs", "v1", "admin")
	want("the admin builds over bob's bobs:v1", 202, st, b)
	st, b = build(bob, "bobs", "v1", "bob-2")
	want("bob builds over bobs:v1 after the admin did", 403, st, b)
	st, b = del(bob, "bobs:v1")
	want("bob deletes bobs:v1 after the admin built it", 403, st, b)
	st, b = del(s.key, "bobs:v1")
	want("the admin deletes bobs:v1", 204, st, b)
}

// waitOpOf waits for the operation of a TemplateOperation answer.
func waitOpOf(t *testing.T, s *server, key string, body []byte) apiv1.Operation {
	t.Helper()
	var res apiv1.TemplateOperation
	if err := json.Unmarshal(body, &res); err != nil || res.Operation.ID == "" {
		t.Fatalf("decode %s: %v", body, err)
	}
	return s.waitOp(t, key, res.Operation.ID)
}
