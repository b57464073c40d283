package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/testenv"
)

func TestParseNodeLine(t *testing.T) {
	ms := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name    string
		line    string
		want    nodeMsg
		ok      bool
		wantErr bool
	}{
		{"not a message", "some SDK warning", nodeMsg{}, false, false},
		{"empty", "", nodeMsg{}, false, false},
		{"sandbox", `BENCH {"sandbox":"sbxabc"}`, nodeMsg{Sandbox: "sbxabc"}, true, false},
		{"sample", `BENCH {"ms":12.5}`, nodeMsg{MS: ms(12.5)}, true, false},
		{"zero sample", `BENCH {"ms":0}`, nodeMsg{MS: ms(0)}, true, false},
		{"killed", `BENCH {"killed":true}`, nodeMsg{Killed: true}, true, false},
		{"error", `BENCH {"error":"Error: boom"}`, nodeMsg{Error: "Error: boom"}, true, false},
		{"carriage return", "BENCH {\"ms\":1}\r", nodeMsg{MS: ms(1)}, true, false},
		{"bad JSON", `BENCH {"ms":`, nodeMsg{}, true, true},
		{"marker mid-line", `x BENCH {"ms":1}`, nodeMsg{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ok, err := parseNodeLine(tc.line)
			if (err != nil) != tc.wantErr || ok != tc.ok {
				t.Fatalf("parseNodeLine(%q) = %+v, %v, %v; want ok %v, error %v", tc.line, m, ok, err, tc.ok, tc.wantErr)
			}
			if m.Sandbox != tc.want.Sandbox || m.Killed != tc.want.Killed || m.Error != tc.want.Error ||
				(m.MS == nil) != (tc.want.MS == nil) || (m.MS != nil && *m.MS != *tc.want.MS) {
				t.Errorf("parseNodeLine(%q) = %+v, want %+v", tc.line, m, tc.want)
			}
		})
	}
}

func TestNodeMsgSample(t *testing.T) {
	for _, tc := range []struct {
		line    string
		want    time.Duration
		wantErr bool
	}{
		{`BENCH {"ms":12.5}`, 12500 * time.Microsecond, false},
		{`BENCH {"ms":0.001}`, time.Microsecond, false},
		{`BENCH {"ms":-1}`, 0, true},
		{`BENCH {"sandbox":"x"}`, 0, true},
	} {
		m, _, err := parseNodeLine(tc.line)
		if err != nil {
			t.Fatal(err)
		}
		d, err := m.sample()
		if (err != nil) != tc.wantErr || d != tc.want {
			t.Errorf("sample of %s = %v, %v; want %v, error %v", tc.line, d, err, tc.want, tc.wantErr)
		}
	}
}

// TestNodeRun checks what a run's messages leave behind: the sandbox to
// delete when node did not kill it, and the first error.
func TestNodeRun(t *testing.T) {
	var n nodeRun
	for _, line := range []string{`BENCH {"sandbox":"sbx1"}`, `BENCH {"error":"first"}`, `BENCH {"error":"second"}`} {
		m, _, err := parseNodeLine(line)
		if err != nil {
			t.Fatal(err)
		}
		n.note(m)
	}
	if n.sandbox != "sbx1" || n.killed || n.err == nil || !strings.Contains(n.err.Error(), "first") {
		t.Errorf("after a create and two errors: %+v", n)
	}
	n.note(nodeMsg{Killed: true})
	if !n.killed || n.cleanup(nil) != nil {
		t.Errorf("a killed sandbox is left to clean up: %+v", n)
	}
}

func TestNodeVersionOK(t *testing.T) {
	for v, want := range map[string]bool{
		"20.18.1": true, "20.18.0": false, "20.20.2": true, "20.9.0": false, "18.19.0": false,
		"21.7.3": false, "22.0.0": true, "24.1.0": true, "": false, "garbage": false,
	} {
		if got := nodeVersionOK(v); got != want {
			t.Errorf("nodeVersionOK(%q) = %v, want %v", v, got, want)
		}
	}
}

// TestFindE2BSDK checks that a directory without the SDK fails saying
// what to install, and that one with it is found with its version.
func TestFindE2BSDK(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		_, err := findE2BSDK(t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "node is not installed") {
			t.Fatalf("without node: %v", err)
		}
		testenv.Lacking(t, "node is not installed")
	}
	empty := t.TempDir()
	_, err := findE2BSDK(empty)
	if err != nil && strings.Contains(err.Error(), "too old") {
		testenv.Lacking(t, "%v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "npm ci") || !strings.Contains(err.Error(), "--e2b-sdk") {
		t.Errorf("without the SDK: %v, want an error saying to run npm ci or pass --e2b-sdk", err)
	}
	dir := t.TempDir()
	pkg := filepath.Join(dir, "node_modules", "e2b")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, "package.json"), []byte(`{"name":"e2b","version":"2.51.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	sdk, err := findE2BSDK(dir)
	if err != nil || sdk.version != "2.51.0" || sdk.modules != filepath.Join(dir, "node_modules") {
		t.Errorf("findE2BSDK(%s) = %+v, %v", dir, sdk, err)
	}
}

// TestE2BScriptParses checks the embedded node script with node --check.
func TestE2BScriptParses(t *testing.T) {
	if !strings.Contains(string(e2bScript), nodeMarker) {
		t.Fatalf("the embedded script does not print %q", nodeMarker)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Lacking(t, "node is not installed")
	}
	p := filepath.Join(t.TempDir(), "e2b.mjs")
	if err := os.WriteFile(p, e2bScript, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(node, "--check", p).CombinedOutput(); err != nil {
		t.Errorf("node --check e2b.mjs: %v\n%s", err, out)
	}
}
