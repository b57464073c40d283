package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestKeys(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	keys := []Key{
		{ID: "keyb", Name: "first", Role: "admin", Hash: []byte{0xde, 0xad}, CreatedAt: t0},
		{ID: "keya", Name: "second", Role: "user", Hash: []byte{0xbe, 0xef}, CreatedAt: t0.Add(time.Second)},
		{ID: "keyc", Name: "third", Role: "user", Hash: []byte{0x00}, CreatedAt: t0.Add(2 * time.Second)},
	}
	for _, k := range keys {
		if err := s.InsertKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}

	got, err := s.GetKey(ctx, "keya")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, keys[1]) {
		t.Errorf("GetKey = %+v, want %+v", got, keys[1])
	}

	// Listed in insertion order, not ID order.
	list, err := s.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(list, keys) {
		t.Errorf("ListKeys = %+v, want %+v", list, keys)
	}

	dup := keys[0]
	dup.Name = "again"
	if err := s.InsertKey(ctx, dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate InsertKey = %v, want conflict", err)
	}
	if k, _ := s.GetKey(ctx, dup.ID); k.Name != "first" {
		t.Errorf("a refused duplicate changed the key: %+v", k)
	}
	if err := s.InsertKey(ctx, Key{Name: "no id"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("InsertKey without ID = %v, want invalid", err)
	}

	for _, tc := range []struct {
		role string
		want int
	}{
		{"admin", 1},
		{"user", 2},
		{"", 3},
		{"other", 0},
	} {
		t.Run("count "+tc.role, func(t *testing.T) {
			if n, err := s.CountKeys(ctx, tc.role); err != nil || n != tc.want {
				t.Errorf("CountKeys(%q) = %d, %v; want %d", tc.role, n, err, tc.want)
			}
		})
	}

	if err := s.DeleteKey(ctx, "keya"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetKey(ctx, "keya"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetKey after delete = %v, want not found", err)
	}
	if err := s.DeleteKey(ctx, "keya"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second DeleteKey = %v, want not found", err)
	}
	if n, _ := s.CountKeys(ctx, "user"); n != 1 {
		t.Errorf("%d user keys after delete, want 1", n)
	}
}

func TestKeyCreatedAtDefaultsToNow(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	before := time.Now()
	if err := s.InsertKey(ctx, Key{ID: "key1", Role: "user", Hash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	k, err := s.GetKey(ctx, "key1")
	if err != nil {
		t.Fatal(err)
	}
	if k.CreatedAt.Before(before) || k.CreatedAt.After(time.Now()) || k.CreatedAt.Location() != time.UTC {
		t.Errorf("CreatedAt %v is not now in UTC", k.CreatedAt)
	}
}
