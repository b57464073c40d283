package sandbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/probe"
)

// patternChecker is a writer that checks it is given the probe's pattern
// (probe.PatternArgv, airlock-probe copied in) from its start, in order, nothing lost or
// repeated; delay, when set, sleeps that long every 256 KiB, a reader
// slower than the guest writes.
type patternChecker struct {
	off     int64
	word    [8]byte
	have    int
	err     error
	delay   time.Duration
	sincedl int64
}

func (c *patternChecker) Write(b []byte) (int, error) {
	for _, x := range b {
		if c.err != nil {
			break
		}
		c.word[c.have] = x
		c.have++
		if c.have == 8 {
			if got := binary.BigEndian.Uint64(c.word[:]); got != uint64(c.off) {
				c.err = fmt.Errorf("the word at offset %d is %d", c.off, got)
			}
			c.off += 8
			c.have = 0
		}
	}
	if c.delay > 0 {
		if c.sincedl += int64(len(b)); c.sincedl >= 256<<10 {
			c.sincedl = 0
			time.Sleep(c.delay)
		}
	}
	return len(b), nil
}

// TestOutputOrderVM streams 50 MiB of a pattern from a sandbox's stdout,
// once into a fast reader and once into one slower than the guest writes
// (at most 6.25 MiB/s): every byte arrives, in order, once, and the slow
// reader holds the guest back instead of losing output.
func TestOutputOrderVM(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	rt := agentRuntime(t, ctx)
	rt.cfg.ColdBoot = false
	sb, err := rt.Create(ctx, Spec{Template: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	copyProbe(ctx, t, sb)
	const size = 50 << 20
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{{"fast reader", 0}, {"slow reader", 40 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			c := &patternChecker{delay: tc.delay}
			began := time.Now()
			p, err := sb.Exec(ctx, agentproto.ExecRequest{Argv: probe.PatternArgv(size)}, agentclient.Stdio{Stdout: c})
			if err != nil {
				t.Fatal(err)
			}
			exit, err := sb.Wait(p)
			took := time.Since(began)
			if err != nil || exit.ExitCode != 0 {
				t.Fatalf("exit %+v, %v", exit, err)
			}
			if c.err != nil {
				t.Fatal(c.err)
			}
			if c.off != size || c.have != 0 {
				t.Fatalf("%d bytes arrived (and %d of a word), want %d", c.off, c.have, size)
			}
			t.Logf("%s: 50 MiB in %s (%.1f MiB/s)", tc.name, took.Round(time.Millisecond), 50/took.Seconds())
		})
	}
}
