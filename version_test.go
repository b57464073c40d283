package airlock_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make build` makes an airlock whose `version` names the revision of the
// checkout it was built from, whether or not the toolchain records VCS
// information itself.
func TestVersionNamesRevision(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("make", "--no-print-directory", "build", "BIN="+bin)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "airlock"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("airlock version: %v\n%s", err, out)
	}
	t.Logf("airlock version:\n%s", out)
	if !strings.HasPrefix(string(out), "airlock ") || !strings.Contains(string(out), "built with go") {
		t.Errorf("airlock version printed %q", out)
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		// Not a git checkout (an unpacked archive): nothing to name.
		if !strings.Contains(string(out), "revision unknown") {
			t.Errorf("outside a git checkout airlock version printed %q, want \"revision unknown\"", out)
		}
		return
	}
	if want := "revision " + strings.TrimSpace(string(rev)); !strings.Contains(string(out), want) {
		t.Errorf("airlock version printed %q, want %q", out, want)
	}
}
