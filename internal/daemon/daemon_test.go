package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/daemon/daemontest"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// syncBuffer is a buffer that Run's goroutine writes while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Validate refuses a bad setting with errdefs.ErrInvalid and names the
// flag that sets it.
func TestValidate(t *testing.T) {
	good := daemontest.Config(t, datadir.Dir{Root: t.TempDir()})
	if err := good.Validate(); err != nil {
		t.Fatalf("serve's defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*daemon.Config)
		want string
	}{
		{"no data directory", func(c *daemon.Config) { c.Dir = datadir.Dir{} }, "no data directory"},
		{"no listener", func(c *daemon.Config) { c.Listen = "" }, "--listen"},
		{"unknown role", func(c *daemon.Config) { c.Role = "edge" }, "not local, front or node"},
		{"no sandboxes", func(c *daemon.Config) { c.MaxSandboxes = 0 }, "limits must be positive"},
		{"negative starts", func(c *daemon.Config) { c.MaxStarts = -1 }, "limits must be positive"},
		{"fast pings", func(c *daemon.Config) { c.PingInterval = time.Millisecond }, "--ping-interval"},
		{"no builds", func(c *daemon.Config) { c.MaxBuilds = 0 }, "--max-builds"},
		{"no build context", func(c *daemon.Config) { c.MaxBuildContextMiB = 0 }, "--max-build-context"},
		{"negative metrics", func(c *daemon.Config) { c.MetricsPerSandbox = -1 }, "--metrics-per-sandbox"},
		{"egress", func(c *daemon.Config) { c.DefaultEgress = "maybe" }, "--default-egress"},
		{"dns", func(c *daemon.Config) { c.DNSUpstream = "resolver" }, "--dns-upstream"},
		{"store wait", func(c *daemon.Config) { c.StoreWait = -time.Second }, "--store-wait"},
		{"e2b domain alone", func(c *daemon.Config) { c.E2BDomain = "e2b.test" }, "--e2b-domain needs --e2b-listen"},
		{"front on SQLite", func(c *daemon.Config) { c.Role = daemon.Front }, "needs the cluster's PostgreSQL store"},
		{"front with warm pools", func(c *daemon.Config) {
			c.Role, c.Store, c.Warm = daemon.Front, "postgres://db/airlock", []sandbox.PoolSpec{{Template: "base", Size: 1}}
		}, "--warm"},
		{"front without a token", func(c *daemon.Config) { c.Role, c.Store = daemon.Front, "postgres://db/airlock" }, "no internal token"},
		{"node name", func(c *daemon.Config) { c.Role, c.NodeName = daemon.Node, "Host_A" }, "--name"},
		{"node on SQLite", func(c *daemon.Config) { c.Role, c.NodeName = daemon.Node, "host-a" }, "--store"},
		{"node with a short token", func(c *daemon.Config) {
			c.Role, c.NodeName, c.Store, c.Token = daemon.Node, "host-a", "postgres://db/airlock", "short"
		}, "at least 32 characters"},
		{"node without TLS", func(c *daemon.Config) {
			c.Role, c.NodeName, c.Store, c.Token = daemon.Node, "host-a", "postgres://db/airlock", strings.Repeat("a", 40)
		}, "--cluster-tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.Validate()
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v, want ErrInvalid naming %q", err, tc.want)
			}
			if _, err := daemon.New(context.Background(), c); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("New = %v, want Validate's refusal", err)
			}
		})
	}
}

// A daemon shows the admin key it made and serves the API.
func TestServes(t *testing.T) {
	var out syncBuffer
	s := daemontest.Start(t, func(c *daemon.Config) { c.Stdout = &out })
	if !strings.Contains(out.String(), "admin API key (shown once") || !strings.Contains(out.String(), s.AdminKey) {
		t.Errorf("the admin key was not shown:\n%s", out.String())
	}
	resp, err := http.Get(s.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("health: %s", resp.Status)
	}
}

// Run prints airlock serve's lines, and stops when its context ends.
func TestRunLines(t *testing.T) {
	cfg := daemontest.Config(t, daemontest.DataDir(t))
	var out syncBuffer
	cfg.Stdout, cfg.E2BListen = &out, "127.0.0.1:0"
	d, err := daemon.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "airlock serving on") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")[2:] // after the admin key
	want := []string{"airlock serving E2B's API on http://127.0.0.1:", "airlock serving on http://127.0.0.1:", "airlock stopped; sandboxes keep running"}
	if len(lines) != len(want) {
		t.Fatalf("lines:\n%s", out.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %q, want %q…", i, lines[i], w)
		}
	}
}
