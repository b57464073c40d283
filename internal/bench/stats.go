package bench

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/airlockhq/airlock/internal/timings"
)

// percentile returns the p-th percentile (0 < p <= 100) of sorted, which
// must be in ascending order, by the nearest-rank method: the smallest value
// that at least p percent of the values do not exceed. It returns 0 for no
// values.
func percentile[T cmp.Ordered](sorted []T, p float64) T {
	n := len(sorted)
	if n == 0 {
		var zero T
		return zero
	}
	// p*n before the division keeps whole ranks exact (0.99*200 is not 198).
	rank := int(math.Ceil(p * float64(n) / 100))
	rank = max(1, min(rank, n))
	return sorted[rank-1]
}

// ms converts d to milliseconds, keeping microsecond precision.
func ms(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}

// summarize turns the durations of repeated runs into a timing Measurement.
func summarize(ds []time.Duration) Measurement {
	if len(ds) == 0 {
		return Measurement{}
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	return Measurement{
		Runs: len(sorted),
		Min:  ms(sorted[0]),
		P50:  ms(percentile(sorted, 50)),
		P99:  ms(percentile(sorted, 99)),
		Max:  ms(sorted[len(sorted)-1]),
		Mean: ms(sum / time.Duration(len(sorted))),
	}
}

// summarizeRates turns rates, one per sample, into a Measurement with
// three decimal places.
func summarizeRates(rates []float64) Measurement {
	if len(rates) == 0 {
		return Measurement{}
	}
	sorted := slices.Clone(rates)
	slices.Sort(sorted)
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	return Measurement{
		Runs: len(sorted),
		Min:  roundTo(sorted[0], 3),
		P50:  roundTo(percentile(sorted, 50), 3),
		P99:  roundTo(percentile(sorted, 99), 3),
		Max:  roundTo(sorted[len(sorted)-1], 3),
		Mean: roundTo(sum/float64(len(sorted)), 3),
	}
}

// summarizeKiB turns sizes in KiB, one per sample, into a Measurement in
// MiB with KiB precision.
func summarizeKiB(kibs []int64) Measurement {
	if len(kibs) == 0 {
		return Measurement{}
	}
	sorted := slices.Clone(kibs)
	slices.Sort(sorted)
	var sum int64
	for _, k := range sorted {
		sum += k
	}
	mib := func(kib int64) float64 { return roundTo(float64(kib)/1024, 3) }
	return Measurement{
		Runs: len(sorted),
		Min:  mib(sorted[0]),
		P50:  mib(percentile(sorted, 50)),
		P99:  mib(percentile(sorted, 99)),
		Max:  mib(sorted[len(sorted)-1]),
		Mean: roundTo(float64(sum)/float64(len(sorted))/1024, 3),
	}
}

// throughput describes n bytes moved in d.
func throughput(n int64, d time.Duration) Measurement {
	m := Measurement{Bytes: n, Seconds: roundTo(d.Seconds(), 6)}
	if d > 0 {
		m.MiBPerS = roundTo(float64(n)/(1<<20)/d.Seconds(), 2)
	}
	return m
}

// ratio is a/b to four significant digits, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return roundSig(a/b, 4)
}

// roundTo rounds x to the given number of decimal places.
func roundTo(x float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(x*p) / p
}

// roundSig rounds x to the given number of significant digits.
func roundSig(x float64, digits int) float64 {
	if x == 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return x
	}
	mag := int(math.Floor(math.Log10(math.Abs(x))))
	return roundTo(x, digits-1-mag)
}

// stepP50s is the p50 (nearest-rank) of each step across samples, the
// steps in the order they first appear. A step only some samples have
// (a failed clone before a boot, say) is the p50 of those that have it.
// No samples is no steps.
func stepP50s(samples []timings.Timings) timings.Timings {
	var out timings.Timings
	var names []string
	for _, t := range samples {
		for _, s := range t {
			if !slices.Contains(names, s.Name) {
				names = append(names, s.Name)
			}
		}
	}
	for _, n := range names {
		var vs []float64
		for _, t := range samples {
			if v, ok := t.Get(n); ok {
				vs = append(vs, v)
			}
		}
		slices.Sort(vs)
		out = append(out, timings.Step{Name: n, MS: roundTo(percentile(vs, 50), 3)})
	}
	return out
}

// stepTimings is the Result.Timings of a scenario whose sides recorded
// the steps of their samples; nil when neither did.
func stepTimings(airlock, baseline []timings.Timings) *StepTimings {
	if len(airlock) == 0 && len(baseline) == 0 {
		return nil
	}
	return &StepTimings{Airlock: stepP50s(airlock), Baseline: stepP50s(baseline)}
}
