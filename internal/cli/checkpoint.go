package cli

import (
	"context"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/diskspace"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func checkpointCommands() []command {
	return []command{
		{"create", "checkpoint a sandbox, which runs on, and print the checkpoint's ID", runCheckpointCreate},
		{"ls", "list checkpoints", runCheckpointList},
		{"get", "show a checkpoint", runCheckpointGet},
		{"rm", "delete checkpoints", runCheckpointRemove},
	}
}

func runCheckpoint(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "checkpoint", "Manages the checkpoints of sandboxes on an airlock server: a sandbox's memory,\nprocesses and disk at one instant, that sandboxes start from (`airlock sandbox\ncreate --checkpoint`) and that it rolls back to (`airlock sandbox rollback`).", checkpointCommands(), args)
}

const checkpointCreateAbout = `Checkpoints a running, paused or suspended sandbox, waits until the
checkpoint is ready and prints its ID. The sandbox runs on: its vCPUs stop
only for the copy of its memory (under KVM, only for the last of it); a
suspended one is checkpointed from its saved state and stays suspended. With --json it
prints {"checkpoint": ..., "operation": ...}.

  CHK=$(airlock checkpoint create --name before-migration sbx7k2m9q4w8e1r5t3y6u)
  airlock sandbox create --checkpoint $CHK`

func runCheckpointCreate(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("checkpoint create", "airlock checkpoint create [FLAGS] SBX", checkpointCreateAbout, env)
	sf := addServerFlags(fs)
	name := fs.String("name", "", "the checkpoint's `name`")
	noWait := fs.Bool("no-wait", false, "do not wait until the checkpoint is ready")
	asJSON := fs.Bool("json", false, "print the checkpoint and its operation as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("checkpoint create: give one sandbox ID (see `airlock checkpoint create -h`): %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	co, err := c.CreateCheckpoint(ctx, pos[0], apiv1.CreateCheckpoint{Name: *name})
	if err != nil {
		return err
	}
	if !*noWait {
		if co.Operation, err = waitOperation(ctx, env, c, co.Operation, "checkpointing"); err != nil {
			return err
		}
		if co.Checkpoint, err = c.GetCheckpoint(ctx, co.Checkpoint.ID); err != nil {
			return err
		}
	}
	if *asJSON {
		return printJSON(env.Stdout, co)
	}
	fmt.Fprintln(env.Stdout, co.Checkpoint.ID)
	return nil
}

const checkpointListAbout = `Lists the checkpoints you may see (an admin key: everyone's), oldest first,
or those of one sandbox with --sandbox.

  airlock checkpoint ls
  airlock checkpoint ls --sandbox sbx7k2m9q4w8e1r5t3y6u --json`

func runCheckpointList(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("checkpoint ls", "airlock checkpoint ls [FLAGS]", checkpointListAbout, env)
	sf := addServerFlags(fs)
	sbx := fs.String("sandbox", "", "only the checkpoints of this sandbox `ID`")
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("checkpoint ls: unexpected arguments %q: %w", pos, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	items, err := listAll(ctx, "checkpoints", func(lo apiclient.ListOptions) (apiv1.List[apiv1.Checkpoint], error) {
		return c.ListCheckpoints(ctx, *sbx, lo)
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, items)
	}
	return printCheckpointTable(env.Stdout, items, time.Now())
}

func printCheckpointTable(w io.Writer, items []apiv1.Checkpoint, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSANDBOX\tNAME\tSTATE\tSIZE\tCREATED")
	for _, k := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.SandboxID, k.Name, k.State, diskspace.Size(k.SizeBytes), age(now, k.CreatedAt))
	}
	return tw.Flush()
}

func runCheckpointGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("checkpoint get", "airlock checkpoint get CHK", "Shows a checkpoint as JSON.\n\n  airlock checkpoint get chk4n8q2w6e0r3t7y1u5i", env)
	sf := addServerFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("checkpoint get: give one checkpoint ID: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	chk, err := c.GetCheckpoint(ctx, pos[0])
	if err != nil {
		return err
	}
	return printJSON(env.Stdout, chk)
}

const checkpointRemoveAbout = `Deletes checkpoints and prints the ID of each one deleted. Their files go
once no sandbox made from them (or the sandbox they are of) needs them.

  airlock checkpoint rm chk4n8q2w6e0r3t7y1u5i`

func runCheckpointRemove(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("checkpoint rm", "airlock checkpoint rm CHK...", checkpointRemoveAbout, env)
	sf := addServerFlags(fs)
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("checkpoint rm: give the IDs of the checkpoints to delete: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	code := 0
	for _, id := range ids {
		if err := c.DeleteCheckpoint(ctx, id); err != nil {
			if len(ids) == 1 {
				return err
			}
			fmt.Fprintf(env.Stderr, "airlock: checkpoint rm %s: %s\n", id, Message(err))
			code = max(code, ExitCode(err))
			continue
		}
		fmt.Fprintln(env.Stdout, id)
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

const sandboxForkAbout = `Forks a running, paused or suspended sandbox: a checkpoint of it and -n sandboxes made
from it, each with the source's memory, processes and disk at that instant
and its own ID, hostname and random state. Waits until every child runs and
prints their IDs, one a line; a child that failed is reported and makes the
exit status non-zero. The source runs on.

  airlock sandbox fork -n 3 sbx7k2m9q4w8e1r5t3y6u`

func runSandboxFork(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox fork", "airlock sandbox fork [FLAGS] SBX", sandboxForkAbout, env)
	sf := addServerFlags(fs)
	n := fs.Int("n", 1, fmt.Sprintf("how many children (1 to %d)", apiv1.MaxForks))
	var timeout secondsFlag
	fs.Var(&timeout, "timeout", "each child's lease in `seconds` (or a duration: 15m) (default: the server's)")
	noWait := fs.Bool("no-wait", false, "do not wait until the children run")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("sandbox fork: give one sandbox ID (see `airlock sandbox fork -h`): %w", errdefs.ErrInvalid)
	}
	if *n < 1 || *n > apiv1.MaxForks {
		return fmt.Errorf("sandbox fork: -n %d is out of bounds: use 1 to %d: %w", *n, apiv1.MaxForks, errdefs.ErrInvalid)
	}
	req := apiv1.Fork{Count: *n}
	if timeout.set {
		req.TimeoutS = &timeout.n
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	f, err := c.Fork(ctx, pos[0], req)
	if err != nil {
		return err
	}
	if *noWait {
		for _, sb := range f.Sandboxes {
			fmt.Fprintln(env.Stdout, sb.ID)
		}
		return nil
	}
	if _, err := waitOperation(ctx, env, c, f.Operation, "checkpointing"); err != nil {
		return err
	}
	code := 0
	for _, sb := range f.Sandboxes {
		if _, err := waitSandbox(ctx, env, c, sb.ID); err != nil {
			fmt.Fprintf(env.Stderr, "airlock: sandbox fork: child %s: %s\n", sb.ID, Message(err))
			code = max(code, ExitCode(err))
			continue
		}
		fmt.Fprintln(env.Stdout, sb.ID)
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

const sandboxRollbackAbout = `Rolls a sandbox back to one of its checkpoints: its memory, processes and
disk return to that instant, under the same ID. Commands it was running end
(their streams say rolled_back). Works on running, paused and suspended
sandboxes; waits until it runs again and prints its ID.

  airlock sandbox rollback sbx7k2m9q4w8e1r5t3y6u chk4n8q2w6e0r3t7y1u5i`

func runSandboxRollback(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox rollback", "airlock sandbox rollback [FLAGS] SBX CHK", sandboxRollbackAbout, env)
	sf := addServerFlags(fs)
	noWait := fs.Bool("no-wait", false, "do not wait for the rollback to finish")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("sandbox rollback: give a sandbox ID and one of its checkpoints' IDs (see `airlock sandbox rollback -h`): %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	so, err := c.Rollback(ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if !*noWait {
		if _, err := waitOperation(ctx, env, c, so.Operation, "rolling back"); err != nil {
			return err
		}
	}
	fmt.Fprintln(env.Stdout, pos[0])
	return nil
}

// waitSandbox waits until sandbox id is no longer creating, showing
// progress, and returns it; one that failed is an error with its reason.
func waitSandbox(ctx context.Context, env *Env, c *apiclient.Client, id string) (apiv1.Sandbox, error) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { showProgress(env.Stderr, fmt.Sprintf("creating %s…", id), stop) })
	defer func() { close(stop); wg.Wait() }()
	sb, err := c.WaitSandbox(ctx, id)
	if err != nil && sb.State == apiv1.StateFailed {
		return sb, &ExitError{Code: 1, Err: err}
	}
	return sb, err
}
