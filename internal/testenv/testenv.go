// Package testenv is for tests: it tells a prerequisite this host lacks
// from one CI lacks.
package testenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Lacking skips a test whose prerequisite this host lacks, saying which.
// Under CI (CI=true, as .ci/run sets it) it fails instead, so that CI
// cannot pass without having run the test: make test installs and sets up
// everything the tests need.
func Lacking(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI lacks a prerequisite: "+format, args...)
	}
	t.Skipf(format, args...)
}

// Short skips a test under `go test -short`, saying why it is not short
// (it boots VMs, downloads a package). Under CI it fails instead: CI runs
// every test, and make test never passes -short.
func Short(t testing.TB, why string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI runs every test, but -short was given: %s", why)
	}
	t.Skipf("skipped under -short: %s", why)
}

// ProcStatus returns the fields of /proc/PID/status, such as "Uid",
// "CapEff" or "Seccomp", their values trimmed.
func ProcStatus(t testing.TB, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// ProcessAlive reports whether process pid runs: it exists and is not a
// zombie.
func ProcessAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state is the field after the command, which is in parentheses
	// and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	return i >= 0 && len(f) > 0 && f[0] != "Z"
}

// Eventually polls cond every 100 ms for up to limit, and fails the test
// with what and what cond last said if it never holds.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s; last: %s", what, limit, last)
}
