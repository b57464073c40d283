package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/daemon"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func keyCommands() []command {
	return []command{
		{"create", "create an API key and print it once", runKeyCreate},
		{"ls", "list the API keys", runKeyList},
		{"get", "show a key's limits and what it holds", runKeyGet},
		{"set-limits", "replace a key's limits", runKeySetLimits},
		{"rm", "revoke API keys", runKeyRemove},
	}
}

func runKey(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "key",
		"Manages the API keys of an airlock server (`airlock serve`). An admin key sees and\n"+
			"manages everything; a user key sees and touches only the sandboxes it created.\n"+
			"Creating and revoking keys needs an admin key.",
		keyCommands(), args)
}

const keyCreateAbout = `Creates an API key on the airlock server and prints it on stdout. The key
is shown this once: the server keeps only a hash of it, so store it now.
With --json it prints {"id", "name", "role", "format", "key", "created_at"}
instead. Needs an admin key.

--limit sets the key's own limits, NAME=N[,NAME=N…] (repeatable), the
names those of the API's Limits: sandboxes, vcpus, memory_mib, disk_mib,
suspended_mib, checkpoints, builds, build_context_mib. A user key takes
the server's --default-limits for the ones it does not set.

A key reads alk_…; with --e2b it reads e2b_ and 40 hex digits, the form
E2B's SDKs accept as E2B_API_KEY (see airlock serve --e2b-listen). Either
works on both APIs, with the same role: a user key sees and touches only
the sandboxes it created, an admin key everything.

  airlock key create --name ci-runner
  export E2B_API_KEY=$(airlock key create --name notebook --e2b)
  airlock key create --name ops --role admin --json
  airlock key create --name team-a --limit sandboxes=5,memory_mib=8192`

func runKeyCreate(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("key create", "airlock key create [FLAGS]", keyCreateAbout, env)
	sf := addServerFlags(fs)
	name := fs.String("name", defaultKeyName(), "`label` of the key, one line of at most 128 bytes")
	role := fs.String("role", apiv1.RoleUser, "role of the key: user or admin")
	e2b := fs.Bool("e2b", false, "make a key of E2B's form, e2b_ and 40 hex digits")
	asJSON := fs.Bool("json", false, "print the key and what it is as JSON")
	var limits limitsFlag
	fs.Var(&limits, "limit", "the key's own `limits`, NAME=N[,NAME=N…]; repeatable")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("key create: unexpected arguments %q (name the key with --name): %w", pos, errdefs.ErrInvalid)
	}
	if *role != apiv1.RoleUser && *role != apiv1.RoleAdmin {
		return fmt.Errorf("key create: --role %q is not user or admin: %w", *role, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	req := apiv1.CreateKey{Name: *name, Role: *role, Format: apiv1.KeyFormatAirlock}
	if limits.set {
		req.Limits = &limits.l
	}
	if *e2b {
		req.Format = apiv1.KeyFormatE2B
	}
	k, err := c.CreateKey(ctx, req)
	if err != nil {
		return err
	}
	if *asJSON {
		err = printJSON(env.Stdout, k)
	} else {
		_, err = fmt.Fprintln(env.Stdout, k.Key)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "created key %s (%s, %s, format %s); it is shown only this once: the server keeps just a hash\n",
		k.ID, k.Name, k.Role, k.Format)
	return nil
}

// defaultKeyName labels a key with who made it where, as ssh-keygen does.
func defaultKeyName() string {
	user := os.Getenv("USER")
	if user == "" {
		user = "airlock"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return user
	}
	return user + "@" + host
}

const keyListAbout = `Lists the API keys with their role and format, as a table or as a JSON
array; never their secrets. An admin key lists every key, a user key only
itself.

  airlock key ls
  airlock key ls --json | jq -r '.[] | select(.format == "e2b") | .id'`

func runKeyList(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("key ls", "airlock key ls [FLAGS]", keyListAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("key ls: unexpected arguments %q: %w", pos, errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	items, err := listAllKeys(ctx, c)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, items)
	}
	return printKeyTable(env.Stdout, items, time.Now())
}

// listAllKeys follows the pages of the key list to its end.
func listAllKeys(ctx context.Context, c *apiclient.Client) ([]apiv1.Key, error) {
	return listAll(ctx, "keys", func(lo apiclient.ListOptions) (apiv1.List[apiv1.Key], error) {
		return c.ListKeys(ctx, lo)
	})
}

func printKeyTable(w io.Writer, items []apiv1.Key, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tROLE\tFORMAT\tCREATED")
	for _, k := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Role, k.Format, age(now, k.CreatedAt))
	}
	return tw.Flush()
}

const keyRemoveAbout = `Revokes API keys and prints the ID of each one revoked: calls made with
a revoked key are refused from then on. Its sandboxes are not touched (an
admin key still sees them). The last admin key cannot be revoked: create
another admin key first. Needs an admin key.

  airlock key rm key8h2j4k6m8n1p3q5r7
  airlock key ls --json | jq -r '.[] | select(.name == "ci-runner") | .id' | xargs airlock key rm`

func runKeyRemove(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("key rm", "airlock key rm [FLAGS] ID...", keyRemoveAbout, env)
	sf := addServerFlags(fs)
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("key rm: give the IDs of the keys to revoke (see `airlock key ls`): %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	return removeEach(env, "key rm", ids, func(x string) error { return c.DeleteKey(ctx, x) })
}

// limitsFlag reads --limit NAME=N[,NAME=N…], repeatable: later names win.
type limitsFlag struct {
	l   apiv1.Limits
	set bool
}

func (f *limitsFlag) String() string { return "" }

func (f *limitsFlag) Set(s string) error {
	l, err := daemon.ParseLimits(s)
	if err != nil {
		return err
	}
	merge(&f.l, l)
	f.set = true
	return nil
}

// merge sets in dst the limits that src sets.
func merge(dst *apiv1.Limits, src apiv1.Limits) {
	b, _ := json.Marshal(src)
	json.Unmarshal(b, dst)
}

const keyGetAbout = `Shows an API key: its role, the limits in force (its own, and for a user
key the server's defaults for the rest) and what it holds now. With no ID
it shows the calling key. A user key may show only itself.

  airlock key get
  airlock key get key8h2j4k6m8n1p3q5r7 --json`

func runKeyGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("key get", "airlock key get [FLAGS] [ID]", keyGetAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print the key as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	id := "self"
	switch len(pos) {
	case 0:
	case 1:
		id = pos[0]
	default:
		return fmt.Errorf("key get: give at most one key ID: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	k, err := c.GetKey(ctx, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, k)
	}
	return printKeyLimits(env.Stdout, k)
}

// printKeyLimits writes a key and a table of its limits against its usage.
func printKeyLimits(w io.Writer, k apiv1.Key) error {
	fmt.Fprintf(w, "%s  %s  %s  %s\n", k.ID, k.Name, k.Role, k.Format)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tIN USE\tMAX")
	var u apiv1.Usage
	if k.Usage != nil {
		u = *k.Usage
	}
	for _, r := range []struct {
		name  string
		inUse string
		max   *int64
	}{
		{"sandboxes", fmt.Sprint(u.Sandboxes), k.Limits.Sandboxes},
		{"vcpus", fmt.Sprint(u.VCPUs), k.Limits.VCPUs},
		{"memory_mib", fmt.Sprint(u.MemoryMiB), k.Limits.MemoryMiB},
		{"disk_mib", fmt.Sprint(u.DiskMiB), k.Limits.DiskMiB},
		{"suspended_mib", fmt.Sprint(u.SuspendedMiB), k.Limits.SuspendedMiB},
		{"checkpoints", fmt.Sprint(u.Checkpoints), k.Limits.Checkpoints},
		{"builds", fmt.Sprint(u.Builds), k.Limits.Builds},
		{"build_context_mib", "-", k.Limits.BuildContextMiB},
	} {
		max := "none"
		if r.max != nil {
			max = fmt.Sprint(*r.max)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.name, r.inUse, max)
	}
	return tw.Flush()
}

const keySetLimitsAbout = `Replaces the limits of an API key with those given, NAME=N[,NAME=N…]
(repeatable); the ones not given take the server's defaults again (for a
user key), so --limit with nothing else clears the key's own limits. What
the key holds already is kept: the limits apply to what it asks for next.
Needs an admin key.

  airlock key set-limits key8h2j4k6m8n1p3q5r7 --limit sandboxes=10,vcpus=16
  airlock key set-limits key8h2j4k6m8n1p3q5r7 --clear`

func runKeySetLimits(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("key set-limits", "airlock key set-limits [FLAGS] ID", keySetLimitsAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print the key as JSON")
	clear := fs.Bool("clear", false, "drop the key's own limits")
	var limits limitsFlag
	fs.Var(&limits, "limit", "the key's `limits`, NAME=N[,NAME=N…]; repeatable")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("key set-limits: give one key ID (see airlock key ls): %w", errdefs.ErrInvalid)
	}
	if limits.set == *clear {
		return fmt.Errorf("key set-limits: give --limit NAME=N, or --clear to drop the key's own limits: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	k, err := c.SetKeyLimits(ctx, pos[0], limits.l)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, k)
	}
	return printKeyLimits(env.Stdout, k)
}
