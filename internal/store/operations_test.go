package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func testOperations(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	done := t0.Add(time.Minute)
	ops := []Operation{
		{ID: "op2", Kind: "create", TargetID: "sbx1", Owner: "key1", Status: "pending", CreatedAt: t0},
		{ID: "op1", Kind: "build", TargetID: "tpl1", Owner: "key1", Status: "running", CreatedAt: t0},
		{ID: "op3", Kind: "delete", TargetID: "sbx2", Owner: "key2", Status: "failed", CreatedAt: t0,
			Error: &Error{Code: "internal", Message: "qemu exited: \"boom\""}, FinishedAt: &done},
	}
	for _, op := range ops {
		if err := s.InsertOperation(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range ops {
		got, err := s.GetOperation(ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("GetOperation(%s) = %+v, want %+v", want.ID, got, want)
		}
	}
	if err := s.InsertOperation(ctx, ops[0]); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate InsertOperation = %v, want conflict", err)
	}

	// Finishing op2 records status, error and time, and nothing else.
	upd := ops[0]
	upd.Status = "failed"
	upd.Error = &Error{Code: "resource_exhausted", Message: "too many sandboxes"}
	upd.FinishedAt = &done
	upd.Kind, upd.Owner = "wake", "other"
	if err := s.UpdateOperation(ctx, upd); err != nil {
		t.Fatal(err)
	}
	want := ops[0]
	want.Status, want.Error, want.FinishedAt = upd.Status, upd.Error, upd.FinishedAt
	ops[0] = want
	if got, _ := s.GetOperation(ctx, "op2"); !reflect.DeepEqual(got, want) {
		t.Errorf("after update got %+v, want %+v", got, want)
	}

	for _, tc := range []struct {
		name     string
		statuses []string
		want     []Operation
	}{
		{"all", nil, ops},
		{"one status", []string{"running"}, ops[1:2]},
		{"unfinished", []string{"pending", "running"}, ops[1:2]},
		{"failed in creation order", []string{"failed"}, []Operation{ops[0], ops[2]}},
		{"none match", []string{"succeeded"}, []Operation{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListOperations(ctx, tc.statuses...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
