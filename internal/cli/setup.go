package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/sandbox"
	"github.com/airlockhq/airlock/internal/setup"
)

const setupAbout = `Installs the Debian packages airlock needs (as root), fetches Debian's
cloud kernel, builds the initramfs with the guest agent, builds the
templates (tiny: busybox; base: Debian bookworm with python3;
code-interpreter: base with Jupyter, numpy, pandas and matplotlib and the
server of E2B's runCode on port 49999), checks
whether KVM can run the guest or software emulation (TCG) must be used, and
makes each template's snapshot, which new sandboxes are cloned from.
Every step is skipped when its result is already there; a failed step
leaves nothing half-written, so running setup again resumes.`

func runSetup(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("setup", "airlock setup [FLAGS]", setupAbout, env)
	mirror := fs.String("mirror", "", "Debian archive `URL` for the base template (default: the one apt uses)")
	templates := fs.String("templates", strings.Join(setup.DefaultTemplates(), ","), "comma-separated built-in `templates` to build")
	force := fs.Bool("force", false, "rebuild everything and probe the accelerator again")
	agent := fs.String("agent", "", "guest agent `binary` (default: airlock-agent beside this executable)")
	if err := parse(fs, args); err != nil {
		return err
	}
	agentPath := *agent
	if agentPath == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("setup: find own executable: %w", err)
		}
		agentPath = filepath.Join(filepath.Dir(self), "airlock-agent")
	}
	var names []string
	for _, t := range strings.Split(*templates, ",") {
		if t = strings.TrimSpace(t); t != "" {
			names = append(names, t)
		}
	}
	fmt.Fprintf(env.Stdout, "airlock setup: data directory %s\n", env.Dir.Root)
	if err := setup.Run(ctx, setup.Config{
		Dir: env.Dir, AgentPath: agentPath, Mirror: *mirror, Templates: names, Out: env.Stdout, Force: *force,
	}); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "accelerator: ... (a trial boot under KVM, up to %s)\n", 2*sandbox.ProbeTimeout)
	v, err := withHeartbeat(env, "accelerator", func() (sandbox.AccelVerdict, error) {
		return sandbox.ProbeAccel(ctx, env.Dir, env.Log, *force)
	})
	if err != nil {
		return fmt.Errorf("setup: probe accelerator: %w", err)
	}
	if v.Accel == "kvm" {
		fmt.Fprintf(env.Stdout, "accelerator: kvm (-cpu %s)\n", v.CPU)
	} else {
		fmt.Fprintf(env.Stdout, "accelerator: tcg, software emulation (KVM cannot run the guest here: %s)\n", v.Reason)
	}
	// Sandboxes start as clones of a template snapshot; make the built-in
	// templates' ones now rather than on the first create.
	rt, err := sandbox.New(ctx, sandbox.Config{Dir: env.Dir, Log: env.Log})
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for _, name := range names {
		start := time.Now()
		if _, err := withHeartbeat(env, "snapshot "+name, func() (sandbox.TemplateSnapshot, error) {
			return rt.TemplateSnapshot(ctx, sandbox.Spec{Template: name})
		}); err != nil {
			// Creates fall back to booting, so this is not fatal.
			fmt.Fprintf(env.Stdout, "snapshot %s: not made (%v); sandboxes of it boot instead of cloning\n", name, err)
			continue
		}
		fmt.Fprintf(env.Stdout, "snapshot %s: ready (%s)\n", name, time.Since(start).Round(100*time.Millisecond))
	}
	fmt.Fprintf(env.Stdout, "airlock is ready: try `airlock run -- echo hello`\n")
	return nil
}

// withHeartbeat runs f, printing how long it has been running every five
// seconds so that a slow step is never silent.
func withHeartbeat[T any](env *Env, step string, f func() (T, error)) (T, error) {
	start := time.Now()
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(env.Stdout, "%s: still working (%s)\n", step, time.Since(start).Round(time.Second))
			}
		}
	}()
	return f()
}
