package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/guest"
)

func TestAPIScenariosSelectable(t *testing.T) {
	all := Scenarios()
	for _, name := range []string{ScenarioAPICreate, ScenarioAPIExecRTT, ScenarioAPILimits} {
		if !slices.Contains(all, name) {
			t.Errorf("Scenarios() = %v, want it to hold %s", all, name)
		}
	}
	if want := []string{"api_create_to_first_output", "api_exec_rtt", "api_limits_create"}; !slices.Equal(all[len(all)-3:], want) {
		t.Errorf("Scenarios() ends %v, want the API scenarios last: %v", all[len(all)-3:], want)
	}
	dir := datadir.Dir{Root: "/nonexistent/airlock"}
	tests := []struct {
		name    string
		only    []string
		wantErr bool
	}{
		{"create alone", []string{ScenarioAPICreate}, false},
		{"exec alone", []string{ScenarioAPIExecRTT}, false},
		{"both with another", []string{ScenarioAPIExecRTT, ScenarioBoot, ScenarioAPICreate}, false},
		{"a near miss", []string{"api_create"}, true},
		{"the prefix alone", []string{"api"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Dir: dir, Scenarios: tt.only}
			err := cfg.Validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate() = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Validate() = %v, want errdefs.ErrInvalid", err)
			}
			if err != nil {
				return
			}
			for _, s := range Scenarios() {
				if got, want := cfg.selected(s), slices.Contains(tt.only, s); got != want {
					t.Errorf("selected(%s) = %v, want %v", s, got, want)
				}
			}
		})
	}
}

func TestAPIRunsConfig(t *testing.T) {
	dir := datadir.Dir{Root: "/x"}
	if got := (Config{Dir: dir}).withDefaults().APIRuns; got != DefaultAPIRuns {
		t.Errorf("default APIRuns = %d, want %d", got, DefaultAPIRuns)
	}
	if got := (Config{Dir: dir, APIRuns: 2}).withDefaults().APIRuns; got != 2 {
		t.Errorf("APIRuns 2 became %d", got)
	}
	err := (&Config{Dir: dir, APIRuns: -1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "api runs must not be negative") || !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Validate(APIRuns -1) = %v, want an invalid api runs", err)
	}
}

func TestTimeRounds(t *testing.T) {
	t.Run("takes turns and keeps each side's durations", func(t *testing.T) {
		var log []string
		var rounds int
		ds, err := timeRounds(context.Background(), 2, []side{
			{"a run", fakeMeasure(&log, "a", 1*time.Millisecond, 0)},
			{"b run", fakeMeasure(&log, "b", 2*time.Millisecond, 0)},
			{"c run", fakeMeasure(&log, "c", 3*time.Millisecond, 0)},
		}, func(i int, round []time.Duration) {
			rounds = i
			if !slices.Equal(round, []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}) {
				t.Errorf("round %d durations %v", i, round)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(log, ""); got != "abcabc" {
			t.Errorf("call order %q, want abcabc", got)
		}
		if rounds != 2 || len(ds) != 3 || len(ds[2]) != 2 || ds[2][1] != 3*time.Millisecond {
			t.Errorf("rounds %d, durations %v", rounds, ds)
		}
	})
	t.Run("names the side that failed", func(t *testing.T) {
		var log []string
		_, err := timeRounds(context.Background(), 3, []side{
			{"api exec run", fakeMeasure(&log, "a", 0, 0)},
			{"command session run", fakeMeasure(&log, "b", 0, 2)},
			{"baseline run", fakeMeasure(&log, "c", 0, 0)},
		}, nil)
		if err == nil || err.Error() != "command session run 2: b broke" {
			t.Fatalf("err = %v, want the session's second run to fail", err)
		}
		if got := strings.Join(log, ""); got != "abcab" {
			t.Errorf("call order %q, want abcab", got)
		}
	})
}

// sseStream is an attach stream that yields the given SSE text.
func sseStream(text string) *apiclient.EventStream {
	return apiclient.NewEventStream(io.NopCloser(strings.NewReader(text)))
}

func TestUntilStdout(t *testing.T) {
	tests := []struct {
		name    string
		events  string
		wantErr string // empty: it finds output
		rest    string // the next event's name after a success
	}{
		{"output after start", "event: start\ndata: {\"pid\":7}\n\n: ping\n\nid: 2\nevent: stdout\ndata: {\"data\":\"aGkK\"}\n\nevent: exit\ndata: {}\n\n", "", "exit"},
		{"stderr first", "event: stderr\ndata: {\"data\":\"eA==\"}\n\nevent: stdout\ndata: {\"data\":\"aGkK\"}\n\nevent: exit\ndata: {}\n\n", "", "exit"},
		{"empty output does not count", "event: stdout\ndata: {\"data\":\"\"}\n\nevent: stdout\ndata: {\"data\":\"aA==\"}\n\nevent: exit\ndata: {}\n\n", "", "exit"},
		{"exit first", "event: start\ndata: {}\n\nevent: exit\ndata: {\"exit_code\":1}\n\n", `exited without writing to stdout: {"exit_code":1}`, ""},
		{"stream ends", "event: start\ndata: {}\n\n", "before any output: EOF", ""},
		{"bad stdout event", "event: stdout\ndata: nope\n\n", "decode a stdout event", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := sseStream(tt.events)
			err := untilStdout(st)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("untilStdout = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("untilStdout = %v", err)
			}
			if ev, err := st.Next(); err != nil || ev.Name != tt.rest {
				t.Errorf("next event %+v, %v; want %s: untilStdout read past the first output", ev, err, tt.rest)
			}
		})
	}
}

func TestUntilExit(t *testing.T) {
	tests := []struct {
		name    string
		events  string
		wantErr string // empty: a clean exit
	}{
		{"clean exit", "event: stdout\ndata: {\"data\":\"aGkK\"}\n\nevent: exit\ndata: {\"exit_code\":0,\"signal\":null,\"timed_out\":false}\n\n", ""},
		{"exit status", "event: stderr\ndata: {\"data\":\"bm8gc3VjaCBmaWxl\"}\n\nevent: exit\ndata: {\"exit_code\":2}\n\n", "no such file"},
		{"killed", "event: exit\ndata: {\"exit_code\":0,\"signal\":\"KILL\"}\n\n", `"signal":"KILL"`},
		{"timed out", "event: exit\ndata: {\"exit_code\":0,\"timed_out\":true}\n\n", "timed_out"},
		{"stream ends", "event: stdout\ndata: {\"data\":\"aGkK\"}\n\n", "before its exit: EOF"},
		{"bad exit event", "event: exit\ndata: [\n\n", "decode its exit event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := untilExit(sseStream(tt.events))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("untilExit = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("untilExit = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestFirstWrite(t *testing.T) {
	f := newFirstWrite()
	if n, err := f.Write(nil); n != 0 || err != nil {
		t.Fatalf("Write(nil) = %d, %v", n, err)
	}
	select {
	case <-f.seen:
		t.Fatal("an empty write counted as output")
	default:
	}
	for range 2 { // the second write must not close seen again
		if n, err := f.Write([]byte("hi\n")); n != 3 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	select {
	case <-f.seen:
	default:
		t.Fatal("a write of three bytes did not count as output")
	}
}

func TestAPIExecResult(t *testing.T) {
	viaExec := Measurement{Runs: 200, Min: 20, P50: 30, P99: 40, Max: 45, Mean: 31}
	viaSession := Measurement{Runs: 200, Min: 30, P50: 45, P99: 60, Max: 70, Mean: 46}
	inProcess := Measurement{Runs: 200, Min: 10, P50: 20, P99: 25, Max: 30, Mean: 21}
	res := apiExecResult(viaExec, viaSession, inProcess, "notes")
	if res.Name != ScenarioAPIExecRTT || res.Unit != "ms" || res.Ratio != 1.5 || res.Notes != "notes" {
		t.Errorf("result %+v", res)
	}
	if len(res.Variants) != 1 || res.Variants[0].Name != "session" || res.Variants[0].Ratio != 2.25 ||
		res.Variants[0].Measurement != viaSession {
		t.Errorf("variants %+v, want one named session with ratio 2.25", res.Variants)
	}
}

// apiReport is a report with the two API results, as Run makes them.
func apiReport() Report {
	return Report{
		Version:   ReportVersion,
		StartedAt: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
		Host:      Host{CPUs: 2, Accel: "tcg", Kernel: "6.1.0-test"},
		Results: []Result{
			{
				Name: ScenarioAPICreate, Unit: "ms",
				Airlock:  Measurement{Runs: 5, Failures: 1, Min: 5100, P50: 5250.5, P99: 5600, Max: 5600, Mean: 5300},
				Baseline: Measurement{Runs: 5, Min: 5000, P50: 5100.25, P99: 5400, Max: 5400, Mean: 5150},
				Ratio:    1.029, Notes: "create notes",
			},
			apiExecResult(
				Measurement{Runs: 200, Min: 20, P50: 30, P99: 40, Max: 45, Mean: 31},
				Measurement{Runs: 200, Min: 30, P50: 45, P99: 60, Max: 70, Mean: 46},
				Measurement{Runs: 200, Min: 10, P50: 20, P99: 25, Max: 30, Mean: 21},
				"exec notes"),
		},
	}
}

// The API results have the shape of the others: the same fields on each
// side, and only api_exec_rtt has variants, each a timing measurement with
// a name and a ratio.
func TestAPIReportJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, apiReport()); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Version int              `json:"version"`
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Version != 1 || len(doc.Results) != 2 {
		t.Fatalf("version %d with %d results, want 1 with 2", doc.Version, len(doc.Results))
	}
	timing := []string{"runs", "min", "p50", "p99", "max", "mean"}
	hasExactly := func(where string, m map[string]any, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("%s has no %q: %v", where, k, m)
			}
		}
		if len(m) != len(keys) {
			t.Errorf("%s has %d fields, want %v: %v", where, len(m), keys, m)
		}
	}
	create, exec := doc.Results[0], doc.Results[1]
	hasExactly("create", create, "name", "unit", "airlock", "baseline", "ratio", "notes")
	hasExactly("create.airlock", create["airlock"].(map[string]any), append(timing, "failures")...)
	hasExactly("create.baseline", create["baseline"].(map[string]any), timing...)
	hasExactly("exec", exec, "name", "unit", "airlock", "baseline", "ratio", "variants", "notes")
	hasExactly("exec.airlock", exec["airlock"].(map[string]any), timing...)
	hasExactly("exec.baseline", exec["baseline"].(map[string]any), timing...)
	variants := exec["variants"].([]any)
	if len(variants) != 1 {
		t.Fatalf("%d variants, want 1", len(variants))
	}
	v := variants[0].(map[string]any)
	hasExactly("exec.variants[0]", v, append(timing, "name", "ratio")...)
	if v["name"] != "session" || v["ratio"] != 2.25 || v["p50"] != float64(45) {
		t.Errorf("variant %v, want session, ratio 2.25, p50 45", v)
	}

	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if got, want := back.Results[1].Variants, apiReport().Results[1].Variants; !slices.Equal(got, want) {
		t.Errorf("variants after a round trip %+v, want %+v", got, want)
	}
}

func TestAPIReportTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, apiReport()); err != nil {
		t.Fatal(err)
	}
	want := `airlock bench  2026-11-30T10:00:00Z  host: 2 CPUs, accel tcg, kernel 6.1.0-test

SCENARIO                    FIGURE          AIRLOCK  BASELINE   RATIO
api_create_to_first_output  p50 ms           5250.5    5100.2  1.029x
                            p99 ms           5600.0    5400.0
                            max ms           5600.0    5400.0
api_exec_rtt                p50 ms           30.000    20.000    1.5x
                            p99 ms           40.000    25.000
                            session p50 ms   45.000    20.000   2.25x
                            session p99 ms   60.000    25.000

api_create_to_first_output: create notes
api_exec_rtt: exec notes
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

// fakeDataDir makes a data directory that passes the runtime's checks
// without anything bootable in it.
func fakeDataDir(t *testing.T) datadir.Dir {
	t.Helper()
	dir := datadir.Dir{Root: t.TempDir()}
	for _, p := range []string{dir.Kernel(), dir.Initramfs(), guest.ManifestPath(dir)} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dir.Templates(), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The bench's server, on a data directory with nothing to boot: it serves
// the API with its admin key from a short temporary directory linked to
// the real one, and close removes that directory, also when a delete
// fails, without touching the real one.
func TestAPIServerStartAndClose(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	real := fakeDataDir(t)
	cfg := Config{Dir: real, Accel: "tcg"}.withDefaults()
	ctx := context.Background()
	s, err := startAPIServer(ctx, cfg, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.close()
		}
	})

	if filepath.Dir(s.home) != tmp || !strings.HasPrefix(filepath.Base(s.home), "alb") {
		t.Errorf("home %s is not a temporary alb directory", s.home)
	}
	for _, name := range sharedHomeEntries {
		target, err := os.Readlink(filepath.Join(s.home, name))
		if err != nil || target != filepath.Join(real.Root, name) {
			t.Errorf("%s links to %q (%v), want the real data directory's", name, target, err)
		}
	}
	if !strings.HasPrefix(s.url, "http://127.0.0.1:") {
		t.Errorf("serving on %s, want loopback", s.url)
	}
	if h, err := s.client.Health(ctx); err != nil || h.Status == "" {
		t.Errorf("health = %+v, %v", h, err)
	}
	list, err := s.client.ListSandboxes(ctx, apiclient.SandboxFilter{}, apiclient.ListOptions{})
	if err != nil {
		t.Fatalf("list sandboxes with the admin key: %v", err)
	}
	if len(list.Items) != 0 {
		t.Errorf("a fresh server lists %d sandboxes", len(list.Items))
	}

	// A sandbox the server does not know: its delete fails, the rest of
	// the teardown still happens.
	s.live["sbxdoesnotexist0000000000"] = true
	home := s.home
	err = s.close()
	closed = true
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("close = %v, want the failed delete reported", err)
	}
	if _, err := os.Lstat(home); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary data directory is still there: %v", err)
	}
	for _, name := range []string{"boot", "templates"} {
		if _, err := os.Stat(filepath.Join(real.Root, name)); err != nil {
			t.Errorf("the real data directory lost %s: %v", name, err)
		}
	}
	if _, err := s.client.Health(ctx); err == nil {
		t.Error("the server still answers after close")
	}
}

func TestStartAPIServerFailsClean(t *testing.T) {
	// No boot artifacts: the runtime refuses, and the temporary directory
	// made before that is removed again.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	real := datadir.Dir{Root: t.TempDir()}
	_, err := startAPIServer(context.Background(), Config{Dir: real, Accel: "tcg"}.withDefaults(), nil, "")
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("startAPIServer = %v, want errdefs.ErrPrecondition", err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("%s was left behind", left[0].Name())
	}
}
