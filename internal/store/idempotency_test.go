package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestIdempotent(t *testing.T) {
	s := newStore(t)
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
