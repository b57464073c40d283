// Package daemontest runs a whole airlock server for tests: a Local
// daemon (internal/daemon) on a loopback port over a temporary data
// directory whose boot artifacts are stand-ins, so that it starts without
// `airlock setup`. It boots no VM unless a test asks it for a sandbox,
// and that would fail: it is for the calls that need none (keys,
// secrets, listings). It stops when the test ends.
package daemontest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/guest"
)

// Server is a running daemon with its address and admin key.
type Server struct {
	*daemon.Daemon
	// URL is the API's base URL, http://127.0.0.1:PORT.
	URL string
	// AdminKey is the admin key the daemon made on its start.
	AdminKey string
	// Dir is its data directory.
	Dir datadir.Dir
}

// Config is the Config Start uses before edits: airlock serve's defaults
// on a loopback port of dir, with the jail off (no VM is booted) and the
// log in the test's.
func Config(t testing.TB, dir datadir.Dir) daemon.Config {
	return daemon.Config{
		Dir: dir, Log: slog.New(slog.NewTextHandler(newTestWriter(t), nil)), Listen: "127.0.0.1:0",
		Accel: "tcg", Unjailed: true, MaxSandboxes: 32, PingInterval: 15 * time.Second,
		DefaultEgress: "deny", MaxBuilds: 1, MaxBuildContextMiB: 1024,
	}
}

// DataDir is a new data directory with stand-in boot artifacts, enough
// for a daemon to start on.
func DataDir(t testing.TB) datadir.Dir {
	t.Helper()
	dir := datadir.Dir{Root: t.TempDir()}
	for _, p := range []string{dir.Kernel(), dir.Initramfs(), guest.ManifestPath(dir)} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("not used"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Start starts a daemon of Config, changed by edit, on a new DataDir,
// and stops it when the test ends.
func Start(t testing.TB, edit ...func(*daemon.Config)) *Server {
	t.Helper()
	dir := DataDir(t)
	cfg := Config(t, dir)
	for _, e := range edit {
		e(&cfg)
	}
	d, err := daemon.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }() // ends with the test
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
		d.Close()
	})
	return &Server{Daemon: d, URL: "http://" + d.Addr().String(), AdminKey: d.AdminKey(), Dir: dir}
}

// testWriter writes a log to the test's until the test ends, and drops
// what comes later (a test's log must not be written after it).
type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool // guarded by mu
}

func newTestWriter(t testing.TB) *testWriter {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
