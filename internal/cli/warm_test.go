package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// A bad --warm is a bad flag: exit status 2, one line naming it, before
// the server opens anything.
func TestServeWarmFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--warm", "x"}, {"--warm", "-1"}, {"--warm", "65:base"}, {"--warm", "1.5"}, {"--warm", ""},
		{"--warm", "1:base", "--warm", "2:base"}, {"--warm", "1,1:base"},
	} {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		err := Run(t.Context(), env, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...))
		if !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 || !strings.Contains(Message(err), "warm") ||
			strings.Contains(Message(err), "\n") {
			t.Errorf("%q: exit %d, %v", args, ExitCode(err), err)
		}
	}
}

func TestWarmFlagParses(t *testing.T) {
	var f warmFlag
	for _, v := range []string{"2", "1:tiny,3:code-interpreter"} {
		if err := f.Set(v); err != nil {
			t.Fatalf("%q: %v", v, err)
		}
	}
	want := []sandbox.PoolSpec{{Template: "base", Size: 2}, {Template: "tiny", Size: 1}, {Template: "code-interpreter", Size: 3}}
	if len(f) != len(want) {
		t.Fatalf("pools %+v", f)
	}
	for i := range want {
		if f[i] != want[i] {
			t.Errorf("pool %d = %+v, want %+v", i, f[i], want[i])
		}
	}
	if f.String() != "2:base,1:tiny,3:code-interpreter" {
		t.Errorf("String = %q", f.String())
	}
}
