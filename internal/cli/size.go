package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the units parseSize takes, by their lower-case names:
// binary multiples only, so that "2G" cannot mean 2·10⁹ to one reader and
// 2³¹ to another.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tib": 1 << 40,
}

// parseSize reads a size in bytes written as a whole number with an
// optional binary unit: "0", "4096", "512MiB", "2GiB", "1t" (B, K/KiB,
// M/MiB, G/GiB, T/TiB, in any case, with or without a space before it).
// Negative numbers, fractions, other units and sizes past what an int64
// holds are refused.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	digits := len(t) - len(strings.TrimLeft(t, "0123456789"))
	num, unit := t[:digits], strings.ToLower(strings.TrimSpace(t[digits:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("%q is not a size: write a whole number with an optional unit, like 0, 512MiB or 2GiB", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large a size", s)
	}
	return n * mult, nil
}

// formatSize is n bytes in the largest binary unit that divides it, the
// form parseSize reads back.
func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// sizeFlag is a flag.Value holding a size in bytes, given as parseSize
// reads it.
type sizeFlag int64

func (f *sizeFlag) String() string {
	if f == nil {
		return "0"
	}
	return formatSize(int64(*f))
}

func (f *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*f = sizeFlag(n)
	return nil
}
