package cli

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// lifecycleCmd is a sandbox command that starts one operation per
// sandbox named and waits for them.
type lifecycleCmd struct {
	name, verb, doing, about string
	call                     func(c *apiclient.Client, ctx context.Context, id string, opts ...apiclient.CallOption) (apiv1.Operation, error)
}

// runLifecycle starts the operation on every sandbox first, so that they
// run side by side, then waits for each and prints the IDs it is done
// with. With several sandboxes each failure is reported and the exit
// status is the worst.
func runLifecycle(ctx context.Context, env *Env, args []string, lc lifecycleCmd) error {
	fs := newFlagSet("sandbox "+lc.name, "airlock sandbox "+lc.name+" [FLAGS] SBX...", lc.about, env)
	sf := addServerFlags(fs)
	noWait := fs.Bool("no-wait", false, "do not wait for the operations to finish")
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("sandbox %s: give the IDs of the sandboxes to %s: %w", lc.name, lc.verb, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	ops := make([]apiv1.Operation, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		ops[i], errs[i] = lc.call(c, ctx, id)
	}
	for i, id := range ids {
		if errs[i] == nil && !*noWait {
			_, errs[i] = waitOperation(ctx, env, c, ops[i], lc.doing)
		}
		if errs[i] == nil {
			fmt.Fprintln(env.Stdout, id)
		}
	}
	if len(ids) == 1 {
		return errs[0]
	}
	code := 0
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(env.Stderr, "airlock: sandbox %s %s: %s\n", lc.name, ids[i], Message(err))
			code = max(code, ExitCode(err))
		}
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

func runSandboxPause(ctx context.Context, env *Env, args []string) error {
	return runLifecycle(ctx, env, args, lifecycleCmd{"pause", "pause", "pausing",
		"Pauses sandboxes: their vCPUs stop and their memory stays resident.\n`airlock sandbox wake` resumes them.\n\n  airlock sandbox pause sbx7k2m9q4w8e1r5t3y6u",
		(*apiclient.Client).PauseSandbox})
}

func runSandboxSuspend(ctx context.Context, env *Env, args []string) error {
	return runLifecycle(ctx, env, args, lifecycleCmd{"suspend", "suspend", "suspending",
		"Suspends sandboxes: memory and device state go to disk next to the\nsandbox's disk and its VM exits, freeing its memory. `airlock sandbox wake`\nrestores it: processes go on where they were.\n\n  airlock sandbox suspend sbx7k2m9q4w8e1r5t3y6u",
		(*apiclient.Client).SuspendSandbox})
}

func runSandboxWake(ctx context.Context, env *Env, args []string) error {
	return runLifecycle(ctx, env, args, lifecycleCmd{"wake", "wake", "waking",
		"Wakes paused or suspended sandboxes.\n\n  airlock sandbox wake sbx7k2m9q4w8e1r5t3y6u",
		(*apiclient.Client).WakeSandbox})
}

const sandboxKeepAbout = `Sets a sandbox's lease: it ends --timeout from now, when the server applies
the sandbox's on_timeout (delete or suspend). 0 keeps it until removed.
Prints the new expiry.

  airlock sandbox keep --timeout 15m sbx7k2m9q4w8e1r5t3y6u`

func runSandboxKeep(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox keep", "airlock sandbox keep --timeout S SBX", sandboxKeepAbout, env)
	sf := addServerFlags(fs)
	var timeout secondsFlag
	fs.Var(&timeout, "timeout", "lease in `seconds` from now (or a duration: 15m); 0: no lease")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || !timeout.set {
		return fmt.Errorf("sandbox keep: give --timeout and one sandbox ID (see `airlock sandbox keep -h`): %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	sb, err := c.Keep(ctx, pos[0], timeout.n)
	if err != nil {
		return err
	}
	if sb.ExpiresAt == nil {
		fmt.Fprintf(env.Stdout, "%s has no lease\n", sb.ID)
	} else {
		fmt.Fprintf(env.Stdout, "%s expires at %s\n", sb.ID, sb.ExpiresAt.Format("2006-01-02T15:04:05Z07:00"))
	}
	return nil
}
