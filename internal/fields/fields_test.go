package fields

import (
	"errors"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestPageTokens(t *testing.T) {
	tok := PageToken("sbxabc123")
	if id, err := After(tok, "sbx"); err != nil || id != "sbxabc123" {
		t.Fatalf("round trip: %q %v", id, err)
	}
	for _, bad := range []string{"x", PageToken("cmdabc123"), PageToken("sbx!"), "YWZ0ZXI6"} {
		if _, err := After(bad, "sbx"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("token %q: %v", bad, err)
		}
	}
	for _, n := range []int{-1, 1001} {
		if _, err := Limit(n); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("limit %d accepted", n)
		}
	}
}
