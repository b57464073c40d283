package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/probe"
	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/vm"
)

// The floors are measurements of the least that airlock's side of a
// scenario could cost in the same VM: the work itself inside the guest,
// timed there by airlock-probe (copied in as probe.Exe), or the
// transport without airlock on it. They are variants of their scenario's
// result, each with the floor as its own baseline.

// guestTrue is the program the in-guest spawn floor runs: the one the
// exec scenarios run, by its path.
const guestTrue = "/bin/true"

// probeTimeout bounds one probe of runs runs in the guest: an exec's
// bound and a second per run, ample under TCG.
func probeTimeout(runs int) time.Duration {
	return execTimeout + time.Duration(runs)*time.Second
}

// guestSpawns runs the spawn probe of path in sb (bin is airlock-probe): one process in
// the guest that forks, executes and waits for path execWarmup+runs times
// as the agent's exec does, timing each run inside the guest. It returns
// the durations of the last runs.
func guestSpawns(ctx context.Context, sb *sandbox.Sandbox, bin, path string, runs int) ([]time.Duration, error) {
	var res probe.Spawn
	if err := runProbe(ctx, sb, bin, probe.SpawnArgv(execWarmup+runs, path), probeTimeout(execWarmup+runs), &res); err != nil {
		return nil, err
	}
	if len(res.RunsNS) != execWarmup+runs {
		return nil, fmt.Errorf("spawn probe: %d runs reported, want %d", len(res.RunsNS), execWarmup+runs)
	}
	ds := make([]time.Duration, 0, runs)
	for _, ns := range res.RunsNS[execWarmup:] {
		ds = append(ds, time.Duration(ns))
	}
	return ds, nil
}

// guestPipe runs the pipe probe in sb (bin is airlock-probe): size bytes of zeros from dd
// through a pipe into the probe, timed inside the guest.
func guestPipe(ctx context.Context, sb *sandbox.Sandbox, bin string, size int64, timeout time.Duration) (Measurement, error) {
	var res probe.Pipe
	if err := runProbe(ctx, sb, bin, probe.PipeArgv(size), timeout, &res); err != nil {
		return Measurement{}, err
	}
	if res.Bytes != size || res.NS <= 0 {
		return Measurement{}, fmt.Errorf("pipe probe: %d bytes in %d ns reported, want %d bytes", res.Bytes, res.NS, size)
	}
	m := throughput(res.Bytes, time.Duration(res.NS))
	m.Runs = 1
	return m, nil
}

// runProbe runs argv, a probe, in sb and decodes what it prints into res.
// It first copies bin, the airlock-probe binary, to probe.Exe in the
// guest, unless a file is there already.
func runProbe(ctx context.Context, sb *sandbox.Sandbox, bin string, argv []string, timeout time.Duration, res any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := installProbe(ctx, sb, bin); err != nil {
		return err
	}
	var out bytes.Buffer
	if err := runInSandbox(ctx, sb, argv, &out); err != nil {
		return fmt.Errorf("%s probe: %w", argv[1], err)
	}
	if err := json.Unmarshal(out.Bytes(), res); err != nil {
		return fmt.Errorf("%s probe printed %q: %w", argv[1], clip(out.String()), err)
	}
	return nil
}

// installProbe copies bin to probe.Exe in sb's guest, unless a file is
// there already (a clone of a sandbox that had it, or an earlier probe).
func installProbe(ctx context.Context, sb *sandbox.Sandbox, bin string) error {
	c := sb.Agent()
	if c == nil {
		return errors.New("copy airlock-probe into the sandbox: no agent connection")
	}
	if _, err := c.Stat(ctx, probe.Exe); err == nil {
		return nil
	}
	f, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("airlock-probe for the guest's floors (make build puts it beside airlock): %w", err)
	}
	defer f.Close()
	if err := c.WriteFile(ctx, probe.Exe, 0o755, f); err != nil {
		return fmt.Errorf("copy airlock-probe into the sandbox: %w", err)
	}
	return nil
}

// auxDeviceCmd prints the guest's device of the auxiliary port, found by
// its name; busybox sh runs it.
const auxDeviceCmd = `for f in /sys/class/virtio-ports/*/name; do
	if [ "$(cat "$f")" = ` + vm.AuxPortName + ` ]; then d=${f%/name}; echo /dev/${d##*/}; fi
done`

// auxDevice finds the device of sb's auxiliary port in the guest.
func auxDevice(ctx context.Context, sb *sandbox.Sandbox) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := runRequest(ctx, sb, agentproto.ExecRequest{Cmd: auxDeviceCmd}, &out); err != nil {
		return "", fmt.Errorf("find the aux port in the guest: %w", err)
	}
	dev := strings.TrimSpace(out.String())
	if !strings.HasPrefix(dev, "/dev/vport") || strings.ContainsAny(dev, " \n") {
		return "", fmt.Errorf("find the aux port in the guest: found %q", dev)
	}
	return dev, nil
}

// auxArgv is the command that writes size bytes of zeros to the guest's
// device dev in 64 KiB writes, as streamArgv does to stdout.
func auxArgv(size int64, dev string) []string {
	return append(streamArgv(size), "of="+dev)
}

// auxReadBuf is the size of the host's reads from the aux socket: big
// enough that the host is never what limits the port.
const auxReadBuf = 256 << 10

// auxStream times one run of auxArgv in sb, whose bytes the host counts
// as they come out of the auxiliary port's socket: from the exec request
// to when both the command's exit status and the last byte are in, as
// stream times a run on stdout. The socket is connected first, untimed.
func auxStream(ctx context.Context, sb *sandbox.Sandbox, dev string, size int64, timeout time.Duration) (_ Measurement, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sb.Machine().AuxSocket())
	if err != nil {
		return Measurement{}, fmt.Errorf("connect to the aux port: %w", err)
	}
	defer conn.Close()
	// The end of ctx ends a read that would wait for bytes that never come.
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()

	var cw countingWriter
	read := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := io.CopyBuffer(&cw, io.LimitReader(conn, size), make([]byte, auxReadBuf))
		read <- err
	}()
	err = runInSandbox(ctx, sb, auxArgv(size, dev), nil)
	if err != nil {
		cancel()
	}
	rerr := <-read
	elapsed := time.Since(start)
	if err := errors.Join(err, rerr); err != nil {
		return Measurement{}, err
	}
	if cw.n != size {
		return Measurement{}, fmt.Errorf("received %d bytes from the aux port, want %d", cw.n, size)
	}
	m := throughput(size, elapsed)
	m.Runs = 1
	return m, nil
}

// medianRun is the run of ms (one run each) with the median time, by the
// nearest rank as stream picks it, with Runs set to how many there were.
func medianRun(ms []Measurement) Measurement {
	if len(ms) == 0 {
		return Measurement{}
	}
	sorted := slices.Clone(ms)
	slices.SortStableFunc(sorted, func(a, b Measurement) int { return cmp.Compare(a.Seconds, b.Seconds) })
	m := sorted[(len(sorted)+1)/2-1]
	m.Runs = len(ms)
	return m
}
