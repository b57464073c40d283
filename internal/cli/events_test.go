package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/daemon/daemontest"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/store"
)

// recordSandbox records a sandbox of the admin key going from creating to
// running, as a server does: two events.
func recordSandbox(t *testing.T, st *store.Store, id, owner string) {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{ID: id, Owner: owner, State: apiv1.StateCreating, TemplateRef: "tiny:latest", TemplateDigest: "sha256:aa",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{}, Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: "op" + id, Kind: apiv1.OpCreate, TargetID: id, Owner: owner, Status: apiv1.OpPending}); err != nil {
		t.Fatal(err)
	}
	sb.State = apiv1.StateRunning
	if err := st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
}

func TestEvents(t *testing.T) {
	d := daemontest.Start(t)
	p, err := d.Service().Authenticate(context.Background(), d.AdminKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("AIRLOCK_API_KEY", d.AdminKey)
	run := func(ctx context.Context, args ...string) (string, string, error) {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		err := Run(ctx, env, append([]string{"events", "--url", d.URL}, args...))
		return out.String(), errb.String(), err
	}
	recordSandbox(t, d.Store(), "sbxone", p.KeyID)

	out, _, err := run(context.Background())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) != 2 || !strings.Contains(lines[0], "sandbox.created") || !strings.Contains(lines[1], "sandbox.running") ||
		!strings.Contains(lines[1], "sbxone") || !strings.Contains(lines[1], `"from":"creating"`) {
		t.Fatalf("events: %v\n%s", err, out)
	}
	out, _, err = run(context.Background(), "--json", "--type", "sandbox.running")
	var ev apiv1.Event
	if err != nil || json.Unmarshal([]byte(out), &ev) != nil || ev.Type != apiv1.EventSandboxRunning || ev.SandboxID != "sbxone" {
		t.Fatalf("--json --type: %v\n%s", err, out)
	}
	if out, _, err = run(context.Background(), "--after", "1"); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("--after 1: %v\n%s", err, out)
	}

	// -f prints what comes while it waits, and ends when interrupted.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var followed lockedBuffer
	done := make(chan error, 1)
	go func() {
		env := &Env{Stdout: &followed, Stderr: io.Discard, Dir: datadir.Dir{Root: t.TempDir()}}
		done <- Run(ctx, env, []string{"events", "--url", d.URL, "-f", "--after", "2"})
	}()
	time.Sleep(300 * time.Millisecond)
	recordSandbox(t, d.Store(), "sbxtwo", p.KeyID)
	for deadline := time.Now().Add(20 * time.Second); strings.Count(followed.String(), "\n") < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		out := followed.String()
		if err != nil || strings.Count(out, "\n") != 2 || !strings.Contains(out, "sbxtwo") || strings.Contains(out, "sbxone") {
			t.Fatalf("-f printed (%v):\n%s", err, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("-f did not end when interrupted")
	}

	for _, bad := range [][]string{{"--type", "sandbox.nope"}, {"--after", "-3"}, {"extra"}, {"--after", "x"}} {
		if _, _, err := run(context.Background(), bad...); ExitCode(err) != 2 {
			t.Errorf("%v: exit %d (%v), want 2", bad, ExitCode(err), err)
		}
	}
}
