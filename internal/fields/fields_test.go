package fields

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
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

// An ID names directories and files: one that could climb out of them,
// end early or run long is refused like an unknown one.
func TestID(t *testing.T) {
	if err := ID("sandbox", "sbx", ids.New("sbx")); err != nil {
		t.Fatalf("a made ID: %v", err)
	}
	long := "sbx" + strings.Repeat("a", 61) // 64 bytes
	for _, bad := range []string{"", "sbx/../x", "sbx..", "sbx\x00a", "SBXabc", "cmdabc", "sbxa b", long, long + strings.Repeat("a", 5000)} {
		if err := ID("sandbox", "sbx", bad); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("ID %.40q: %v, want not found", bad, err)
		}
	}
	if err := ID("sandbox", "sbx", long[:63]); err != nil {
		t.Errorf("a 63-byte ID: %v", err)
	}
}
