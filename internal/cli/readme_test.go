package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
)

// readmeCommand is one airlock command line found in README.md.
type readmeCommand struct {
	line int      // README.md's line
	args []string // after "airlock", up to a "--" or the end of the command
}

// readmeCommands returns the airlock command lines of README's fenced
// code blocks: each `airlock …` or `bin/airlock …` (also inside $(…), after
// a pipe and after a comment's "or:"), and each AIRLOCK_SERVE_FLAGS="…" as
// `airlock serve …`.
// A command ends at a shell operator, a comment or a closing parenthesis;
// what follows its " -- " is the guest's command, not airlock's.
func readmeCommands(t *testing.T, text string) []readmeCommand {
	t.Helper()
	// A command starts a line, a $(…), a pipeline's stage or a comment's
	// "or:".
	start := regexp.MustCompile(`(?:^\s*|\$\(|\|\s*|&&\s*|#\s*or:\s*)(?:bin/)?airlock (\S)`)
	serveFlags := regexp.MustCompile(`AIRLOCK_SERVE_FLAGS="([^"]*)"`)
	var out []readmeCommand
	inBlock := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			continue
		}
		for _, m := range serveFlags.FindAllStringSubmatch(line, -1) {
			out = append(out, readmeCommand{line: i + 1, args: append([]string{"serve"}, strings.Fields(m[1])...)})
		}
		rest := line
		for {
			loc := start.FindStringSubmatchIndex(rest)
			if loc == nil {
				break
			}
			cmd := rest[loc[2]:]
			rest = cmd
			if j := strings.Index(cmd, " -- "); j >= 0 {
				cmd = cmd[:j]
			}
			if j := strings.IndexAny(cmd, ")|<>;#"); j >= 0 {
				cmd = cmd[:j]
			}
			out = append(out, readmeCommand{line: i + 1, args: strings.Fields(cmd)})
		}
	}
	return out
}

// groups are the commands that take a subcommand.
func groups() map[string][]command {
	return map[string][]command{
		"sandbox": sandboxCommands(), "template": templateCommands(), "key": keyCommands(),
		"network": networkCommands(), "op": opCommands(), "secret": secretCommands(),
		"checkpoint": checkpointCommands(),
	}
}

// helpFlags runs `airlock PATH... -h` and returns the flags its help
// lists.
func helpFlags(t *testing.T, path []string) map[string]bool {
	t.Helper()
	var out bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &out, Dir: datadir.Dir{Root: t.TempDir()}}
	err := Run(context.Background(), env, append(append([]string(nil), path...), "-h"))
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("airlock %s -h: %v\n%s", strings.Join(path, " "), err, out.String())
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9-]*)`).FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	return flags
}

// Every airlock command line in README.md names a command (and a
// subcommand, for a group) that exists, with flags that command defines.
func TestReadmeCommands(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(t, string(b))
	top := map[string]bool{}
	for _, c := range commands() {
		top[c.name] = true
	}
	seen := map[string]bool{}
	for _, rc := range cmds {
		if len(rc.args) == 0 {
			t.Errorf("README.md:%d: airlock without a command", rc.line)
			continue
		}
		name := rc.args[0]
		if !top[name] {
			t.Errorf("README.md:%d: airlock %s: no such command", rc.line, name)
			continue
		}
		path, args := rc.args[:1], rc.args[1:]
		if subs, ok := groups()[name]; ok {
			if len(args) == 0 {
				t.Errorf("README.md:%d: airlock %s without a subcommand", rc.line, name)
				continue
			}
			found := false
			for _, s := range subs {
				found = found || s.name == args[0]
			}
			if !found {
				t.Errorf("README.md:%d: airlock %s %s: no such subcommand", rc.line, name, args[0])
				continue
			}
			path, args = rc.args[:2], rc.args[2:]
		}
		seen[strings.Join(path, " ")] = true
		flags := helpFlags(t, path)
		if len(flags) == 0 {
			t.Errorf("README.md:%d: airlock %s -h lists no flags", rc.line, strings.Join(path, " "))
		}
		for _, a := range args {
			if !strings.HasPrefix(a, "-") || a == "-" {
				continue
			}
			f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if flags[f] {
				continue
			}
			// -it: single-letter flags run together.
			combined := !strings.HasPrefix(a, "--") && len(f) > 1
			for _, l := range f {
				combined = combined && flags[string(l)]
			}
			if !combined {
				t.Errorf("README.md:%d: airlock %s: flag %s is not defined (airlock %s -h)", rc.line, strings.Join(rc.args, " "), a, strings.Join(path, " "))
			}
		}
	}
	// The parser finds what README.md certainly holds.
	for _, want := range []string{"sandbox create", "exec", "run", "serve", "template build", "key create", "bench", "port-forward"} {
		if !seen[want] {
			t.Errorf("no `airlock %s` found in README.md's code blocks (found %v)", want, seen)
		}
	}
	t.Logf("%d airlock command lines checked", len(cmds))
}

func TestReadmeCommandsParser(t *testing.T) {
	text := "prose: airlock run --nope\n```sh\n" +
		"SBX=$(bin/airlock sandbox create --template base)   # waits\n" +
		"bin/airlock exec $SBX -- python3 -c 'print(\"x\")'\n" +
		"make run AIRLOCK_SERVE_FLAGS=\"--warm 2:base\"   # or: bin/airlock serve --warm 2:base\n" +
		"echo data | airlock run -i -- wc -c\n" +
		"cat /var/lib/airlock/admin.key   # what airlock wrote\n" +
		"```\n"
	got := readmeCommands(t, text)
	want := [][]string{
		{"sandbox", "create", "--template", "base"},
		{"exec", "$SBX"},
		{"serve", "--warm", "2:base"},
		{"serve", "--warm", "2:base"},
		{"run", "-i"},
	}
	if len(got) != len(want) {
		t.Fatalf("found %v, want %v", got, want)
	}
	for i := range want {
		if strings.Join(got[i].args, " ") != strings.Join(want[i], " ") {
			t.Errorf("command %d = %q, want %q", i, got[i].args, want[i])
		}
	}
}
