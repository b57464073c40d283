package bench

import (
	"math"
	"testing"
	"time"
)

func msDurations(vals ...int) []time.Duration {
	ds := make([]time.Duration, len(vals))
	for i, v := range vals {
		ds[i] = time.Duration(v) * time.Millisecond
	}
	return ds
}

func seq(n int) []time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	return ds
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value", msDurations(7), 50, 7 * time.Millisecond},
		{"one value p99", msDurations(7), 99, 7 * time.Millisecond},
		{"median of odd count", msDurations(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"median of even count is the lower middle", msDurations(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of five is the max", msDurations(1, 2, 3, 4, 5), 99, 5 * time.Millisecond},
		{"p100 is the max", msDurations(1, 2, 3), 100, 3 * time.Millisecond},
		{"tiny p is the min", msDurations(1, 2, 3), 0.001, 1 * time.Millisecond},
		// 0.99*200 in floating point is 198.00000000000003; the rank must still be 198.
		{"p99 of 200 is the 198th", seq(200), 99, 198 * time.Millisecond},
		{"p50 of 200 is the 100th", seq(200), 50, 100 * time.Millisecond},
		{"p99 of 100 is the 99th", seq(100), 99, 99 * time.Millisecond},
		{"p99 of 1000 is the 990th", seq(1000), 99, 990 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("percentile(%d values, %v) = %v, want %v", len(tt.sorted), tt.p, got, tt.want)
			}
		})
	}
}

func TestMs(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want float64
	}{
		{0, 0},
		{1234567 * time.Nanosecond, 1.234},
		{999 * time.Nanosecond, 0},
		{2 * time.Second, 2000},
		{1500 * time.Microsecond, 1.5},
	}
	for _, tt := range tests {
		if got := ms(tt.d); got != tt.want {
			t.Errorf("ms(%v) = %v, want %v", tt.d, got, tt.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []time.Duration
		want Measurement
	}{
		{"empty", nil, Measurement{}},
		{"unsorted", msDurations(5, 1, 4, 2, 3), Measurement{Runs: 5, Min: 1, P50: 3, P99: 5, Max: 5, Mean: 3}},
		{"microseconds kept", []time.Duration{1500 * time.Microsecond, 2500 * time.Microsecond},
			Measurement{Runs: 2, Min: 1.5, P50: 1.5, P99: 2.5, Max: 2.5, Mean: 2}},
		{"p99 of 200", seq(200), Measurement{Runs: 200, Min: 1, P50: 100, P99: 198, Max: 200, Mean: 100.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tt.in...)
			if got := summarize(tt.in); got != tt.want {
				t.Errorf("summarize = %+v, want %+v", got, tt.want)
			}
			for i := range in {
				if in[i] != tt.in[i] {
					t.Fatalf("summarize reordered its input")
				}
			}
		})
	}
}

func TestThroughput(t *testing.T) {
	tests := []struct {
		name string
		n    int64
		d    time.Duration
		want Measurement
	}{
		{"200 MiB in 2 s", 200 << 20, 2 * time.Second, Measurement{Bytes: 200 << 20, Seconds: 2, MiBPerS: 100}},
		{"1 MiB in 3 s rounds", 1 << 20, 3 * time.Second, Measurement{Bytes: 1 << 20, Seconds: 3, MiBPerS: 0.33}},
		{"zero time has no rate", 10, 0, Measurement{Bytes: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := throughput(tt.n, tt.d); got != tt.want {
				t.Errorf("throughput = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		name string
		a, b float64
		want float64
	}{
		{"equal", 3, 3, 1},
		{"slower", 10, 4, 2.5},
		{"four significant digits", 2, 3, 0.6667},
		{"large", 123456, 1, 123500},
		{"small", 1, 3000, 0.0003333},
		{"zero baseline", 5, 0, 0},
		{"zero airlock", 0, 5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ratio(tt.a, tt.b)
			if math.Abs(got-tt.want) > 1e-12*math.Max(1, math.Abs(tt.want)) {
				t.Errorf("ratio(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
		})
	}
}
