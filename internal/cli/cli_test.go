package cli

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestExpandShortFlags(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"combined", []string{"-it", "--", "bash"}, []string{"-i", "-t", "--", "bash"}},
		{"separate", []string{"-i", "-t", "--", "bash"}, []string{"-i", "-t", "--", "bash"}},
		{"after a value", []string{"-e", "A=1", "-ti", "--", "sh"}, []string{"-e", "A=1", "-t", "-i", "--", "sh"}},
		{"not after --", []string{"--", "ls", "-it"}, []string{"--", "ls", "-it"}},
		{"other letters stay", []string{"-iw", "/x"}, []string{"-iw", "/x"}},
		{"long flags stay", []string{"--template", "tiny"}, []string{"--template", "tiny"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := expandShortFlags(tc.in, "it"); !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"command status", &ExitError{Code: 42}, 42},
		{"help", flag.ErrHelp, 0},
		{"bad input", fmt.Errorf("x: %w", errdefs.ErrInvalid), 2},
		{"not set up", fmt.Errorf("x: %w", errdefs.ErrPrecondition), 2},
		{"unknown template", fmt.Errorf("x: %w", errdefs.ErrNotFound), 2},
		{"internal", errors.New("boom"), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestEnvFlags(t *testing.T) {
	e := envFlags{}
	for _, bad := range []string{"NOEQUALS", "=value"} {
		if err := e.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if err := e.Set("A=b=c"); err != nil || e["A"] != "b=c" {
		t.Fatalf("Set(A=b=c): %v %q", err, e["A"])
	}
}

func TestMessage(t *testing.T) {
	err := fmt.Errorf("vcpus 99 is out of bounds: use 1 to 2: %w", errdefs.ErrInvalid)
	if got, want := Message(err), "vcpus 99 is out of bounds: use 1 to 2"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := Message(errors.New("boom")); got != "boom" {
		t.Fatalf("got %q", got)
	}
}
