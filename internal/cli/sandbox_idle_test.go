package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
)

// sandbox create --idle and --on-idle send idle_s and on_idle; bad values
// are refused before anything is sent.
func TestSandboxCreateIdle(t *testing.T) {
	var got []apiv1.CreateSandbox
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req apiv1.CreateSandbox
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Error(err)
		}
		got = append(got, req)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(202)
		json.NewEncoder(w).Encode(apiv1.SandboxOperation{Sandbox: apiv1.Sandbox{ID: "sbxidle"}, Operation: apiv1.Operation{ID: "opidle"}})
	}))
	defer srv.Close()
	t.Setenv("AIRLOCK_API_KEY", "test")
	run := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		err := Run(context.Background(), env, append([]string{"sandbox", "create", "--url", srv.URL, "--no-wait"}, args...))
		return out.String() + errb.String(), err
	}
	for _, tc := range []struct {
		args   []string
		idleS  int // -1: unset
		onIdle string
	}{
		{[]string{"--idle", "10m"}, 600, ""},
		{[]string{"--idle", "90", "--on-idle", "pause"}, 90, "pause"},
		{nil, -1, ""},
	} {
		got = nil
		if out, err := run(tc.args...); err != nil || len(got) != 1 {
			t.Fatalf("%v: %v, %d requests\n%s", tc.args, err, len(got), out)
		}
		idle := -1
		if got[0].IdleS != nil {
			idle = *got[0].IdleS
		}
		if idle != tc.idleS || got[0].OnIdle != tc.onIdle {
			t.Errorf("%v: idle_s %d, on_idle %q; want %d, %q", tc.args, idle, got[0].OnIdle, tc.idleS, tc.onIdle)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idle", "-5"}, "negative"},
		{[]string{"--idle", "soon"}, "not a number of seconds"},
		{[]string{"--idle", "1m", "--on-idle", "sleep"}, `--on-idle "sleep" is not suspend or pause`},
		{[]string{"--on-idle", "pause"}, "--on-idle needs --idle"},
	} {
		got = nil
		out, err := run(tc.args...)
		if err == nil || !strings.Contains(err.Error()+out, tc.want) || len(got) != 0 {
			t.Errorf("%v: %v, %d requests sent\n%s; want an error saying %q", tc.args, err, len(got), out, tc.want)
		}
	}
}
