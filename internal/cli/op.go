package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func opCommands() []command {
	return []command{
		{"get", "show an operation, or wait for it to finish", runOpGet},
	}
}

func runOp(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "op", "Shows the operations (lifecycle changes) of an airlock server.", opCommands(), args)
}

const opGetAbout = `Shows an operation: what it changes and whether it has finished. With
--wait it first waits until the operation has finished, and then exits 1 if
the operation failed.

  airlock op get op4d8f2k9m1q7w3e5r6t
  airlock op get --wait --json op4d8f2k9m1q7w3e5r6t`

func runOpGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("op get", "airlock op get [FLAGS] OP", opGetAbout, env)
	sf := addServerFlags(fs)
	wait := fs.Bool("wait", false, "wait until the operation has finished")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("op get: give one operation ID, e.g. `airlock op get op…`: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	var op apiv1.Operation
	if *wait {
		op, err = c.WaitOperation(ctx, pos[0])
	} else {
		op, err = c.GetOperation(ctx, pos[0], 0)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		err = printJSON(env.Stdout, op)
	} else {
		err = printOperation(env.Stdout, op)
	}
	if err != nil {
		return err
	}
	if *wait && op.Status == apiv1.OpFailed {
		return &ExitError{Code: 1}
	}
	return nil
}

func printOperation(w io.Writer, op apiv1.Operation) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	rows := [][2]string{
		{"ID", op.ID},
		{"Kind", op.Kind},
		{"Target", op.TargetID},
		{"Status", op.Status},
	}
	if op.Error != nil {
		rows = append(rows, [2]string{"Error", op.Error.Code + ": " + op.Error.Message})
	}
	rows = append(rows, [2]string{"Created", formatTime(&op.CreatedAt)}, [2]string{"Finished", formatTime(op.FinishedAt)})
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}
