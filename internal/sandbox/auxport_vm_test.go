package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/probe"
	"github.com/airlockhq/airlock/internal/vm"
)

// auxDeviceCmd prints the guest's device of the auxiliary port, found by
// its name.
const auxDeviceCmd = `for f in /sys/class/virtio-ports/*/name; do
	if [ "$(cat "$f")" = ` + vm.AuxPortName + ` ]; then d=${f%/name}; echo /dev/${d##*/}; fi
done`

// TestAuxPortVM runs what the bench's floors rely on against real VMs
// with the agent of this tree, jailed and not: the auxiliary port of a
// sandbox booted with Spec.AuxPort carries bytes from the guest to the
// host, also after a suspend and wake (the record keeps the device), and
// a command in the sandbox's root runs airlock-probe copied in (probe.Exe).
// A clone cannot have the port: Resolve says so.
func TestAuxPortVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	jailed := agentRuntime(t, ctx)
	if !jailed.Jailed() {
		t.Fatal("the test's runtime is not jailed")
	}
	unjailed, err := New(ctx, Config{Dir: jailed.cfg.Dir, Log: testLog(t), ColdBoot: true, Unjailed: true})
	if err != nil {
		t.Fatal(err)
	}
	cloning, err := New(ctx, Config{Dir: jailed.cfg.Dir, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cloning.Resolve(Spec{Template: "tiny", AuxPort: true}); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "cold boot") {
		t.Errorf("an aux port on a clone: %v, want invalid", err)
	}

	for _, tc := range []struct {
		name string
		rt   *Runtime
	}{{"jailed", jailed}, {"unjailed", unjailed}} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := tc.rt.Create(ctx, Spec{Template: "tiny", AuxPort: true, ColdBoot: true})
			if err != nil {
				t.Fatal(err)
			}
			id := sb.ID
			t.Cleanup(func() { tc.rt.Remove(context.Background(), id) })
			defer func() { sb.Destroy(context.Background()) }()
			dev := strings.TrimSpace(expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: auxDeviceCmd}, `^/dev/vport\d+p\d+\n$`))
			if dev == "" {
				t.FailNow()
			}
			t.Logf("the aux port is %s", dev)
			auxCarries(ctx, t, sb, dev)

			// The probe, from inside the sandbox's root.
			copyProbe(ctx, t, sb)
			out := expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: probe.SpawnArgv(3, "/bin/true")}, `^\{.*\}\n$`)
			var spawn probe.Spawn
			if err := json.Unmarshal([]byte(out), &spawn); err != nil || len(spawn.RunsNS) != 3 || spawn.RunsNS[0] <= 0 {
				t.Errorf("spawn probe printed %q (%v), want 3 runs", out, err)
			}
			out = expectOutput(ctx, t, sb, agentproto.ExecRequest{Argv: probe.PipeArgv(1 << 20)}, `^\{.*\}\n$`)
			var pipe probe.Pipe
			if err := json.Unmarshal([]byte(out), &pipe); err != nil || pipe.Bytes != 1<<20 || pipe.NS <= 0 {
				t.Errorf("pipe probe printed %q (%v), want 1 MiB", out, err)
			}

			if err := sb.Suspend(ctx); err != nil {
				t.Fatal(err)
			}
			if sb, err = tc.rt.Wake(ctx, id); err != nil {
				t.Fatal(err)
			}
			auxCarries(ctx, t, sb, dev)
		})
	}
}

// auxCarries writes a line and 1 MiB of zeros to the guest's device dev
// of the auxiliary port and checks that the host reads exactly those
// from the port's socket.
func auxCarries(ctx context.Context, t *testing.T, sb *Sandbox, dev string) {
	t.Helper()
	conn, err := net.Dial("unix", sb.Machine().AuxSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	const line = "from the guest\n"
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(line)+1<<20+1)
		n, _ := io.ReadAtLeast(conn, b, len(line)+1<<20)
		got <- b[:n]
	}()
	expectOutput(ctx, t, sb, agentproto.ExecRequest{Cmd: "echo '" + strings.TrimSpace(line) + "' > " + dev +
		" && dd if=/dev/zero bs=65536 count=16 status=none of=" + dev}, `^$`)
	b := <-got
	want := append([]byte(line), make([]byte, 1<<20)...)
	if !bytes.Equal(b, want) {
		t.Errorf("the host read %d bytes from the aux port (starting %q), want %d (starting %q)", len(b), b[:min(len(b), 20)], len(want), line)
	}
}

// copyProbe builds cmd/airlock-probe and copies it into sb as probe.Exe,
// as the bench does before it runs a probe.
func copyProbe(ctx context.Context, t *testing.T, sb *Sandbox) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "airlock-probe")
	goBuild(t, bin, "", "github.com/airlockhq/airlock/cmd/airlock-probe")
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := sb.Agent().WriteFile(ctx, probe.Exe, 0o755, f); err != nil {
		t.Fatalf("copy airlock-probe in: %v", err)
	}
}
