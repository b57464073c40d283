package cli

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestParseSize(t *testing.T) {
	good := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"4096", 4096},
		{"10B", 10},
		{"512MiB", 512 << 20},
		{"2GiB", 2 << 30},
		{"2gib", 2 << 30},
		{"2G", 2 << 30},
		{"3 GiB", 3 << 30},
		{" 1TiB ", 1 << 40},
		{"64k", 64 << 10},
		{"0MiB", 0},
		{"9223372036854775807", math.MaxInt64},
		{"8388607TiB", 8388607 << 40},
	}
	for _, tc := range good {
		got, err := parseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	bad := []struct {
		name, in, want string
	}{
		{"empty", "", "not a size"},
		{"negative", "-1", "not a size"},
		{"negative with unit", "-2GiB", "not a size"},
		{"plus sign", "+2GiB", "not a size"},
		{"garbage", "lots", "not a size"},
		{"unit only", "GiB", "not a size"},
		{"unknown unit", "2GB", "not a size"},
		{"decimal unit", "2 gigabytes", "not a size"},
		{"fraction", "1.5GiB", "not a size"},
		{"hex", "0x10", "not a size"},
		{"trailing junk", "2GiBx", "not a size"},
		{"two numbers", "2 2", "not a size"},
		{"overflow int64", "9223372036854775808", "too large"},
		{"overflow digits", "99999999999999999999999", "too large"},
		{"overflow with unit", "8388608TiB", "too large"},
		{"overflow GiB", "9999999999GiB", "too large"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSize(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseSize(%q) = %d, %v; want an error saying %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestFormatSizeRoundTrips(t *testing.T) {
	for _, n := range []int64{0, 1, 1023, 1024, 2 << 30, 512 << 20, 3<<40 + 1<<30, 5 << 40, math.MaxInt64} {
		s := formatSize(n)
		back, err := parseSize(s)
		if err != nil || back != n {
			t.Errorf("formatSize(%d) = %q, read back as %d, %v", n, s, back, err)
		}
	}
	if s := formatSize(2 << 30); s != "2GiB" {
		t.Errorf("formatSize(2 GiB) = %q", s)
	}
}

// A bad --min-free-disk is a bad flag: exit status 2, one line naming it,
// before the server opens anything.
func TestServeMinFreeDiskFlag(t *testing.T) {
	for _, v := range []string{"-1GiB", "plenty", "99999999999TiB"} {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		err := Run(t.Context(), env, []string{"serve", "--listen", "127.0.0.1:0", "--min-free-disk", v})
		if !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 || !strings.Contains(Message(err), "min-free-disk") ||
			strings.Contains(Message(err), "\n") {
			t.Errorf("--min-free-disk %s: exit %d, %v", v, ExitCode(err), err)
		}
	}
}
