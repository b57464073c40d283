package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const sandboxTopAbout = `Shows the sandboxes the API key may see and what each running one uses
now: CPU, memory and disk as its guest sees them and, where the server
measures it, its VMM's CPU and memory on the host (the VMM_ columns, shown
when some sandbox has them). Other sandboxes are listed with their state.

The table is refreshed every --interval until Ctrl-C, which exits 0: on a
terminal it is redrawn in place, otherwise each table follows the last
after a blank line. --once prints one table and exits. --json prints, in
place of each table, one line of JSON per sandbox: {"id", "template",
"state", "vcpus", "metrics", "error"}, where metrics is the answer of GET
/v1/sandboxes/{id}/metrics or null. A sandbox that cannot be measured (it
stopped after it was listed, or gave no answer in 5 s) says why in its
row (ERROR) or its error.

  airlock sandbox top
  airlock sandbox top --interval 10s
  airlock sandbox top --once --json | jq -r 'select(.metrics.cpu_used_pct > 50) | .id'`

const (
	// minTopInterval is the shortest refresh: a guest measures its CPUs
	// over 200 ms.
	minTopInterval = 200 * time.Millisecond
	// topMeasureTimeout bounds the measures of one refresh.
	topMeasureTimeout = 5 * time.Second
	// topParallel is how many sandboxes are measured at once.
	topParallel = 8
)

// topRow is one sandbox as top shows it, and its --json line.
type topRow struct {
	ID       string                `json:"id"`
	Template string                `json:"template"`
	State    string                `json:"state"`
	VCPUs    int                   `json:"vcpus"`
	Metrics  *apiv1.SandboxMetrics `json:"metrics"`
	Error    *apiv1.Status         `json:"error"`
}

func runSandboxTop(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox top", "airlock sandbox top [FLAGS]", sandboxTopAbout, env)
	sf := addServerFlags(fs)
	interval := fs.Duration("interval", 2*time.Second, "how often to refresh, at least 200ms")
	once := fs.Bool("once", false, "print one table (or one round of --json lines) and exit")
	asJSON := fs.Bool("json", false, "print one line of JSON per sandbox instead of a table")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("sandbox top: unexpected arguments %q (see `airlock sandbox top -h`): %w", pos, errdefs.ErrInvalid)
	}
	if *interval < minTopInterval {
		return fmt.Errorf("sandbox top: --interval %s is under %s: %w", *interval, minTopInterval, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	live := !*asJSON && isTerminal(env.Stdout)
	for n := 0; ; n++ {
		start := time.Now()
		rows, err := topSample(ctx, c)
		if ctx.Err() != nil {
			return nil // interrupted: the last table stays as it was
		}
		if err != nil && (n == 0 || *once) {
			return err
		}
		var frame bytes.Buffer
		switch {
		case live:
			frame.WriteString("\033[H\033[2J")
			fmt.Fprintf(&frame, "airlock sandbox top  %s  every %s, Ctrl-C quits\n\n", start.Format("15:04:05"), *interval)
			if err != nil {
				fmt.Fprintf(&frame, "airlock: %s (retrying)\n", Message(err))
				break
			}
			printTopTable(&frame, rows)
		case err != nil:
			fmt.Fprintf(env.Stderr, "airlock: sandbox top: %s (retrying)\n", Message(err))
		case *asJSON:
			printTopJSON(&frame, rows)
		default:
			if n > 0 {
				frame.WriteString("\n")
			}
			printTopTable(&frame, rows)
		}
		if _, err := env.Stdout.Write(frame.Bytes()); err != nil {
			return fmt.Errorf("sandbox top: %w", err)
		}
		if *once {
			return nil
		}
		t := time.NewTimer(time.Until(start.Add(*interval)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// topSample lists the sandboxes and measures the running ones, a few at
// a time within topMeasureTimeout. A sandbox whose measure fails carries
// the error in its row.
func topSample(ctx context.Context, c *apiclient.Client) ([]topRow, error) {
	sbs, err := listAllSandboxes(ctx, c, apiclient.SandboxFilter{})
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithTimeout(ctx, topMeasureTimeout)
	defer cancel()
	rows := make([]topRow, len(sbs))
	slots := make(chan struct{}, topParallel)
	var wg sync.WaitGroup
	for i, sb := range sbs {
		rows[i] = topRow{ID: sb.ID, Template: sb.Template.Ref, State: sb.State, VCPUs: sb.VCPUs}
		if sb.State != apiv1.StateRunning {
			continue
		}
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			m, err := c.SandboxMetrics(mctx, sb.ID)
			if err != nil {
				rows[i].Error = topError(mctx, err)
				return
			}
			rows[i].Metrics = &m
		})
	}
	wg.Wait()
	return rows, nil
}

// topError is a failed measure as a row shows it.
func topError(ctx context.Context, err error) *apiv1.Status {
	var ae *apiclient.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &apiv1.Status{Code: apiv1.CodeUnavailable, Message: fmt.Sprintf("no answer in %s", topMeasureTimeout)}
	case errors.As(err, &ae):
		return &apiv1.Status{Code: ae.Code, Message: Message(err)}
	default:
		return &apiv1.Status{Code: apiv1.CodeInternal, Message: Message(err)}
	}
}

// hasVMM reports whether m has the host-side measures of the sandbox's
// VMM, which only some servers report.
func hasVMM(m *apiv1.SandboxMetrics) bool {
	return m != nil && (m.VMMCPUPct > 0 || m.VMMMemMiB > 0)
}

// printTopTable writes rows as a table: sizes in MiB as used/total, "-"
// where there is no measure.
func printTopTable(w io.Writer, rows []topRow) {
	vmm := slices.ContainsFunc(rows, func(r topRow) bool { return hasVMM(r.Metrics) })
	failed := slices.ContainsFunc(rows, func(r topRow) bool { return r.Error != nil })
	header := []string{"ID", "TEMPLATE", "STATE", "CPU%", "MEM(MiB)", "DISK(MiB)", "VCPUS"}
	if vmm {
		header = append(header, "VMM_CPU%", "VMM_MEM(MiB)")
	}
	if failed {
		header = append(header, "ERROR")
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		cells := []string{r.ID, r.Template, r.State, "-", "-", "-", strconv.Itoa(r.VCPUs)}
		m := r.Metrics
		if m != nil {
			cells[3] = strconv.FormatFloat(m.CPUUsedPct, 'f', 1, 64)
			cells[4] = fmt.Sprintf("%d/%d", m.MemUsedMiB, m.MemTotalMiB)
			cells[5] = fmt.Sprintf("%d/%d", m.DiskUsedMiB, m.DiskTotalMiB)
		}
		switch {
		case vmm && hasVMM(m):
			cells = append(cells, strconv.FormatFloat(m.VMMCPUPct, 'f', 1, 64), strconv.FormatInt(m.VMMMemMiB, 10))
		case vmm:
			cells = append(cells, "-", "-")
		}
		switch {
		case failed && r.Error != nil:
			cells = append(cells, r.Error.Message)
		case failed:
			cells = append(cells, "-")
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
}

// printTopJSON writes rows as JSON lines.
func printTopJSON(w io.Writer, rows []topRow) {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		enc.Encode(r)
	}
}
