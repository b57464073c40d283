package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/airlockhq/airlock/internal/bench"
	"github.com/airlockhq/airlock/internal/errdefs"
)

const benchAbout = `Measures airlock against baselines taken in the same run on this machine,
and reports each as a ratio airlock/baseline (absolute timings are noisy;
the ratios compare across runs):

  boot                        sandbox create to agent ready vs a plain QEMU boot
  exec_rtt                    exec round trip of true vs fork/exec of /bin/true
  stdout_throughput           N MiB of dd if=/dev/zero on stdout vs the same on the host
  api_create_to_first_output  HTTP API create, command, attach to the first stdout
                              of echo hi vs runtime create and exec in-process
  api_exec_rtt                HTTP API exec of true (and a command session to its
                              exit) vs exec of true through the runtime in-process

The api_ scenarios serve the API in-process from a temporary data directory
that shares this one's boot artifacts and templates.

Prints JSON when --json is given or stdout is not a terminal, else a table.
Progress goes to stderr.

  airlock bench
  airlock bench --only boot --runs 10
  airlock bench --only api_create_to_first_output,api_exec_rtt --api-runs 3
  airlock bench --json -o bench.json`

func runBench(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("bench", "airlock bench [FLAGS]", benchAbout, env)
	tpl := fs.String("template", bench.DefaultTemplate, "template `ref` the sandboxes boot from")
	runs := fs.Int("runs", bench.DefaultBootRuns, "cold boots per side in the boot scenario")
	execRuns := fs.Int("exec-runs", bench.DefaultExecRuns, "execs per side in the exec_rtt and api_exec_rtt scenarios")
	mib := fs.Int("throughput-mib", bench.DefaultThroughputMiB, "`MiB` of stdout per side in the stdout_throughput scenario")
	apiRuns := fs.Int("api-runs", bench.DefaultAPIRuns, "sandboxes per side in the api_create_to_first_output scenario")
	only := fs.String("only", "", "comma-separated `scenarios` to run (default: all): "+strings.Join(bench.Scenarios(), ", "))
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	asJSON := fs.Bool("json", false, "print JSON even on a terminal")
	outFile := fs.String("o", "", "also write the JSON report to `file`")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected arguments %q: %w", fs.Args(), errdefs.ErrInvalid)
	}
	// Zero would mean "default" to bench.Config; on the command line it is
	// a mistake.
	for _, f := range []struct {
		name string
		v    int
	}{{"runs", *runs}, {"exec-runs", *execRuns}, {"throughput-mib", *mib}, {"api-runs", *apiRuns}} {
		if f.v < 1 {
			return fmt.Errorf("bench: --%s must be at least 1 (got %d): %w", f.name, f.v, errdefs.ErrInvalid)
		}
	}
	cfg := bench.Config{
		Dir: env.Dir, Accel: *accel, Template: *tpl,
		BootRuns: *runs, ExecRuns: *execRuns, ThroughputMiB: *mib, APIRuns: *apiRuns,
		Scenarios: splitScenarios(*only),
		Progress:  env.Stderr, Log: env.Log,
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *outFile != "" {
		// Fail now rather than after minutes of measuring.
		if fi, err := os.Stat(filepath.Dir(*outFile)); err != nil || !fi.IsDir() {
			return fmt.Errorf("bench: -o %s: directory %s does not exist: %w", *outFile, filepath.Dir(*outFile), errdefs.ErrInvalid)
		}
	}

	// ^C and TERM cancel the run, which then removes its sandboxes.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}

	var js bytes.Buffer
	if err := bench.WriteJSON(&js, rep); err != nil {
		return err
	}
	if *outFile != "" {
		if err := os.WriteFile(*outFile, js.Bytes(), 0o644); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
	}
	if *asJSON || !isTerminalWriter(env.Stdout) {
		if _, err := env.Stdout.Write(js.Bytes()); err != nil {
			return fmt.Errorf("bench: write report: %w", err)
		}
		return nil
	}
	return bench.WriteTable(env.Stdout, rep)
}

// splitScenarios splits a comma-separated flag value, dropping blanks.
func splitScenarios(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// isTerminalWriter reports whether w is a terminal.
func isTerminalWriter(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
