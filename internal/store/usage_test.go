package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

var errOverLimit = errors.New("over the limit")

// testKeyUsage: a key's usage counts its sandboxes by state, its builds,
// and nobody else's; limits round-trip with the key.
func testKeyUsage(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	if err := s.InsertKey(ctx, Key{ID: "key1", Name: "a", Role: "user", Hash: []byte{1}, Limits: json.RawMessage(`{"sandboxes":2}`)}); err != nil {
		t.Fatal(err)
	}
	if k, err := s.GetKey(ctx, "key1"); err != nil || string(k.Limits) != `{"sandboxes":2}` {
		t.Fatalf("limits %s, %v", k.Limits, err)
	}
	if err := s.SetKeyLimits(ctx, "key1", json.RawMessage(`{"vcpus":4}`)); err != nil {
		t.Fatal(err)
	}
	if k, _ := s.GetKey(ctx, "key1"); string(k.Limits) != `{"vcpus":4}` {
		t.Fatalf("limits after set %s", k.Limits)
	}
	if err := s.SetKeyLimits(ctx, "keynone", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("limits of an unknown key: %v", err)
	}
	for i, state := range []string{"running", "suspended", "deleted", "paused", "failed"} {
		sb := mustInsertSandbox(t, s, fmt.Sprint("sbx", i), "key1")
		sb.State = state
		if err := s.UpdateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	mustInsertSandbox(t, s, "sbxother", "key2")
	u, err := s.KeyUsage(ctx, "key1")
	// 4 not deleted, 2 GiB disk each; running and paused hold 2 vCPUs and
	// 512 MiB each; one suspended.
	want := Usage{Sandboxes: 4, DiskMiB: 4 * 2048, VCPUs: 4, MemoryMiB: 1024, SuspendedMiB: 512}
	if err != nil || u != want {
		t.Fatalf("usage %+v, %v; want %+v", u, err, want)
	}
}

// testInsertSandboxWithin: stores racing for a key's last slot let one
// create through; admit's refusal writes nothing.
func testInsertSandboxWithin(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, racers)
	admit := func(u Usage) error {
		if u.Sandboxes+1 > 3 {
			return errOverLimit
		}
		return nil
	}
	mustInsertSandbox(t, stores[0], "sbxa", "key1")
	mustInsertSandbox(t, stores[0], "sbxb", "key1")
	for round := range 3 {
		errs := race(t, stores, func(s *Store) error {
			id := fmt.Sprintf("sbx%d%p", round, s)
			return s.InsertSandboxWithin(ctx, testSandbox(id, "key1"), createOp("op"+id, id, "key1"), admit)
		})
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, errOverLimit):
				t.Fatalf("a loser got %v", err)
			}
		}
		if want := map[bool]int{true: 1, false: 0}[round == 0]; won != want {
			t.Fatalf("round %d: %d creates passed the limit of 3, want %d", round, won, want)
		}
	}
	if u, _ := stores[0].KeyUsage(ctx, "key1"); u.Sandboxes != 3 {
		t.Fatalf("%d sandboxes recorded, want 3", u.Sandboxes)
	}
}

// testClusterNodes: a node registers with its endpoint, again with a new
// one, and is forgotten; a bad endpoint is refused.
func testClusterNodes(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	if got, err := s.ClusterNodes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("nodes of a new store: %v, %v", got, err)
	}
	for _, ep := range []string{"http://10.0.0.5:7701", "https://10.0.0.6:7701"} {
		if err := s.RegisterClusterNode(ctx, "host-a", ep); err != nil {
			t.Fatal(err)
		}
		if got, err := s.ClusterNodes(ctx); err != nil || len(got) != 1 || got["host-a"] != ep {
			t.Fatalf("nodes %v, %v; want host-a at %s", got, err, ep)
		}
	}
	for _, bad := range []string{"", "10.0.0.5:7701", "ftp://x", "http://"} {
		if err := s.RegisterClusterNode(ctx, "host-b", bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("endpoint %q: %v, want invalid", bad, err)
		}
	}
	// Template settings: recorded ones, else the catalogue's.
	dgst := "sha256:" + strings.Repeat("ab", 32)
	if _, err := s.TemplateSettings(ctx, dgst); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("settings of an unknown digest: %v", err)
	}
	if err := s.PutTemplateTag(ctx, TemplateTag{Name: "py", Tag: "v1", Digest: dgst, SizeBytes: 1, Settings: []byte(`{"start_cmd":"a"}`), Owner: "key1"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.TemplateSettings(ctx, dgst); err != nil || string(got) != `{"start_cmd":"a"}` {
		t.Fatalf("catalogue settings %s, %v", got, err)
	}
	for _, v := range []string{`{"start_cmd":"b"}`, `{"start_cmd":"c"}`} {
		if err := s.PutTemplateSettings(ctx, dgst, []byte(v)); err != nil {
			t.Fatal(err)
		}
		if got, err := s.TemplateSettings(ctx, dgst); err != nil || string(got) != v {
			t.Fatalf("recorded settings %s, %v; want %s", got, err, v)
		}
	}
	if err := s.UnregisterClusterNode(ctx, "host-a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.ClusterNodes(ctx); len(got) != 0 {
		t.Fatalf("nodes after unregister: %v", got)
	}
}
