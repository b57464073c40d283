package textcheck

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestField(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		at    int
	}{
		{"plain path", "/srv/app", -1},
		{"unicode", "/home/zoë/日本", -1},
		{"bang is text", "!id", -1},
		{"empty", "", -1},
		{"newline", "/x\n!id>/tmp/p", 2},
		{"carriage return", "/x\r", 2},
		{"NUL", "a\x00", 1},
		{"tab", "a\tb", 1},
		{"escape", "\x1b[2J", 0},
		{"DEL", "a\x7f", 1},
		{"C1 next line", "a\u0085b", 1},
		{"invalid UTF-8", "a\xffb", 1},
		{"long and clean", strings.Repeat("a", 64<<10), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Control(tc.value); got != tc.at {
				t.Fatalf("Control(%q) = %d, want %d", tc.value, got, tc.at)
			}
			err := Field("workdir", tc.value)
			if (err != nil) != (tc.at >= 0) {
				t.Fatalf("Field(%q) = %v", tc.value, err)
			}
			if err != nil && (!errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), "workdir ")) {
				t.Fatalf("Field(%q) = %v: want ErrInvalid naming the field", tc.value, err)
			}
		})
	}
}
