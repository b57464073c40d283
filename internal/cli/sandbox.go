package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func sandboxCommands() []command {
	return []command{
		{"create", "create a sandbox and print its ID", runSandboxCreate},
		{"ls", "list sandboxes", runSandboxList},
		{"top", "show what each sandbox uses, refreshed live", runSandboxTop},
		{"get", "show a sandbox", runSandboxGet},
		{"rm", "remove sandboxes", runSandboxRemove},
		{"pause", "pause sandboxes: their vCPUs stop, their memory stays", runSandboxPause},
		{"suspend", "suspend sandboxes: their memory goes to disk and their VMs exit", runSandboxSuspend},
		{"wake", "wake paused or suspended sandboxes", runSandboxWake},
		{"keep", "set a sandbox's lease", runSandboxKeep},
		{"fork", "fork a sandbox: N sandboxes with its memory, processes and disk", runSandboxFork},
		{"rollback", "roll a sandbox back to one of its checkpoints", runSandboxRollback},
		{"save", "save a sandbox's disk as a template", runSandboxSave},
	}
}

func runSandbox(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "sandbox", "Manages the sandboxes of an airlock server (`airlock serve`).", sandboxCommands(), args)
}

const sandboxCreateAbout = `Creates a sandbox on the airlock server, waits until it runs and prints
its ID. With --json it prints {"sandbox": ..., "operation": ...} instead.
With --no-wait it prints as soon as the server has accepted the request;
` + "`airlock op get --wait OP`" + ` waits later. Exits 1 if the sandbox fails to start.

  SBX=$(airlock sandbox create)
  airlock sandbox create --template tiny --memory 256 --timeout 15m -l owner=ci
  airlock sandbox create --net policy.json
  airlock sandbox create --idle 10m --on-idle pause`

func runSandboxCreate(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox create", "airlock sandbox create [FLAGS]", sandboxCreateAbout, env)
	sf := addServerFlags(fs)
	tpl := fs.String("template", "base", "template `ref`: name, name:tag or sha256:digest")
	vcpus := fs.Int("vcpus", 0, "virtual CPUs (default: the template's)")
	memory := fs.Int("memory", 0, "memory in `MiB` (default: the template's)")
	disk := fs.Int("disk", 0, "disk size in `MiB` (default: the template's)")
	var timeout secondsFlag
	fs.Var(&timeout, "timeout", "lease in `seconds` (or a duration: 15m): the sandbox is removed this long after it is created; 0 keeps it until removed (default: the server's)")
	var idleFor secondsFlag
	fs.Var(&idleFor, "idle", "suspend (or pause, see --on-idle) the sandbox once nothing has used it for this many `seconds` (or a duration: 10m); a call that needs it running (exec, commands, files, ports) then wakes it; 0 never (default)")
	onIdle := fs.String("on-idle", "", "what --idle does: suspend (default: memory saved to disk, the VM ends) or pause (vCPUs stop, memory stays)")
	vars := envFlags{}
	fs.Var(vars, "e", "default environment variable `KEY=VALUE` of its commands (repeatable)")
	labels := envFlags{}
	fs.Var(labels, "l", "metadata label `k=v` (repeatable)")
	netPolicy := fs.String("net", "", netFlagHelp+" (default: the server's)")
	chk := fs.String("checkpoint", "", "make it from this checkpoint `ID`: its memory, processes and disk, with the checkpoint's template, vCPUs and memory")
	noWait := fs.Bool("no-wait", false, "do not wait until the sandbox runs")
	asJSON := fs.Bool("json", false, "print the sandbox and its operation as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("sandbox create: unexpected arguments %q (see `airlock sandbox create -h`): %w", pos, errdefs.ErrInvalid)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"vcpus", *vcpus}, {"memory", *memory}, {"disk", *disk}} {
		if f.v < 0 {
			return fmt.Errorf("sandbox create: --%s must not be negative: %w", f.name, errdefs.ErrInvalid)
		}
	}
	switch *onIdle {
	case "", "suspend", "pause":
	default:
		return fmt.Errorf("sandbox create: --on-idle %q is not suspend or pause: %w", *onIdle, errdefs.ErrInvalid)
	}
	if *onIdle != "" && !idleFor.set {
		return fmt.Errorf("sandbox create: --on-idle needs --idle: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	req := apiv1.CreateSandbox{Template: *tpl, VCPUs: *vcpus, MemoryMiB: *memory, DiskMiB: *disk, Checkpoint: *chk, OnIdle: *onIdle}
	if *chk != "" && !fs.isSet("template") {
		req.Template = "" // the checkpoint's
	}
	if idleFor.set {
		req.IdleS = &idleFor.n
	}
	if *netPolicy != "" {
		if req.Network, err = readNetworkPolicy(env, *netPolicy); err != nil {
			return fmt.Errorf("sandbox create: %w", err)
		}
	}
	if timeout.set {
		req.TimeoutS = &timeout.n
	}
	if len(vars) > 0 {
		req.Env = vars
	}
	if len(labels) > 0 {
		req.Metadata = labels
	}
	so, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return err
	}
	var waitErr error
	if !*noWait {
		so.Operation, waitErr = waitOperation(ctx, env, c, so.Operation, "creating")
		if waitErr == nil || so.Operation.Done() {
			if sb, err := c.GetSandbox(ctx, so.Sandbox.ID); err == nil {
				so.Sandbox = sb
			}
		}
	}
	if *asJSON {
		if err := printJSON(env.Stdout, so); err != nil {
			return err
		}
	} else if waitErr == nil {
		fmt.Fprintln(env.Stdout, so.Sandbox.ID)
	}
	return waitErr
}

const sandboxListAbout = `Lists the sandboxes the API key may see, as a table or as a JSON array.
Removed sandboxes are left out unless --all (or --state deleted) is given.

  airlock sandbox ls
  airlock sandbox ls --state running -l owner=ci --json`

func runSandboxList(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox ls", "airlock sandbox ls [FLAGS]", sandboxListAbout, env)
	sf := addServerFlags(fs)
	state := fs.String("state", "", "only sandboxes in this `state`: "+strings.Join(apiv1.States, ", "))
	labels := envFlags{}
	fs.Var(labels, "l", "only sandboxes with the metadata label `k=v` (repeatable; all must match)")
	all := fs.Bool("all", false, "include removed sandboxes")
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("sandbox ls: unexpected arguments %q: %w", pos, errdefs.ErrInvalid)
	}
	if *state != "" && !slices.Contains(apiv1.States, *state) {
		return fmt.Errorf("sandbox ls: --state %q is not a state: use one of %s: %w", *state, strings.Join(apiv1.States, ", "), errdefs.ErrInvalid)
	}
	if *all && *state != "" {
		return fmt.Errorf("sandbox ls: give --all or --state, not both: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	states := []string{*state}
	if *all {
		states = []string{"", apiv1.StateDeleted} // the default list leaves deleted ones out
	}
	var items []apiv1.Sandbox
	seen := map[string]bool{}
	for _, st := range states {
		got, err := listAllSandboxes(ctx, c, apiclient.SandboxFilter{State: st, Metadata: labels})
		if err != nil {
			return err
		}
		for _, sb := range got {
			if !seen[sb.ID] {
				seen[sb.ID] = true
				items = append(items, sb)
			}
		}
	}
	if *all {
		sort.SliceStable(items, func(i, j int) bool { return items[i].CreatedAt.After(items[j].CreatedAt) })
	}
	if *asJSON {
		if items == nil {
			items = []apiv1.Sandbox{}
		}
		return printJSON(env.Stdout, items)
	}
	return printSandboxTable(env.Stdout, items, time.Now())
}

// listAllSandboxes follows the pages of a sandbox list to its end.
func listAllSandboxes(ctx context.Context, c *apiclient.Client, f apiclient.SandboxFilter) ([]apiv1.Sandbox, error) {
	return listAll(ctx, "sandboxes", func(lo apiclient.ListOptions) (apiv1.List[apiv1.Sandbox], error) {
		return c.ListSandboxes(ctx, f, lo)
	})
}

// listAll follows the pages of a list (of what: "keys", ...) to its end,
// asking for pages of 1000 with list.
func listAll[T any](ctx context.Context, what string, list func(apiclient.ListOptions) (apiv1.List[T], error)) ([]T, error) {
	items := []T{}
	seen := map[string]bool{}
	lo := apiclient.ListOptions{Limit: 1000}
	for {
		page, err := list(lo)
		if err != nil {
			return nil, err
		}
		items = append(items, page.Items...)
		if page.NextPageToken == "" {
			return items, nil
		}
		if seen[page.NextPageToken] {
			return nil, fmt.Errorf("list %s: the server answered page token %q twice", what, page.NextPageToken)
		}
		seen[page.NextPageToken] = true
		lo.PageToken = page.NextPageToken
	}
}

func printSandboxTable(w io.Writer, items []apiv1.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tCREATED")
	for _, sb := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Template.Ref, age(now, sb.CreatedAt))
	}
	return tw.Flush()
}

const sandboxGetAbout = `Shows a sandbox: its state, size, lease and labels.

  airlock sandbox get sbx7k2m9q4w8e1r5t3y6u
  airlock sandbox get --json sbx7k2m9q4w8e1r5t3y6u`

func runSandboxGet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("sandbox get", "airlock sandbox get [FLAGS] SBX", sandboxGetAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("sandbox get: give one sandbox ID, e.g. `airlock sandbox get sbx…`: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	sb, err := c.GetSandbox(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, sb)
	}
	return printSandbox(env.Stdout, sb)
}

func printSandbox(w io.Writer, sb apiv1.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	tpl := sb.Template.Ref
	if sb.Template.Digest != "" {
		tpl += " (" + sb.Template.Digest + ")"
	}
	expires := formatTime(sb.ExpiresAt)
	if sb.ExpiresAt == nil {
		expires = "never"
	}
	var labels []string
	for k, v := range sb.Metadata {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	rows := [][2]string{
		{"ID", sb.ID},
		{"State", sb.State},
		{"Template", tpl},
		{"vCPUs", fmt.Sprint(sb.VCPUs)},
		{"Memory", fmt.Sprintf("%d MiB", sb.MemoryMiB)},
		{"Disk", fmt.Sprintf("%d MiB", sb.DiskMiB)},
		{"Created", formatTime(&sb.CreatedAt)},
		{"Expires", expires},
		{"On timeout", sb.OnTimeout},
		{"Idle", idleText(sb)},
		{"Labels", strings.Join(labels, " ")},
	}
	if l := sb.Limits; l != nil {
		rows = append(rows, [2]string{"Host limits", fmt.Sprintf("cpu %d%%, memory %d MiB, %d processes, io weight %d", l.CPUPct, l.MemoryMiB, l.Pids, l.IOWeight)})
	}
	if sb.LastError != nil {
		rows = append(rows, [2]string{"Last error", sb.LastError.Code + ": " + sb.LastError.Message})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

const sandboxRemoveAbout = `Removes sandboxes with their disks, and prints the ID of each one
removed. With --no-wait it prints the IDs as soon as the server has accepted
the requests.

  airlock sandbox rm sbx7k2m9q4w8e1r5t3y6u
  airlock sandbox ls --json | jq -r '.[].id' | xargs airlock sandbox rm`

func runSandboxRemove(ctx context.Context, env *Env, args []string) error {
	return runLifecycle(ctx, env, args, lifecycleCmd{"rm", "remove", "removing", sandboxRemoveAbout, (*apiclient.Client).DeleteSandbox})
}

// idleText says what idleness does to sb.
func idleText(sb apiv1.Sandbox) string {
	if sb.IdleS <= 0 {
		return "never"
	}
	return fmt.Sprintf("%s after %s unused", sb.OnIdle, time.Duration(sb.IdleS)*time.Second)
}
