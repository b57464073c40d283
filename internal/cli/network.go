package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/gateway/policy"
)

// netFlagHelp describes --net.
const netFlagHelp = "egress `policy`: allow, deny, or a NetworkPolicy JSON file (see docs/network.md)"

// readNetworkPolicy reads --net's value: "allow" and "deny" are the
// policies without rules, anything else a file holding a NetworkPolicy
// ("-": stdin). It is checked here, so a bad file fails before any
// request; the server checks it again.
func readNetworkPolicy(env *Env, v string) (json.RawMessage, error) {
	var raw []byte
	switch v {
	case "allow", "deny":
		raw = []byte(`{"egress":"` + v + `"}`)
	case "-":
		b, err := io.ReadAll(io.LimitReader(env.Stdin, 1<<20+1))
		if err != nil {
			return nil, fmt.Errorf("read the network policy from stdin: %w", err)
		}
		raw = b
	default:
		b, err := os.ReadFile(v)
		if err != nil {
			return nil, fmt.Errorf("network policy: %v (give allow, deny, or a JSON file): %w", err, errdefs.ErrInvalid)
		}
		raw = b
	}
	if len(raw) > 1<<20 {
		return nil, fmt.Errorf("network policy %s is larger than 1 MiB: %w", v, errdefs.ErrInvalid)
	}
	if _, err := policy.Parse(raw); err != nil {
		return nil, fmt.Errorf("network policy %s: %w", v, err)
	}
	return raw, nil
}

func networkCommands() []command {
	return []command{
		{"set", "replace a sandbox's egress policy", runNetworkSet},
		{"log", "show a sandbox's egress log", runNetworkLog},
	}
}

func runNetwork(ctx context.Context, env *Env, args []string) error {
	return runGroup(ctx, env, "network", "Shows and changes the network of sandboxes on an airlock server: every\nflow and DNS query goes through the sandbox's gateway, which enforces its\negress policy (see docs/network.md).", networkCommands(), args)
}

const networkSetAbout = `Replaces the egress policy of a running, paused or suspended sandbox and
prints the sandbox. The gateway applies it at once: open connections the
new policy forbids are closed. POLICY is allow, deny, or a file holding a
NetworkPolicy ("-" reads it from stdin), for example:

  {"egress": "deny", "allow": ["pypi.org", "*.pythonhosted.org"],
   "credentials": [{"host": "api.openai.com", "header": "Authorization",
                    "secret": "openai", "format": "Bearer {}"}]}

  airlock network set sbx… policy.json
  airlock network set sbx… deny`

func runNetworkSet(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("network set", "airlock network set [FLAGS] SBX POLICY", networkSetAbout, env)
	sf := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print the sandbox as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("network set: give a sandbox ID and a policy (allow, deny or FILE.json), e.g. `airlock network set sbx… policy.json`: %w", errdefs.ErrInvalid)
	}
	raw, err := readNetworkPolicy(env, pos[1])
	if err != nil {
		return fmt.Errorf("network set: %w", err)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	sb, err := c.SetNetwork(ctx, pos[0], raw)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, sb)
	}
	fmt.Fprintf(env.Stdout, "%s: %s\n", sb.ID, sb.Network)
	return nil
}

const networkLogAbout = `Shows a sandbox's egress log, newest first: every connection and DNS
query its gateway judged, with the verdict, the reason and the bytes each
way (connections are listed when they end).

  airlock network log sbx…
  airlock network log --limit 20 --json sbx…`

func runNetworkLog(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("network log", "airlock network log [FLAGS] SBX", networkLogAbout, env)
	sf := addServerFlags(fs)
	limit := fs.Int("limit", 100, "show at most this many entries (1 to 1000)")
	asJSON := fs.Bool("json", false, "print a JSON array")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("network log: give one sandbox ID: %w", errdefs.ErrInvalid)
	}
	if *limit < 1 || *limit > 1000 {
		return fmt.Errorf("network log: --limit must be 1 to 1000: %w", errdefs.ErrInvalid)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	out, err := c.EgressLog(ctx, pos[0], *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.Stdout, out.Items)
	}
	return printEgressLog(env.Stdout, out.Items)
}

func printEgressLog(w io.Writer, items []apiv1.EgressEvent) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tPROTO\tHOST\tIP\tPORT\tVERDICT\tREASON\tOUT\tIN")
	for _, e := range items {
		host := e.Host
		if host == "" {
			host = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\n", e.Time.Local().Format(time.TimeOnly), e.Proto, host, e.IP, e.Port, e.Verdict, e.Reason, e.BytesOut, e.BytesIn)
	}
	return tw.Flush()
}

const portForwardAbout = `Forwards a local TCP port to a port in a sandbox, through the server:
each connection to 127.0.0.1:LOCAL becomes a connection to REMOTE inside
the sandbox (LOCAL defaults to REMOTE; 0 picks a free port). Runs until
interrupted. Prints the local address once it listens.

  airlock port-forward sbx… 8080
  airlock port-forward sbx… 15432:5432`

func runPortForward(ctx context.Context, env *Env, args []string) error {
	fs := newFlagSet("port-forward", "airlock port-forward [FLAGS] SBX [LOCAL:]REMOTE", portForwardAbout, env)
	sf := addServerFlags(fs)
	addr := fs.String("address", "127.0.0.1", "local `address` to listen on")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("port-forward: give a sandbox ID and [LOCAL:]REMOTE, e.g. `airlock port-forward sbx… 8080`: %w", errdefs.ErrInvalid)
	}
	local, remote, err := parsePortPair(pos[1])
	if err != nil {
		return fmt.Errorf("port-forward: %w", err)
	}
	c, err := sf.client(env)
	if err != nil {
		return err
	}
	id := pos[0]
	// Fail early, with the server's words, if the sandbox cannot be
	// reached.
	probe, err := c.Tunnel(ctx, id, remote)
	if err != nil {
		return err
	}
	probe.Close()
	ln, err := net.Listen("tcp", net.JoinHostPort(*addr, strconv.Itoa(local)))
	if err != nil {
		return fmt.Errorf("port-forward: listen: %v: %w", err, errdefs.ErrInvalid)
	}
	defer ln.Close()
	fmt.Fprintf(env.Stdout, "forwarding %s -> %s:%d\n", ln.Addr(), id, remote)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("port-forward: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			t, err := c.Tunnel(ctx, id, remote)
			if err != nil {
				fmt.Fprintf(env.Stderr, "airlock: port-forward: %v\n", err)
				return
			}
			defer t.Close()
			done := make(chan struct{}, 2)
			go func() { io.Copy(t, conn); done <- struct{}{} }()
			go func() { io.Copy(conn, t); done <- struct{}{} }()
			select {
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
}

// parsePortPair reads [LOCAL:]REMOTE.
func parsePortPair(s string) (local, remote int, err error) {
	l, r, ok := strings.Cut(s, ":")
	if !ok {
		l, r = "", s
	}
	bad := fmt.Errorf("%q is not [LOCAL:]REMOTE with ports from 1 to 65535 (LOCAL may be 0): %w", s, errdefs.ErrInvalid)
	remote, err = strconv.Atoi(r)
	if err != nil || remote < 1 || remote > 65535 {
		return 0, 0, bad
	}
	local = remote
	if ok {
		if local, err = strconv.Atoi(l); err != nil || local < 0 || local > 65535 {
			return 0, 0, bad
		}
	}
	return local, remote, nil
}

// errNoNet is what airlock run says about credentials, which need the
// server's secrets.
var errNoNet = errors.New("credential rules need stored secrets, which only `airlock serve` has: use `airlock sandbox create --net`")
