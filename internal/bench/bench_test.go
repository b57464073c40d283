package bench

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestConfigValidate(t *testing.T) {
	dir := datadir.Dir{Root: "/nonexistent/airlock"}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // empty: valid
	}{
		{"zero values take defaults", Config{Dir: dir, KubeBin: "/kube"}, ""},
		{"everything set", Config{Dir: dir, Accel: "tcg", Template: "base", BootRuns: 1, ExecRuns: 1, ThroughputMiB: 1,
			Scenarios: []string{ScenarioThroughput, ScenarioBoot}, BootTimeout: time.Second}, ""},
		{"all scenarios by name", Config{Dir: dir, KubeBin: "/kube", Scenarios: Scenarios()}, ""},
		// A run of every scenario skips the cluster_ ones (skip_test.go).
		{"all scenarios without the Kubernetes binaries", Config{Dir: dir}, ""},
		{"all scenarios by name without them", Config{Dir: dir, Scenarios: Scenarios()}, "scenario cluster_create_to_first_output runs a local cluster"},
		{"a cluster scenario without them", Config{Dir: dir, Scenarios: []string{ScenarioClusterCreates}}, "scenario cluster_creates_per_second runs a local cluster"},
		{"no data directory", Config{}, "data directory is required"},
		{"negative boot runs", Config{Dir: dir, BootRuns: -1}, "boot runs must not be negative"},
		{"negative exec runs", Config{Dir: dir, ExecRuns: -5}, "exec runs must not be negative"},
		{"negative throughput", Config{Dir: dir, ThroughputMiB: -1}, "throughput MiB must not be negative"},
		{"huge throughput", Config{Dir: dir, ThroughputMiB: 1<<20 + 1}, "above the limit"},
		{"negative boot timeout", Config{Dir: dir, BootTimeout: -time.Second}, "boot timeout"},
		{"negative pause runs", Config{Dir: dir, PauseRuns: -1}, "pause runs must not be negative"},
		{"negative suspend runs", Config{Dir: dir, SuspendRuns: -1}, "suspend runs must not be negative"},
		{"negative fork runs", Config{Dir: dir, ForkRuns: -1}, "fork runs must not be negative"},
		{"negative sandboxes", Config{Dir: dir, Sandboxes: -1}, "sandboxes must not be negative"},
		{"too many sandboxes", Config{Dir: dir, Sandboxes: 201}, "sandboxes 201 is above the limit"},
		{"negative snapshot runs", Config{Dir: dir, SnapshotRuns: -2}, "snapshot runs must not be negative"},
		{"lifecycle and fleet set", Config{Dir: dir, PauseRuns: 1, SuspendRuns: 1, Sandboxes: 200,
			SnapshotRuns: 1, Scenarios: []string{ScenarioPause, ScenarioSuspend, ScenarioIdlePSS, ScenarioConcurrent, ScenarioSnapshot}}, ""},
		{"unknown accelerator", Config{Dir: dir, Accel: "hvf"}, `accelerator "hvf"`},
		{"unknown scenario", Config{Dir: dir, Scenarios: []string{"boot", "fork"}}, `unknown scenario "fork"`},
		{"several problems at once", Config{Dir: dir, BootRuns: -1, Scenarios: []string{"x"}}, "boot runs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate() = %q, want it to contain %q", err, tt.wantErr)
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Validate() = %v, want it to wrap errdefs.ErrInvalid", err)
			}
		})
	}
}

func TestWithDefaults(t *testing.T) {
	c := Config{Dir: datadir.Dir{Root: "/x"}}.withDefaults()
	if c.Accel != "auto" || c.Template != DefaultTemplate || c.BootRuns != DefaultBootRuns ||
		c.ExecRuns != DefaultExecRuns || c.ThroughputMiB != DefaultThroughputMiB ||
		c.PauseRuns != DefaultPauseRuns || c.SuspendRuns != DefaultSuspendRuns || c.ForkRuns != DefaultForkRuns || c.Sandboxes != DefaultSandboxes ||
		c.SnapshotRuns != DefaultSnapshotRuns ||
		c.BootTimeout != DefaultBootTimeout || c.Progress == nil || c.Log == nil {
		t.Errorf("withDefaults left a zero field: %+v", c)
	}
	set := Config{Accel: "kvm", Template: "base", BootRuns: 2, ExecRuns: 3, ThroughputMiB: 4, BootTimeout: time.Second,
		PauseRuns: 5, SuspendRuns: 6, Sandboxes: 7, SnapshotRuns: 8}.withDefaults()
	if set.Accel != "kvm" || set.Template != "base" || set.BootRuns != 2 || set.ExecRuns != 3 ||
		set.ThroughputMiB != 4 || set.BootTimeout != time.Second || set.PauseRuns != 5 || set.SuspendRuns != 6 ||
		set.Sandboxes != 7 || set.SnapshotRuns != 8 {
		t.Errorf("withDefaults overrode a set field: %+v", set)
	}
}

func TestSelected(t *testing.T) {
	all := Config{}
	some := Config{Scenarios: []string{ScenarioExecRTT}}
	for _, s := range Scenarios() {
		if !all.selected(s) {
			t.Errorf("empty selection does not select %s", s)
		}
		if got, want := some.selected(s), s == ScenarioExecRTT; got != want {
			t.Errorf("selection [exec_rtt]: selected(%s) = %v, want %v", s, got, want)
		}
	}
}

func TestRunRejectsInvalidConfigBeforeStarting(t *testing.T) {
	// The data directory does not exist: reaching the runtime would fail
	// with another error class.
	_, err := Run(context.Background(), Config{Dir: datadir.Dir{Root: t.TempDir()}, ExecRuns: -1})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Run = %v, want errdefs.ErrInvalid", err)
	}
}

// fakeMeasure returns a measure that records its calls in log under name
// and takes d, or fails on call failOn (from 1).
func fakeMeasure(log *[]string, name string, d time.Duration, failOn int) measure {
	calls := 0
	return func(ctx context.Context) (time.Duration, error) {
		calls++
		*log = append(*log, name)
		if calls == failOn {
			return 0, errors.New(name + " broke")
		}
		return d, nil
	}
}

func TestTimePairs(t *testing.T) {
	t.Run("alternates and reports every pair", func(t *testing.T) {
		var log []string
		var steps []int
		as, bs, err := timePairs(context.Background(), 3,
			fakeMeasure(&log, "a", time.Millisecond, 0), fakeMeasure(&log, "b", 2*time.Millisecond, 0),
			func(i int, da, db time.Duration) {
				steps = append(steps, i)
				if da != time.Millisecond || db != 2*time.Millisecond {
					t.Errorf("step %d got %v, %v", i, da, db)
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(log, ""); got != "ababab" {
			t.Errorf("call order %q, want ababab", got)
		}
		if len(as) != 3 || len(bs) != 3 || as[0] != time.Millisecond || bs[2] != 2*time.Millisecond {
			t.Errorf("durations %v %v", as, bs)
		}
		if len(steps) != 3 || steps[2] != 3 {
			t.Errorf("steps %v, want [1 2 3]", steps)
		}
	})
	t.Run("stops at the first error", func(t *testing.T) {
		var log []string
		_, _, err := timePairs(context.Background(), 5,
			fakeMeasure(&log, "a", 0, 0), fakeMeasure(&log, "b", 0, 2), nil)
		if err == nil || !strings.Contains(err.Error(), "baseline run 2: b broke") {
			t.Fatalf("err = %v, want baseline run 2 to fail", err)
		}
		if got := strings.Join(log, ""); got != "abab" {
			t.Errorf("call order %q, want abab", got)
		}
	})
	t.Run("stops when the context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var log []string
		a := func(ctx context.Context) (time.Duration, error) {
			log = append(log, "a")
			cancel()
			return 0, nil
		}
		_, _, err := timePairs(ctx, 5, a, fakeMeasure(&log, "b", 0, 0), nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if got := strings.Join(log, ""); got != "ab" {
			t.Errorf("call order %q, want ab", got)
		}
	})
}

func TestTimed(t *testing.T) {
	d, err := timed(func(context.Context) error {
		time.Sleep(5 * time.Millisecond)
		return nil
	})(context.Background())
	if err != nil || d < 5*time.Millisecond {
		t.Errorf("timed = %v, %v; want at least 5ms and no error", d, err)
	}
	want := errors.New("boom")
	if _, err := timed(func(context.Context) error { return want })(context.Background()); !errors.Is(err, want) {
		t.Errorf("timed error = %v, want %v", err, want)
	}
}

func TestStream(t *testing.T) {
	write := func(n int) func(context.Context, io.Writer) error {
		return func(_ context.Context, w io.Writer) error {
			buf := make([]byte, 1000)
			for n := n; n > 0; {
				k := min(n, len(buf))
				if _, err := w.Write(buf[:k]); err != nil {
					return err
				}
				n -= k
			}
			return nil
		}
	}
	t.Run("exact count", func(t *testing.T) {
		m, err := stream(context.Background(), 3, 4500, write(4500))
		if err != nil {
			t.Fatal(err)
		}
		if m.Bytes != 4500 || m.Runs != 3 {
			t.Errorf("measurement %+v", m)
		}
	})
	for _, n := range []int{4499, 4501, 0} {
		if _, err := stream(context.Background(), 1, 4500, write(n)); err == nil {
			t.Errorf("%d bytes of 4500 passed", n)
		}
	}
	want := errors.New("exec failed")
	if _, err := stream(context.Background(), 1, 1, func(context.Context, io.Writer) error { return want }); !errors.Is(err, want) {
		t.Errorf("error = %v, want %v", err, want)
	}
	t.Run("median run counts", func(t *testing.T) {
		sleeps := []time.Duration{30 * time.Millisecond, 1 * time.Millisecond, 10 * time.Millisecond}
		i := 0
		m, err := stream(context.Background(), 3, 1<<20, func(ctx context.Context, w io.Writer) error {
			time.Sleep(sleeps[i])
			i++
			return write(1<<20)(ctx, w)
		})
		if err != nil {
			t.Fatal(err)
		}
		if m.Seconds < 0.010 || m.Seconds >= 0.030 {
			t.Errorf("seconds = %v, want the median run's (10 ms and a bit)", m.Seconds)
		}
	})
	t.Run("a short run fails the whole", func(t *testing.T) {
		i := 0
		_, err := stream(context.Background(), 3, 100, func(ctx context.Context, w io.Writer) error {
			i++
			if i == 2 {
				return write(99)(ctx, w)
			}
			return write(100)(ctx, w)
		})
		if err == nil {
			t.Error("a run with 99 of 100 bytes passed")
		}
	})
}

func TestRetrying(t *testing.T) {
	failThen := func(fails int) measure {
		calls := 0
		return func(context.Context) (time.Duration, error) {
			calls++
			if calls <= fails {
				return 0, errors.New("no boot")
			}
			return time.Second, nil
		}
	}
	tests := []struct {
		name         string
		fails        int
		wantErr      bool
		wantFailures int
	}{
		{"first try", 0, false, 0},
		{"retried once", 1, false, 1},
		{"retried up to the limit", 2, false, 2},
		{"gives up at the limit", 3, true, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failures, reported := 0, 0
			d, err := retrying(failThen(tt.fails), 3, &failures, func(error) { reported++ })(context.Background())
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr && d != time.Second {
				t.Errorf("duration %v, want the successful run's", d)
			}
			if failures != tt.wantFailures {
				t.Errorf("failures = %d, want %d", failures, tt.wantFailures)
			}
			if want := min(tt.wantFailures, 2); reported != want {
				t.Errorf("onFail called %d times, want %d (not for the last, fatal one)", reported, want)
			}
		})
	}
	t.Run("failures add up across calls", func(t *testing.T) {
		failures := 0
		m := retrying(failThen(1), 2, &failures, func(error) {})
		if _, err := m(context.Background()); err != nil {
			t.Fatal(err)
		}
		broken := retrying(failThen(99), 2, &failures, func(error) {})
		if _, err := broken(context.Background()); err == nil || failures != 2 {
			t.Fatalf("err = %v with %d failures, want to give up at 2", err, failures)
		}
	})
	t.Run("no retry once the context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		failures := 0
		if _, err := retrying(failThen(1), 3, &failures, func(error) {})(ctx); err == nil || failures != 0 {
			t.Errorf("err = %v, failures = %d; want the error and no retry", err, failures)
		}
	})
}

func TestStreamArgv(t *testing.T) {
	got := strings.Join(streamArgv(200<<20), " ")
	if want := "dd if=/dev/zero bs=65536 count=3200 status=none"; got != want {
		t.Errorf("streamArgv = %q, want %q", got, want)
	}
}

// The host side of stdout_throughput, on a real pipe: it must count every
// byte the command writes.
func TestStreamOnHost(t *testing.T) {
	const size = 3 << 20
	argv := streamArgv(size)
	m, err := stream(context.Background(), 2, size, func(ctx context.Context, w io.Writer) error {
		return runOnHost(ctx, argv, w)
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.Bytes != size || m.Runs != 2 || m.MiBPerS <= 0 || m.Seconds <= 0 {
		t.Errorf("measurement %+v", m)
	}
	if err := runOnHost(context.Background(), []string{"sh", "-c", "echo nope >&2; exit 3"}, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "nope") {
		t.Errorf("a failing command gave %v, want an error quoting its stderr", err)
	}
}

// docs/bench.md's scenario table has a row for every scenario, and none
// for a scenario that is not one.
func TestDocsTableListsEveryScenario(t *testing.T) {
	b, err := os.ReadFile("../../docs/bench.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" && len(rows) > 0 {
			break // the end of the first table
		}
		if name, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ = strings.Cut(name, "`")
			rows = append(rows, name)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(rows)), slices.Sorted(slices.Values(Scenarios()))) {
		t.Errorf("docs/bench.md's scenario table lists %v, want every scenario: %v", rows, Scenarios())
	}
}
