package store

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func testKeys(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	keys := []Key{
		{ID: "keyb", Name: "first", Role: "admin", Hash: []byte{0xde, 0xad}, Format: "airlock", CreatedAt: t0},
		{ID: "keya", Name: "second", Role: "user", Hash: []byte{0xbe, 0xef}, Format: "e2b", CreatedAt: t0.Add(time.Second)},
		{ID: "keyc", Name: "third", Role: "user", Hash: []byte{0x00}, Format: "airlock", CreatedAt: t0.Add(2 * time.Second)},
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

func testKeyCreatedAtDefaultsToNow(t *testing.T, b backend) {
	s := b.newStore(t)
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

func testKeyByHash(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	keys := []Key{
		{ID: "keya", Name: "a", Role: "user", Hash: []byte{0xaa, 0x01}, Format: "e2b", CreatedAt: t0},
		{ID: "keyb", Name: "b", Role: "admin", Hash: []byte{0xaa, 0x02}, Format: "airlock", CreatedAt: t0},
	}
	for _, k := range keys {
		if err := s.InsertKey(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range keys {
		got, err := s.GetKeyByHash(ctx, want.Hash)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("GetKeyByHash(%x) = %+v, %v; want %+v", want.Hash, got, err, want)
		}
	}
	for _, h := range [][]byte{{0xaa}, {0xaa, 0x01, 0x00}, {0xaa, 0x03}, {}, nil} {
		if k, err := s.GetKeyByHash(ctx, h); !errors.Is(err, errdefs.ErrNotFound) || strings.Contains(err.Error(), "aa") {
			t.Errorf("GetKeyByHash(%x) = %+v, %v; want not found, without the hash", h, k, err)
		}
	}

	// No two keys share a hash, whatever their IDs and formats.
	dup := Key{ID: "keyc", Name: "c", Role: "user", Hash: []byte{0xaa, 0x01}, Format: "airlock"}
	err := s.InsertKey(ctx, dup)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "another key has the same hash") {
		t.Errorf("InsertKey with a taken hash = %v, want a conflict saying so", err)
	}
	if _, err := s.GetKey(ctx, "keyc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the refused key was stored: %v", err)
	}
	if got, err := s.GetKeyByHash(ctx, dup.Hash); err != nil || got.ID != "keya" {
		t.Errorf("the hash now finds %+v, %v; want keya", got, err)
	}
	if err := s.DeleteKey(ctx, "keya"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetKeyByHash(ctx, keys[0].Hash); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetKeyByHash after delete = %v, want not found", err)
	}
	// The hash of a deleted key is free again.
	if err := s.InsertKey(ctx, dup); err != nil {
		t.Errorf("InsertKey with a freed hash: %v", err)
	}
}

func testKeyFormatDefault(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	if err := s.InsertKey(ctx, Key{ID: "key1", Name: "k", Role: "user", Hash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if k, err := s.GetKey(ctx, "key1"); err != nil || k.Format != "airlock" {
		t.Errorf("format of a key stored without one: %q, %v; want airlock", k.Format, err)
	}
}
