package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func testIdempotent(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	recent := time.Now().UTC().Add(-time.Hour)
	stale := time.Now().UTC().Add(-IdempotencyTTL - time.Minute)
	first := Idempotent{KeyID: "key1", Key: "abc", RequestHash: []byte{1}, Status: 202,
		Body: []byte(`{"sandbox":{"id":"sbx1"}}`), CreatedAt: recent}
	if err := s.PutIdempotent(ctx, first); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		put     Idempotent
		wantErr error
		want    Idempotent // what Get returns for (put.KeyID, put.Key) afterwards
	}{
		{
			name:    "second answer loses",
			put:     Idempotent{KeyID: "key1", Key: "abc", RequestHash: []byte{2}, Status: 500, Body: []byte("x")},
			wantErr: errdefs.ErrConflict,
			want:    first,
		},
		{
			name: "same key of another API key",
			put:  Idempotent{KeyID: "key2", Key: "abc", RequestHash: []byte{3}, Status: 201, Body: []byte("y"), CreatedAt: recent},
			want: Idempotent{KeyID: "key2", Key: "abc", RequestHash: []byte{3}, Status: 201, Body: []byte("y"), CreatedAt: recent},
		},
		{
			name: "empty body",
			put:  Idempotent{KeyID: "key1", Key: "empty", RequestHash: []byte{4}, Status: 204, CreatedAt: recent},
			want: Idempotent{KeyID: "key1", Key: "empty", RequestHash: []byte{4}, Status: 204, Body: []byte{}, CreatedAt: recent},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.PutIdempotent(ctx, tc.put); !errors.Is(err, tc.wantErr) {
				t.Fatalf("PutIdempotent = %v, want %v", err, tc.wantErr)
			}
			got, err := s.GetIdempotent(ctx, tc.put.KeyID, tc.put.Key)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}

	// An answer older than the TTL is absent, and a new one replaces it.
	old := Idempotent{KeyID: "key1", Key: "old", RequestHash: []byte{5}, Status: 202, Body: []byte("old"), CreatedAt: stale}
	if err := s.PutIdempotent(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetIdempotent(ctx, "key1", "old"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("stale answer: %v, want not found", err)
	}
	fresh := Idempotent{KeyID: "key1", Key: "old", RequestHash: []byte{6}, Status: 200, Body: []byte("new"), CreatedAt: recent}
	if err := s.PutIdempotent(ctx, fresh); err != nil {
		t.Fatalf("replacing a stale answer: %v", err)
	}
	if got, err := s.GetIdempotent(ctx, "key1", "old"); err != nil || !reflect.DeepEqual(got, fresh) {
		t.Errorf("got %+v, %v; want %+v", got, err, fresh)
	}

	// Purge deletes what is older than the cut-off and nothing else.
	if err := s.PutIdempotent(ctx, Idempotent{KeyID: "key3", Key: "gone", Status: 202, CreatedAt: stale}); err != nil {
		t.Fatal(err)
	}
	n, err := s.PurgeIdempotent(ctx, time.Now().Add(-IdempotencyTTL))
	if err != nil || n != 1 {
		t.Errorf("PurgeIdempotent = %d, %v; want 1", n, err)
	}
	var left int
	if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM idempotency").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 4 {
		t.Errorf("%d answers left, want 4", left)
	}
	if n, err := s.PurgeIdempotent(ctx, time.Now().Add(time.Minute)); err != nil || n != 4 {
		t.Errorf("PurgeIdempotent of all = %d, %v; want 4", n, err)
	}
}

// Of the processes that claim one key at once, one runs the call; the
// others see its claim, then its answer. A released claim, and one whose
// server died (older than IdempotencyPendingTTL), can be claimed again.
func testIdempotentClaims(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, racers)
	hash := []byte{7}
	var won []int
	var mu sync.Mutex
	for i, err := range race(t, stores, func(s *Store) error {
		rec, claimed, err := s.ClaimIdempotent(ctx, "key1", "k", hash)
		if err != nil {
			return err
		}
		if claimed {
			mu.Lock()
			won = append(won, 1)
			mu.Unlock()
			return nil
		}
		if !rec.Pending() || !reflect.DeepEqual(rec.RequestHash, hash) {
			return fmt.Errorf("a loser saw %+v, want the winner's claim", rec)
		}
		return nil
	}) {
		if err != nil {
			t.Errorf("store %d: %v", i, err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d claims won, want 1", len(won))
	}

	// The answer of the claim is what the others then get.
	answer := Idempotent{KeyID: "key1", Key: "k", RequestHash: hash, Status: 202, Body: []byte("done")}
	if err := stores[0].PutIdempotent(ctx, answer); err != nil {
		t.Fatal(err)
	}
	rec, claimed, err := stores[1].ClaimIdempotent(ctx, "key1", "k", hash)
	if err != nil || claimed || rec.Pending() || string(rec.Body) != "done" {
		t.Fatalf("claim after the answer: %+v, %v, %v; want the answer", rec, claimed, err)
	}
	if err := stores[1].ReleaseIdempotent(ctx, "key1", "k", hash); err != nil {
		t.Fatal(err)
	}
	if rec, err := stores[1].GetIdempotent(ctx, "key1", "k"); err != nil || rec.Status != 202 {
		t.Fatalf("release removed an answer: %+v, %v", rec, err)
	}

	// A released claim is claimed again; releasing another call's claim
	// does nothing.
	if _, claimed, err := stores[0].ClaimIdempotent(ctx, "key1", "r", hash); err != nil || !claimed {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	if err := stores[1].ReleaseIdempotent(ctx, "key1", "r", []byte{8}); err != nil {
		t.Fatal(err)
	}
	if _, claimed, _ := stores[1].ClaimIdempotent(ctx, "key1", "r", hash); claimed {
		t.Fatal("another call's release gave the key up")
	}
	if err := stores[0].ReleaseIdempotent(ctx, "key1", "r", hash); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := stores[1].ClaimIdempotent(ctx, "key1", "r", hash); err != nil || !claimed {
		t.Fatalf("claim after release: %v, %v", claimed, err)
	}
	// A different answer under a claimed key loses.
	if err := stores[0].PutIdempotent(ctx, Idempotent{KeyID: "key1", Key: "r", RequestHash: []byte{9}, Status: 200}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("another call's answer under a claim: %v, want conflict", err)
	}
	if err := stores[0].PutIdempotent(ctx, Idempotent{KeyID: "key1", Key: "r", RequestHash: hash}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an answer with status 0: %v, want invalid", err)
	}

	// A claim left by a server that died is taken over once it is old.
	if _, err := stores[0].db.ExecContext(ctx, "UPDATE idempotency SET created_at = ? WHERE key = 'r'",
		nanos(time.Now().Add(-IdempotencyPendingTTL-time.Second))); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := stores[2].ClaimIdempotent(ctx, "key1", "r", []byte{10}); err != nil || !claimed {
		t.Fatalf("claim of an abandoned key: %v, %v", claimed, err)
	}
}

// ReleaseAllClaims removes the claims and nothing else.
func testReleaseAllClaims(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	for _, k := range []string{"a", "b"} {
		if _, claimed, err := s.ClaimIdempotent(ctx, "key1", k, []byte{1}); err != nil || !claimed {
			t.Fatalf("claim %s: %v, %v", k, claimed, err)
		}
	}
	if err := s.PutIdempotent(ctx, Idempotent{KeyID: "key1", Key: "done", RequestHash: []byte{2}, Status: 201}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ReleaseAllClaims(ctx); err != nil || n != 2 {
		t.Fatalf("ReleaseAllClaims = %d, %v; want 2", n, err)
	}
	if _, claimed, err := s.ClaimIdempotent(ctx, "key1", "a", []byte{3}); err != nil || !claimed {
		t.Errorf("claim after the release: %v, %v", claimed, err)
	}
	if r, err := s.GetIdempotent(ctx, "key1", "done"); err != nil || r.Status != 201 {
		t.Errorf("the answer after the release: %+v, %v", r, err)
	}
}
