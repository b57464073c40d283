package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/daemon/daemontest"
	"github.com/airlockhq/airlock/internal/datadir"
)

// TestMCPStdio speaks MCP to `airlock mcp` over its stdin and stdout:
// initialize, tools/list and a tools/call whose error comes back as a
// result; then it closes stdin and the command returns.
func TestMCPStdio(t *testing.T) {
	d := daemontest.Start(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(d.AdminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	var stderr bytes.Buffer
	env := &Env{Stdin: inR, Stdout: outW, Stderr: &stderr, Dir: datadir.Dir{Root: t.TempDir()}}
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), env, []string{"mcp", "--url", d.URL, "--key-file", keyFile})
		outW.Close()
	}()
	lines := bufio.NewScanner(outR)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	send := func(msg string) {
		if _, err := inW.WriteString(msg + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("airlock mcp wrote nothing more (%v); stderr: %s", lines.Err(), stderr.String())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("not JSON: %s", lines.Bytes())
		}
		return m
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if m := recv(); m["result"] == nil || !strings.Contains(mustJSON(m), `"name":"airlock"`) {
		t.Fatalf("initialize: %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if m := recv(); !strings.Contains(mustJSON(m), `"run_command"`) || !strings.Contains(mustJSON(m), `"fork_sandbox"`) {
		t.Fatalf("tools/list: %v", m)
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_command","arguments":{"sandbox_id":"sbxnosuch","command":"true"}}}`)
	if m := recv(); !strings.Contains(mustJSON(m), `"isError":true`) || !strings.Contains(mustJSON(m), "not_found") {
		t.Fatalf("a call on no sandbox: %v", m)
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("airlock mcp after stdin closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("airlock mcp did not return after its stdin closed")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestMCPBadFlags: what airlock mcp refuses before it serves.
func TestMCPBadFlags(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"mcp", "extra"}, "no arguments"},
		{[]string{"mcp", "--url", "ftp://x", "--key-file", empty}, "empty"},
		{[]string{"mcp", "--url", "ftp://x"}, "not an http"},
		{[]string{"mcp", "--key-file", filepath.Join(dir, "nope")}, "no such file"},
		{[]string{"mcp", "--key-file", empty}, "empty"},
		{[]string{"mcp", "--bogus"}, "bogus"},
	} {
		t.Setenv("AIRLOCK_API_KEY", "k")
		var out, errb bytes.Buffer
		env := &Env{Stdin: os.Stdin, Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: dir}}
		err := Run(context.Background(), env, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) || ExitCode(err) != 2 {
			t.Errorf("%v: %v (exit %d), want an error naming %q, exit 2", c.args, err, ExitCode(err), c.want)
		}
		if out.Len() != 0 {
			t.Errorf("%v wrote to stdout: %q", c.args, out.String())
		}
	}
}
