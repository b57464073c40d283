package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func testSecrets(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	secrets := []Secret{
		{Owner: "keya", Name: "openai", Sealed: []byte{1, 2, 3}, CreatedAt: t0, UpdatedAt: t0},
		{Owner: "keya", Name: "github", Sealed: []byte{4}, CreatedAt: t0.Add(time.Second), UpdatedAt: t0.Add(time.Second)},
		{Owner: "keyb", Name: "openai", Sealed: []byte{5}, CreatedAt: t0.Add(2 * time.Second), UpdatedAt: t0.Add(2 * time.Second)},
	}
	for _, sec := range secrets {
		created, err := s.PutSecret(ctx, sec)
		if err != nil || !created {
			t.Fatalf("PutSecret(%s/%s) = %v, %v; want created", sec.Owner, sec.Name, created, err)
		}
	}

	got, err := s.GetSecret(ctx, "keya", "openai")
	if err != nil || !reflect.DeepEqual(got, secrets[0]) {
		t.Errorf("GetSecret = %+v, %v; want %+v", got, err, secrets[0])
	}
	// Another owner's secret of the same name is another secret.
	if got, err := s.GetSecret(ctx, "keyb", "openai"); err != nil || !reflect.DeepEqual(got, secrets[2]) {
		t.Errorf("GetSecret of keyb = %+v, %v; want %+v", got, err, secrets[2])
	}
	for _, tc := range []struct{ owner, name string }{{"keyc", "openai"}, {"keyb", "github"}, {"keya", "OPENAI"}} {
		if _, err := s.GetSecret(ctx, tc.owner, tc.name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("GetSecret(%s, %s) = %v, want not found", tc.owner, tc.name, err)
		}
	}

	// Listed by name, without values, and only the owner's.
	list, err := s.ListSecrets(ctx, "keya")
	want := []Secret{
		{Owner: "keya", Name: "github", CreatedAt: secrets[1].CreatedAt, UpdatedAt: secrets[1].UpdatedAt},
		{Owner: "keya", Name: "openai", CreatedAt: secrets[0].CreatedAt, UpdatedAt: secrets[0].UpdatedAt},
	}
	if err != nil || !reflect.DeepEqual(list, want) {
		t.Errorf("ListSecrets(keya) = %+v, %v; want %+v", list, err, want)
	}
	if list, err := s.ListSecrets(ctx, "keyc"); err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListSecrets of an owner without secrets = %#v, %v; want an empty list", list, err)
	}

	// A replace changes the value and updated_at, and keeps created_at.
	later := t0.Add(time.Hour)
	created, err := s.PutSecret(ctx, Secret{Owner: "keya", Name: "openai", Sealed: []byte{9, 9}, CreatedAt: later, UpdatedAt: later})
	if err != nil || created {
		t.Fatalf("replacing PutSecret = %v, %v; want not created", created, err)
	}
	got, _ = s.GetSecret(ctx, "keya", "openai")
	if !reflect.DeepEqual(got.Sealed, []byte{9, 9}) || !got.CreatedAt.Equal(t0) || !got.UpdatedAt.Equal(later) {
		t.Errorf("after a replace: %+v; want the new value, created %v, updated %v", got, t0, later)
	}
	if other, _ := s.GetSecret(ctx, "keyb", "openai"); !reflect.DeepEqual(other, secrets[2]) {
		t.Errorf("a replace of keya's secret changed keyb's: %+v", other)
	}

	for _, bad := range []Secret{{Name: "x", Sealed: []byte{1}}, {Owner: "keya", Sealed: []byte{1}}} {
		if _, err := s.PutSecret(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("PutSecret(%+v) = %v, want invalid", bad, err)
		}
	}

	if err := s.DeleteSecret(ctx, "keyb", "github"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting another owner's secret: %v, want not found", err)
	}
	if err := s.DeleteSecret(ctx, "keya", "openai"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(ctx, "keya", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetSecret after delete = %v, want not found", err)
	}
	if err := s.DeleteSecret(ctx, "keya", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second DeleteSecret = %v, want not found", err)
	}
	if _, err := s.GetSecret(ctx, "keyb", "openai"); err != nil {
		t.Errorf("keyb's secret went with keya's: %v", err)
	}
	// A name stored again after a delete is new.
	if created, err := s.PutSecret(ctx, Secret{Owner: "keya", Name: "openai", Sealed: []byte{1}}); err != nil || !created {
		t.Errorf("PutSecret after delete = %v, %v; want created", created, err)
	}
}

func testSecretTimesDefaultToNow(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	before := time.Now()
	if _, err := s.PutSecret(ctx, Secret{Owner: "key1", Name: "n", Sealed: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	sec, err := s.GetSecret(ctx, "key1", "n")
	if err != nil {
		t.Fatal(err)
	}
	if sec.CreatedAt.Before(before) || sec.CreatedAt.After(time.Now()) || sec.CreatedAt.Location() != time.UTC ||
		!sec.UpdatedAt.Equal(sec.CreatedAt) {
		t.Errorf("created %v, updated %v: want both now in UTC", sec.CreatedAt, sec.UpdatedAt)
	}
	time.Sleep(time.Millisecond)
	if _, err := s.PutSecret(ctx, Secret{Owner: "key1", Name: "n", Sealed: []byte{2}}); err != nil {
		t.Fatal(err)
	}
	again, _ := s.GetSecret(ctx, "key1", "n")
	if !again.CreatedAt.Equal(sec.CreatedAt) || !again.UpdatedAt.After(sec.UpdatedAt) {
		t.Errorf("after a replace: created %v, updated %v; want created %v and a later update", again.CreatedAt, again.UpdatedAt, sec.CreatedAt)
	}
}
