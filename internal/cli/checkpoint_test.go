package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/daemon/daemontest"
	"github.com/airlockhq/airlock/internal/datadir"
)

// The checkpoint commands refuse bad arguments before they call the
// server, and report what the server refuses: a checkpoint or sandbox
// that does not exist.
func TestCheckpointCommands(t *testing.T) {
	d := daemontest.Start(t)
	t.Setenv("AIRLOCK_API_KEY", d.AdminKey)
	run := func(args ...string) (string, string, error) {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		err := Run(context.Background(), env, append(args, "--url", d.URL))
		return out.String(), errb.String(), err
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"checkpoint", "create"}, 2, "give one sandbox ID"},
		{[]string{"checkpoint", "create", "sbxa", "sbxb"}, 2, "give one sandbox ID"},
		{[]string{"checkpoint", "get"}, 2, "give one checkpoint ID"},
		{[]string{"checkpoint", "rm"}, 2, "give the IDs"},
		{[]string{"checkpoint", "ls", "extra"}, 2, "unexpected arguments"},
		{[]string{"sandbox", "fork", "-n", "0", "sbxa"}, 2, "out of bounds"},
		{[]string{"sandbox", "fork", "-n", "101", "sbxa"}, 2, "out of bounds"},
		{[]string{"sandbox", "fork"}, 2, "give one sandbox ID"},
		{[]string{"sandbox", "rollback", "sbxa"}, 2, "give a sandbox ID and one of its checkpoints"},
		{[]string{"checkpoint", "get", "chkmissing"}, 2, "not found"},
		{[]string{"checkpoint", "rm", "chkmissing"}, 2, "not found"},
		{[]string{"checkpoint", "create", "sbxmissing"}, 2, "not found"},
		{[]string{"sandbox", "fork", "sbxmissing"}, 2, "not found"},
		{[]string{"sandbox", "rollback", "sbxmissing", "chkmissing"}, 2, "not found"},
		{[]string{"sandbox", "rollback", "sbxmissing", "../etc"}, 2, "checkpoint must be the ID"},
	} {
		_, _, err := run(c.args...)
		if err == nil || ExitCode(err) != c.code || !strings.Contains(Message(err), c.want) {
			t.Errorf("%q: %v (exit %d), want exit %d saying %q", c.args, err, ExitCode(err), c.code, c.want)
		}
	}
	out, _, err := run("checkpoint", "ls")
	if err != nil || strings.TrimSpace(out) != "ID  SANDBOX  NAME  STATE  SIZE  CREATED" {
		t.Errorf("checkpoint ls with none: %v %q", err, out)
	}
	if out, _, err := run("checkpoint", "ls", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("checkpoint ls --json with none: %v %q", err, out)
	}
}
