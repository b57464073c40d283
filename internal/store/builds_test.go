package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func testBuilds(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	op := func(id, build string) Operation {
		return Operation{ID: id, Kind: "build", TargetID: build, Owner: "key1", Status: "pending", CreatedAt: t0}
	}
	b1 := Build{ID: "bld1", Owner: "key1", Name: "web", Tag: "v1", Status: "building",
		Request: json.RawMessage(`{"name":"web"}`), CreatedAt: t0}
	if err := s.InsertBuild(ctx, b1, op("op1", "bld1")); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertBuild(ctx, b1, op("op1b", "bld1")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second bld1: %v, want a conflict", err)
	}
	if _, err := s.GetOperation(ctx, "op1b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the refused build's operation was stored: %v", err)
	}
	b2 := Build{ID: "bld2", Owner: "key2", Name: "web", Tag: "v1", Status: "building", CreatedAt: t0.Add(time.Second), Node: "host-b"}
	if err := s.InsertBuild(ctx, b2, op("op2", "bld2")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LatestBuild(ctx, "web", "v1"); err != nil || got.ID != "bld2" || got.Node != "host-b" {
		t.Errorf("LatestBuild = %s on %q, %v; want bld2 on host-b", got.ID, got.Node, err)
	}
	if _, err := s.LatestBuild(ctx, "web", "v2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("LatestBuild of a tag never built: %v", err)
	}

	fin := t0.Add(time.Minute)
	b1.Status, b1.Digest, b1.FinishedAt = "ready", "sha256:aa", &fin
	o1 := op("op1", "bld1")
	o1.Status, o1.FinishedAt = "succeeded", &fin
	if err := s.FinishBuild(ctx, b1, o1); err != nil {
		t.Fatal(err)
	}
	b2.Status, b2.Error, b2.FinishedAt = "failed", &Error{Code: "invalid_argument", Message: "step 1 exited with code 3"}, &fin
	o2 := op("op2", "bld2")
	o2.Status, o2.Error, o2.FinishedAt = "failed", b2.Error, &fin
	if err := s.FinishBuild(ctx, b2, o2); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetBuild(ctx, "bld1")
	if err != nil || got.Status != "ready" || got.Digest != "sha256:aa" || got.FinishedAt == nil || !got.FinishedAt.Equal(fin) ||
		string(got.Request) != `{"name":"web"}` || got.Error != nil || got.Node != "" {
		t.Errorf("GetBuild(bld1) = %+v, %v", got, err)
	}
	if o, err := s.GetOperation(ctx, "op2"); err != nil || o.Status != "failed" || o.Error == nil || o.Error.Message != "step 1 exited with code 3" {
		t.Errorf("the failed build's operation = %+v, %v", o, err)
	}
	if err := s.FinishBuild(ctx, Build{ID: "bld9", Status: "ready"}, op("op9", "bld9")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("FinishBuild of an unknown build: %v", err)
	}
	if list, err := s.ListBuilds(ctx, "failed"); err != nil || len(list) != 1 || list[0].ID != "bld2" {
		t.Errorf("ListBuilds(failed) = %+v, %v", list, err)
	}
	if list, err := s.ListBuilds(ctx); err != nil || len(list) != 2 || list[0].ID != "bld1" {
		t.Errorf("ListBuilds() = %+v, %v", list, err)
	}
}

func testTemplatesInUse(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	for i, tc := range []struct{ id, digest, state string }{
		{"sbx1", "sha256:aa", "running"}, {"sbx2", "sha256:bb", "suspended"},
		{"sbx3", "sha256:cc", "deleted"}, {"sbx4", "sha256:aa", "failed"},
	} {
		sb := testSandbox(tc.id, "key1")
		sb.TemplateDigest, sb.State = tc.digest, tc.state
		if err := s.InsertSandbox(ctx, sb, createOp("op"+tc.id, tc.id, "key1")); err != nil {
			t.Fatalf("sandbox %d: %v", i, err)
		}
	}
	got, err := s.TemplatesInUse(ctx)
	if err != nil || len(got) != 2 || !got["sha256:aa"] || !got["sha256:bb"] || got["sha256:cc"] {
		t.Errorf("TemplatesInUse = %v, %v; want aa and bb, not the deleted sandbox's cc", got, err)
	}
}

// testTemplateTags: a tag points at one image at a time, a new put moves
// it, a delete removes only it; bad tags change nothing.
func testTemplateTags(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	if _, err := s.GetTemplateTag(ctx, "web", "v1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an empty catalogue's web:v1: %v, want not found", err)
	}
	v1 := TemplateTag{Name: "web", Tag: "v1", Digest: "sha256:aa", SizeBytes: 4096, Settings: json.RawMessage(`{"vcpus":1}`), Owner: "key1", CreatedAt: t0}
	if err := s.PutTemplateTag(ctx, v1); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTemplateTag(ctx, TemplateTag{Name: "web", Tag: "v2", Digest: "sha256:aa", Settings: json.RawMessage(`{}`), Owner: "key1"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTemplateTag(ctx, "web", "v1")
	if err != nil || got.Digest != "sha256:aa" || got.SizeBytes != 4096 || string(got.Settings) != `{"vcpus":1}` || got.Owner != "key1" || !got.CreatedAt.Equal(t0) {
		t.Errorf("web:v1 = %+v, %v", got, err)
	}
	moved := v1
	moved.Digest, moved.SizeBytes, moved.Owner, moved.CreatedAt = "sha256:bb", 8192, "key2", t0.Add(time.Minute)
	if err := s.PutTemplateTag(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetTemplateTag(ctx, "web", "v1"); err != nil || got.Digest != "sha256:bb" || got.SizeBytes != 8192 || got.Owner != "key2" {
		t.Errorf("web:v1 after the move = %+v, %v", got, err)
	}
	if got, err := s.TemplateTagByDigest(ctx, "sha256:aa"); err != nil || got.Name+":"+got.Tag != "web:v2" {
		t.Errorf("the entry of sha256:aa = %+v, %v; want web:v2", got, err)
	}
	if _, err := s.TemplateTagByDigest(ctx, "sha256:cc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a digest no entry names: %v, want not found", err)
	}
	for _, bad := range []TemplateTag{
		{Tag: "v1", Digest: "sha256:cc", Settings: json.RawMessage(`{}`)},
		{Name: "web", Tag: "v\x00", Digest: "sha256:cc", Settings: json.RawMessage(`{}`)},
		{Name: "web", Tag: "v3", Settings: json.RawMessage(`{}`)},
		{Name: "web", Tag: "v3", Digest: "sha256:cc", Settings: json.RawMessage(`{"vcpus":`)},
	} {
		if err := s.PutTemplateTag(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("put %+v: %v, want invalid", bad, err)
		}
	}
	if err := s.DeleteTemplateTag(ctx, "web", "v2"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplateTag(ctx, "web", "v2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a second delete: %v, want not found", err)
	}
	tags, err := s.ListTemplateTags(ctx)
	if err != nil || len(tags) != 1 || tags[0].Name+":"+tags[0].Tag != "web:v1" || tags[0].Digest != "sha256:bb" {
		t.Errorf("catalogue %+v, %v; want only web:v1 at sha256:bb", tags, err)
	}
}

// testBuildContextNodes: the node a context was last uploaded to is the
// one recorded; bad records change nothing.
func testBuildContextNodes(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	if _, err := s.BuildContextNode(ctx, "ctx1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an unknown context: %v, want not found", err)
	}
	for _, node := range []string{"host-a", "host-b"} {
		if err := s.PutBuildContextNode(ctx, "ctx1", node); err != nil {
			t.Fatal(err)
		}
		if got, err := s.BuildContextNode(ctx, "ctx1"); err != nil || got != node {
			t.Errorf("ctx1 on %q, %v; want %s", got, err, node)
		}
	}
	for _, bad := range [][2]string{{"", "host-a"}, {"ctx2", ""}, {"ctx\x002", "host-a"}, {"ctx2", "host\x00"}} {
		if err := s.PutBuildContextNode(ctx, bad[0], bad[1]); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("record %q on %q: %v, want invalid", bad[0], bad[1], err)
		}
	}
	if _, err := s.BuildContextNode(ctx, "ctx2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused record was kept: %v", err)
	}
}
