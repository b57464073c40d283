package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
)

// sandboxMetrics answers the metrics set for a sandbox; a sandbox without
// any is one that stopped after it was listed.
func (f *fakeServer) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	f.measured = append(f.measured, id)
	m, ok := f.metrics[id]
	if sb := f.sandboxes[id]; sb.State != apiv1.StateRunning || !ok {
		fakeError(w, 409, "conflict", "sandbox "+id+" is paused, not running")
		return
	}
	fakeJSON(w, 200, m)
}

// topServer has three sandboxes: sbx1 running and measured, sbx2 paused,
// sbx3 listed as running but paused by the time it is measured.
func topServer(t *testing.T) *fakeServer {
	f := newFakeServer(t)
	now := time.Now()
	for _, id := range []string{"sbx1", "sbx2", "sbx3"} {
		f.addSandbox(id, now)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes["sbx1"].VCPUs, f.sandboxes["sbx2"].VCPUs, f.sandboxes["sbx3"].VCPUs = 2, 1, 1
	f.sandboxes["sbx2"].State = apiv1.StatePaused
	f.metrics["sbx1"] = apiv1.SandboxMetrics{CPUUsedPct: 12.5, CPUCount: 2, MemUsedMiB: 41, MemTotalMiB: 467,
		DiskUsedMiB: 655, DiskTotalMiB: 1983, Time: now}
	return f
}

// topRows splits a table into its rows' fields, header first.
func topRows(table string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

func TestSandboxTopOnce(t *testing.T) {
	f := topServer(t)
	stdout, stderr, err := f.run(t, "", "sandbox", "top", "--once")
	if err != nil || stderr != "" {
		t.Fatalf("%v, stderr %q", err, stderr)
	}
	rows := topRows(stdout)
	if len(rows) != 4 {
		t.Fatalf("want a header and 3 sandboxes:\n%s", stdout)
	}
	if want := []string{"ID", "TEMPLATE", "STATE", "CPU%", "MEM(MiB)", "DISK(MiB)", "VCPUS", "ERROR"}; !slices.Equal(rows[0], want) {
		t.Errorf("header %q, want %q", rows[0], want)
	}
	if want := []string{"sbx1", "base:latest", "running", "12.5", "41/467", "655/1983", "2", "-"}; !slices.Equal(rows[1], want) {
		t.Errorf("measured row %q, want %q", rows[1], want)
	}
	if want := []string{"sbx2", "base:latest", "paused", "-", "-", "-", "1", "-"}; !slices.Equal(rows[2], want) {
		t.Errorf("paused row %q, want %q", rows[2], want)
	}
	if got := strings.Join(rows[3], " "); !strings.HasPrefix(got, "sbx3 base:latest running - - - 1 sandbox sbx3 is paused, not running") {
		t.Errorf("row of a sandbox that stopped after the list: %q", got)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if slices.Sort(f.measured); !slices.Equal(f.measured, []string{"sbx1", "sbx3"}) {
		t.Errorf("measured %q, want only the sandboxes listed as running", f.measured)
	}
}

func TestSandboxTopVMMColumns(t *testing.T) {
	f := topServer(t)
	f.mu.Lock()
	m := f.metrics["sbx1"]
	m.VMMCPUPct, m.VMMMemMiB = 30.25, 510
	f.metrics["sbx1"] = m
	f.metrics["sbx3"] = apiv1.SandboxMetrics{CPUUsedPct: 1, MemUsedMiB: 2, MemTotalMiB: 3, DiskUsedMiB: 4, DiskTotalMiB: 5}
	f.mu.Unlock()
	stdout, _, err := f.run(t, "", "sandbox", "top", "--once")
	if err != nil {
		t.Fatal(err)
	}
	rows := topRows(stdout)
	if want := []string{"ID", "TEMPLATE", "STATE", "CPU%", "MEM(MiB)", "DISK(MiB)", "VCPUS", "VMM_CPU%", "VMM_MEM(MiB)"}; !slices.Equal(rows[0], want) {
		t.Fatalf("header %q, want %q (no ERROR column: every running sandbox was measured)", rows[0], want)
	}
	if got := rows[1][7:]; !slices.Equal(got, []string{"30.2", "510"}) && !slices.Equal(got, []string{"30.3", "510"}) {
		t.Errorf("host-side cells of sbx1: %q", got)
	}
	if got := rows[3][3:]; !slices.Equal(got, []string{"1.0", "2/3", "4/5", "1", "-", "-"}) {
		t.Errorf("cells of sbx3, measured without host-side fields: %q", got)
	}

	// Without host-side fields anywhere the columns are left out.
	f.mu.Lock()
	m.VMMCPUPct, m.VMMMemMiB = 0, 0
	f.metrics["sbx1"] = m
	f.mu.Unlock()
	stdout, _, _ = f.run(t, "", "sandbox", "top", "--once")
	if strings.Contains(stdout, "VMM_") {
		t.Errorf("VMM columns with no sandbox reporting them:\n%s", stdout)
	}
}

func TestSandboxTopJSON(t *testing.T) {
	f := topServer(t)
	stdout, _, err := f.run(t, "", "sandbox", "top", "--once", "--json")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want one line per sandbox:\n%s", stdout)
	}
	var rows []topRow
	for _, line := range lines {
		var r topRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		rows = append(rows, r)
	}
	if r := rows[0]; r.ID != "sbx1" || r.State != "running" || r.VCPUs != 2 || r.Metrics == nil || r.Metrics.MemTotalMiB != 467 || r.Error != nil {
		t.Errorf("sbx1: %+v", r)
	}
	if r := rows[1]; r.ID != "sbx2" || r.State != "paused" || r.Metrics != nil || r.Error != nil {
		t.Errorf("sbx2: %+v", r)
	}
	if r := rows[2]; r.ID != "sbx3" || r.Metrics != nil || r.Error == nil || r.Error.Code != "conflict" || !strings.Contains(r.Error.Message, "not running") {
		t.Errorf("sbx3: %+v %+v", r, r.Error)
	}
	if !strings.Contains(lines[1], `"metrics":null`) || strings.Contains(lines[0], "vmm_") {
		t.Errorf("absent metrics are null and absent host-side fields are left out:\n%s", stdout)
	}
}

// lockedBuffer is a buffer written by a command and read by its test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startTop runs `airlock sandbox top args...` against f in the background
// with stdout to w; stop ends it as Ctrl-C does and returns its error.
func startTop(t *testing.T, f *fakeServer, w io.Writer, args ...string) (stop func() error) {
	t.Helper()
	t.Setenv("AIRLOCK_API_KEY", testKey)
	ctx, cancel := context.WithCancel(context.Background())
	var errb bytes.Buffer
	env := &Env{Stdout: w, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, env, append([]string{"sandbox", "top", "--url", f.url}, args...)) }()
	return func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("top did not stop within 10 s of its interrupt")
			return nil
		}
	}
}

// waitFor polls until cond holds, for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in 10 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSandboxTopRefreshes(t *testing.T) {
	f := topServer(t)
	var out lockedBuffer
	stop := startTop(t, f, &out, "--interval", "200ms")
	waitFor(t, "third table", func() bool { return strings.Count(out.String(), "ID ") >= 3 })
	// A sandbox created meanwhile shows in the next tables.
	f.addSandbox("sbx4", time.Now())
	waitFor(t, "table with the new sandbox", func() bool { return strings.Contains(out.String(), "sbx4") })
	if err := stop(); err != nil {
		t.Fatalf("interrupted top: %v, want success", err)
	}
	got := out.String()
	if strings.Contains(got, "\033") {
		t.Errorf("escape sequences in output that is not a terminal: %q", got)
	}
	tables := strings.Split(strings.TrimRight(got, "\n"), "\n\n")
	if len(tables) < 4 {
		t.Fatalf("%d tables, want at least 4 separated by blank lines:\n%s", len(tables), got)
	}
	for i, table := range tables {
		rows := topRows(table)
		headers := 0
		for _, r := range rows {
			if r[0] == "ID" {
				headers++
			}
		}
		if rows[0][0] != "ID" || headers != 1 || len(rows) < 4 {
			t.Errorf("table %d is not one header and the sandboxes:\n%s", i, table)
		}
	}
	if last := tables[len(tables)-1]; !strings.Contains(last, "sbx4") {
		t.Errorf("the last table lacks the sandbox created meanwhile:\n%s", last)
	}
}

func TestSandboxTopJSONLines(t *testing.T) {
	f := topServer(t)
	var out lockedBuffer
	stop := startTop(t, f, &out, "--json", "--interval", "200ms")
	waitFor(t, "two rounds", func() bool { return strings.Count(out.String(), "\n") >= 6 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		var r topRow
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.ID == "" {
			t.Errorf("line %q is not a sandbox's JSON: %v", line, err)
		}
	}
}

// On a terminal each table replaces the last: home, clear, then the table.
func TestSandboxTopTerminal(t *testing.T) {
	f := topServer(t)
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	var screen lockedBuffer
	go io.Copy(&screen, ptmx)
	stop := startTop(t, f, tty, "--interval", "200ms")
	waitFor(t, "second redraw", func() bool { return strings.Count(screen.String(), "\033[H\033[2J") >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	frames := strings.Split(screen.String(), "\033[H\033[2J")
	last := frames[len(frames)-2] // the last may still be arriving
	if !strings.Contains(last, "airlock sandbox top") || !strings.Contains(last, "Ctrl-C") ||
		!strings.Contains(last, "sbx1") || !strings.Contains(last, "41/467") {
		t.Errorf("a frame on the terminal: %q", last)
	}
	if !strings.Contains(last, "\r\n\r\nID") {
		t.Errorf("no title line above the table: %q", last)
	}
}

func TestSandboxTopBadFlags(t *testing.T) {
	f := topServer(t)
	for _, args := range [][]string{
		{"--interval", "0s"},
		{"--interval", "10ms"},
		{"--interval", "soon"},
		{"--frobnicate"},
		{"sbx1"},
	} {
		_, _, err := f.run(t, "", append([]string{"sandbox", "top", "--once"}, args...)...)
		if ExitCode(err) != 2 || strings.Contains(Message(err), "\n") || !strings.Contains(Message(err), "sandbox top") {
			t.Errorf("top %q: exit %d, %v", args, ExitCode(err), err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.measured) != 0 {
		t.Errorf("bad flags measured %q", f.measured)
	}
}

func TestSandboxTopFirstListFails(t *testing.T) {
	f := topServer(t)
	t.Setenv("AIRLOCK_API_KEY", "wrong")
	env := &Env{Stdout: io.Discard, Stderr: io.Discard, Dir: datadir.Dir{Root: t.TempDir()}}
	done := make(chan error, 1)
	go func() { done <- Run(t.Context(), env, []string{"sandbox", "top", "--url", f.url}) }()
	select {
	case err := <-done:
		if ExitCode(err) != 2 || !strings.Contains(Message(err), "bad key") {
			t.Fatalf("top with a bad key: exit %d, %v", ExitCode(err), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("top with a bad key kept running: a first list that fails must end it")
	}
}
