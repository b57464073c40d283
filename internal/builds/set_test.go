package builds

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// TestSet: a set refuses builds past its bound, keeps what its builds pin
// and read, and hands out no more slots than it has.
func TestSet(t *testing.T) {
	s := NewSet(1, 2)
	a := &Run{Rec: store.Build{ID: "a"}, Contexts: []string{"ctx1"}}
	b := &Run{Rec: store.Build{ID: "b"}}
	for _, r := range []*Run{a, b} {
		if err := s.Add(r); err != nil {
			t.Fatalf("add %s: %v", r.Rec.ID, err)
		}
	}
	if err := s.Add(&Run{Rec: store.Build{ID: "c"}}); !errors.Is(err, errdefs.ErrExhausted) {
		t.Fatalf("a third build: %v, want ErrExhausted", err)
	}
	s.Pin(a, "d1")
	var since time.Time
	if _, err := s.Store(b, func() (template.Template, error) {
		since = s.Kept(map[string]bool{})
		return template.Template{Digest: "d2"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if since.IsZero() {
		t.Errorf("a store in progress is not reported")
	}
	keep := map[string]bool{}
	if got := s.Kept(keep); !got.IsZero() || !keep["d1"] || !keep["d2"] {
		t.Errorf("kept %v since %v, want d1 and d2 and no store in progress", keep, got)
	}
	if got := s.Contexts(); !got["ctx1"] || len(got) != 1 {
		t.Errorf("contexts in use %v, want ctx1", got)
	}
	conflict := errors.New("in use")
	if err := s.Each(func(r *Run) error {
		if r.Rec.ID == "b" {
			return conflict
		}
		return nil
	}, func() error { t.Error("then ran after a refusal"); return nil }); err != conflict {
		t.Errorf("each: %v, want the refusal", err)
	}
	s.Remove("b")
	if s.Get("b") != nil || s.Get("a") != a {
		t.Errorf("remove b: b %v, a %v", s.Get("b"), s.Get("a"))
	}

	release, err := s.Slot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Slot(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a second slot of one: %v, want to wait until the context ends", err)
	}
	release()
	if release, err = s.Slot(context.Background()); err != nil {
		t.Fatal(err)
	}
	release()
}
