package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// A webhook round-trips; its lease is one server's at a time; settling
// records the cursor and the attempt and lets the lease go; a delete
// takes its deliveries with it.
func testWebhooks(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, racers)
	s := stores[0]
	w := Webhook{ID: "whk1", Owner: "key1", AllOwners: true, URL: "https://example.com/hook", Types: []string{"sandbox.*"},
		Secret: []byte{1, 2, 3}, AfterSeq: 7}
	if err := s.InsertWebhook(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertWebhook(ctx, w); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a taken ID: %v", err)
	}
	got, err := s.GetWebhook(ctx, "whk1")
	if err != nil || got.URL != w.URL || !got.AllOwners || !slices.Equal(got.Types, w.Types) || got.AfterSeq != 7 || string(got.Secret) != "\x01\x02\x03" || got.CreatedAt.IsZero() {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if err := s.InsertWebhook(ctx, Webhook{ID: "whk2", Owner: "key2", URL: "https://example.org/"}); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListWebhooks(ctx, "key2", 10); err != nil || len(l) != 1 || l[0].ID != "whk2" || l[0].Types == nil {
		t.Fatalf("key2's webhooks: %+v, %v", l, err)
	}

	now := time.Now()
	won := 0
	for _, err := range race(t, stores, func(s *Store) error {
		ok, err := s.LeaseWebhook(ctx, "whk1", now, now.Add(time.Minute))
		if ok {
			return nil
		}
		if err == nil {
			err = errdefs.ErrConflict
		}
		return err
	}) {
		if err == nil {
			won++
		} else if !errors.Is(err, errdefs.ErrConflict) {
			t.Fatal(err)
		}
	}
	if won != 1 {
		t.Fatalf("%d servers leased one webhook at once", won)
	}
	if due, err := s.DueWebhooks(ctx, now, 10); err != nil || len(due) != 1 || due[0].ID != "whk2" {
		t.Fatalf("due while whk1 is leased: %+v, %v", due, err)
	}
	got.Attempts, got.FailingSince, got.NextAt = 2, now, now.Add(time.Hour)
	if err := s.SettleWebhook(ctx, got, Delivery{ID: "dlv1", EventID: "evt1", EventType: "sandbox.created", Attempt: 2, Status: 500, Error: "boom", DurationMS: 3}); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueWebhooks(ctx, now, 10); len(due) != 1 {
		t.Fatalf("due before its next attempt: %+v", due)
	}
	if due, _ := s.DueWebhooks(ctx, now.Add(2*time.Hour), 10); len(due) != 2 {
		t.Fatalf("due after its next attempt: %+v", due)
	}
	if ok, err := s.LeaseWebhook(ctx, "whk1", now, now.Add(time.Minute)); err != nil || !ok {
		t.Fatalf("lease after a settle: %v, %v", ok, err)
	}
	ds, err := s.ListDeliveries(ctx, "whk1", 10)
	if err != nil || len(ds) != 1 || ds[0].Status != 500 || ds[0].Error != "boom" || ds[0].Attempt != 2 {
		t.Fatalf("deliveries: %+v, %v", ds, err)
	}
	if err := s.DeleteWebhook(ctx, "whk1"); err != nil {
		t.Fatal(err)
	}
	if err := s.SettleWebhook(ctx, got, Delivery{ID: "dlv2"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("settle of a deleted webhook: %v", err)
	}
	if ds, err := s.ListDeliveries(ctx, "whk1", 10); err != nil || len(ds) != 0 {
		t.Fatalf("deliveries after the delete: %+v, %v", ds, err)
	}
	if err := s.DeleteWebhook(ctx, "whk1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a second delete: %v", err)
	}
}
