package probe

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/testenv"
)

func TestProbeArgs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in the error
	}{
		{"nothing", nil, "usage"},
		{"unknown mode", []string{"fork"}, "usage"},
		{"spawn without a path", []string{"spawn", "3"}, "usage"},
		{"spawn of no runs", []string{"spawn", "0", "/bin/true"}, `runs "0"`},
		{"spawn of too many runs", []string{"spawn", "100001", "/bin/true"}, `runs "100001"`},
		{"spawn of a word", []string{"spawn", "many", "/bin/true"}, `runs "many"`},
		{"spawn of a relative path", []string{"spawn", "1", "true"}, "not an absolute path"},
		{"pipe of a part of a block", []string{"pipe", "1000"}, `bytes "1000"`},
		{"pipe of nothing", []string{"pipe", "0"}, `bytes "0"`},
		{"pipe of too much", []string{"pipe", strconv.FormatInt(2<<40, 10)}, "bytes"},
		{"pipe with more", []string{"pipe", "65536", "x"}, "usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Run(tc.args, &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
			}
			if out.Len() > 0 {
				t.Errorf("a failed probe wrote %q", out.String())
			}
		})
	}
}

func TestProbeSpawn(t *testing.T) {
	truePath := lookTool(t, "true")
	var out bytes.Buffer
	if err := Run([]string{"spawn", "5", truePath}, &out); err != nil {
		t.Fatal(err)
	}
	var res Spawn
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	if len(res.RunsNS) != 5 {
		t.Fatalf("%d runs, want 5: %s", len(res.RunsNS), out.String())
	}
	for i, ns := range res.RunsNS {
		if ns <= 0 {
			t.Errorf("run %d took %d ns", i, ns)
		}
	}
	if !strings.HasSuffix(out.String(), "}\n") {
		t.Errorf("output is not one line of JSON: %q", out.String())
	}
}

// TestProbeSpawnFails checks that a run that fails fails the probe,
// quoting what the program wrote to stderr.
func TestProbeSpawnFails(t *testing.T) {
	var out bytes.Buffer
	err := Run([]string{"spawn", "2", lookTool(t, "false")}, &out)
	if err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Errorf("spawn of false: %v", err)
	}
	c, err := startPiped(lookTool(t, "sh"), []string{"sh", "-c", "echo oops >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.finish(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "exit status 3: oops") {
		t.Errorf("a failed command: %v", err)
	}
}

// TestStartPiped checks that a probe's child gets what the agent's exec
// gives a command: /dev/null as stdin, a pipe each as stdout and stderr,
// and a process group of its own.
func TestStartPiped(t *testing.T) {
	script := `readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2; echo $$ $(cut -d' ' -f5 /proc/$$/stat)`
	c, err := startPiped(lookTool(t, "sh"), []string{"sh", "-c", script})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.finish(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("output %q", out.String())
	}
	if lines[0] != "/dev/null" {
		t.Errorf("stdin is %s, want /dev/null", lines[0])
	}
	if !strings.HasPrefix(lines[1], "pipe:") || !strings.HasPrefix(lines[2], "pipe:") || lines[1] == lines[2] {
		t.Errorf("stdout is %s and stderr %s, want two pipes", lines[1], lines[2])
	}
	if f := strings.Fields(lines[3]); len(f) != 2 || f[0] != f[1] {
		t.Errorf("pid and process group: %q, want a group of its own", lines[3])
	}
}

func TestProbePipe(t *testing.T) {
	lookTool(t, "dd")
	const size = 4 << 20
	var out bytes.Buffer
	if err := Run([]string{"pipe", strconv.Itoa(size)}, &out); err != nil {
		t.Fatal(err)
	}
	var res Pipe
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	if res.Bytes != size || res.NS <= 0 {
		t.Errorf("pipe probe = %+v, want %d bytes in a positive time", res, size)
	}
}

// TestProbeArgv checks that the argv the host runs is what the probe
// parses.
func TestProbeArgv(t *testing.T) {
	spawn := SpawnArgv(7, "/bin/true")
	pipe := PipeArgv(3 * Block)
	if spawn[0] != Exe || pipe[0] != Exe {
		t.Fatalf("argv %q and %q do not run the probe", spawn, pipe)
	}
	if _, err := probe(spawn[1:]); err != nil {
		t.Errorf("%q: %v", spawn, err)
	}
	if _, err := probe(pipe[1:]); err != nil {
		t.Errorf("%q: %v", pipe, err)
	}
}

// lookTool finds a program of the host's the tests run, or skips.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Lacking(t, "%s is not installed: %v", name, err)
	}
	return p
}

func TestProbePattern(t *testing.T) {
	var out bytes.Buffer
	if err := Run([]string{"pattern", "200000"}, &out); err != nil {
		t.Fatal(err)
	}
	b := out.Bytes()
	if len(b) != 200000 {
		t.Fatalf("%d bytes, want 200000", len(b))
	}
	for off := 0; off < len(b); off += 8 {
		if got := binary.BigEndian.Uint64(b[off:]); got != uint64(off) {
			t.Fatalf("word at %d is %d", off, got)
		}
	}
	for _, bad := range [][]string{{"pattern"}, {"pattern", "7"}, {"pattern", "-8"}, {"pattern", "x"}, {"pattern", "8", "8"}} {
		if err := Run(bad, &out); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
