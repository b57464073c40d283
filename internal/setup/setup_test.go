package setup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestValidate(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := datadir.Dir{Root: t.TempDir()}
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"ok", Config{Dir: dir, AgentPath: agent}, true},
		{"ok with templates", Config{Dir: dir, AgentPath: agent, Templates: []string{"tiny"}}, true},
		{"no dir", Config{AgentPath: agent}, false},
		{"no agent", Config{Dir: dir}, false},
		{"missing agent", Config{Dir: dir, AgentPath: agent + ".nope"}, false},
		{"unknown template", Config{Dir: dir, AgentPath: agent, Templates: []string{"huge"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
				t.Errorf("Validate = %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func TestReadyBeforeSetup(t *testing.T) {
	err := Ready(datadir.Dir{Root: t.TempDir()})
	if !errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), "sudo airlock setup") {
		t.Fatalf("Ready on an empty data directory = %v", err)
	}
}

func TestMissingPackages(t *testing.T) {
	missing, err := missingPackages(context.Background(), []string{"dpkg", "airlock-no-such-package"})
	if errors.Is(err, errdefs.ErrPrecondition) {
		testenv.Lacking(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(missing, " ") != "airlock-no-such-package" {
		t.Errorf("missingPackages = %q", missing)
	}
}

func TestStepWriter(t *testing.T) {
	var buf bytes.Buffer
	w := &stepWriter{out: &buf, prefix: "  boot: "}
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\nthree"))
	w.flush()
	if got, want := buf.String(), "  boot: one\n  boot: two\n  boot: three\n"; got != want {
		t.Errorf("stepWriter wrote %q, want %q", got, want)
	}
	if w.quietFor() > time.Second {
		t.Error("quietFor just after a write is over a second")
	}
}

// TestRun runs the whole setup into a fresh data directory: the kernel
// package, the initramfs, tiny, and base by debootstrap against the host's
// Debian mirror (a minute or two), then runs it again, which must do
// nothing. It starts from a copy of the package caches of the host's data
// directory, when it has them, so that it downloads only what changed
// since. code-interpreter is base with more Debian packages and a warm
// snapshot; make setup makes it, and the E2B runCode cases run it. It runs
// as root with AIRLOCK_SETUP_IT=1, as make unit sets it.
func TestRun(t *testing.T) {
	if os.Getenv("AIRLOCK_SETUP_IT") != "1" {
		testenv.Lacking(t, "set AIRLOCK_SETUP_IT=1 to run the whole setup (make unit does)")
	}
	if os.Geteuid() != 0 {
		testenv.Lacking(t, "setup needs root")
	}
	dir := datadir.Dir{Root: t.TempDir()}
	if err := os.MkdirAll(dir.Cache(), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"debs", "debootstrap", "apt-archives"} {
		from := filepath.Join(datadir.Default().Cache(), c)
		if _, err := os.Stat(from); err != nil {
			continue
		}
		if out, err := exec.Command("cp", "-a", from, dir.Cache()).CombinedOutput(); err != nil {
			t.Fatalf("copy the package cache %s: %v\n%s", from, err, out)
		}
	}
	agent := filepath.Join(t.TempDir(), "agent")
	b, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent, b, 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg := Config{Dir: dir, AgentPath: agent, Templates: []string{"tiny", "base"}, Out: &out}
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	t.Logf("first run:\n%s", out.String())
	if err := Ready(dir); err != nil {
		t.Fatalf("Ready after setup: %v", err)
	}
	out.Reset()
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("second Run: %v\n%s", err, out.String())
	}
	t.Logf("second run:\n%s", out.String())
	for _, want := range []string{"boot: up to date", "tiny: up to date", "base: up to date", "nothing to do"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("second run output lacks %q", want)
		}
	}
	base, err := template.Open(dir).Resolve("base")
	if err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command("debugfs", "-R", "stat /usr/bin/python3", base.Image).Output()
	if err != nil || !strings.Contains(string(got), "python3.11") {
		t.Errorf("base: debugfs stat /usr/bin/python3 = %q, %v", got, err)
	}
}
