package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// Attaching to a command that ran: the replay after each Last-Event-ID a
// client can send, who may attach, and the attach token spent by the
// stream that delivered the exit. The sandbox is a suspended one, which
// this server looks after without a VM.
func TestAttachReplay(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	st, s := f.st, f.c
	owner := tenancy.Principal{KeyID: "keyowner", Role: apiv1.RoleUser}
	other := tenancy.Principal{KeyID: "keyother", Role: apiv1.RoleUser}

	sb := store.Sandbox{ID: ids.New("sbx"), Owner: owner.KeyID, State: apiv1.StateSuspended, TemplateRef: "tiny:latest",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: ids.New("op"), Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(apiv1.CommandRequest{Cmd: "echo out; echo err >&2; exit 3"})
	id, secret := ids.New("cmd"), ids.Secret()
	token := "act_" + id[3:] + "_" + secret
	code, pid := 3, 42
	rec := store.Command{ID: id, SandboxID: sb.ID, Owner: owner.KeyID, Request: raw, State: apiv1.CommandExited, PID: pid, ExitCode: &code,
		TokenHash: ids.SecretHash(secret), TokenExpiresAt: time.Now().Add(AttachTTL), CreatedAt: time.Now()}
	if err := st.InsertCommand(ctx, rec); err != nil {
		t.Fatal(err)
	}

	// The command's log, as its process wrote it.
	c, err := command.Open(id, s.logPath(sb.ID, id), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	close(ready)
	stdio := c.Stdio(ready)
	if err := c.Started(&agentclient.Process{PID: pid}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdio.Stdout, "out\n")
	io.WriteString(stdio.Stderr, "err\n")
	exit := apiv1.ExitEvent{ExitCode: code, DurationMS: 5}
	c.Exited(exit)
	c.Close()

	f.sb.look(sb.ID, nil)
	t.Cleanup(func() { f.sb.let(sb.ID); s.Close(sb.ID, time.Second) })

	type event struct {
		ID   int64
		Kind command.Kind
		Data string
		PID  int
		Exit *apiv1.ExitEvent
	}
	all := []event{
		{ID: 1, Kind: command.Start, PID: pid},
		{ID: 2, Kind: command.Stdout, Data: "out\n"},
		{ID: 3, Kind: command.Stderr, Data: "err\n"},
		{ID: 4, Kind: command.Exit, Exit: &exit},
	}
	read := func(t *testing.T, st *command.Stream) []event {
		t.Helper()
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out := []event{}
		for ev := range st.Events(ctx) {
			e := event{ID: ev.ID, Kind: ev.Kind, Data: string(ev.Data), Exit: ev.Exit}
			if ev.Start != nil {
				e.PID = ev.Start.PID
			}
			out = append(out, e)
		}
		if !errors.Is(st.Err(), io.EOF) {
			t.Fatalf("the stream ended with %v, want io.EOF", st.Err())
		}
		return out
	}

	tests := []struct {
		name  string
		auth  AttachAuth
		after int64
		want  []event
		err   error
	}{
		{"from the start", AttachAuth{Principal: &owner}, 0, all, nil},
		{"after a reconnect", AttachAuth{Principal: &owner}, 2, all[2:], nil},
		{"after the exit", AttachAuth{Principal: &owner}, 4, all[4:], nil},
		{"past the last event", AttachAuth{Principal: &owner}, 5, nil, errdefs.ErrInvalid},
		{"negative", AttachAuth{Principal: &owner}, -1, nil, errdefs.ErrInvalid},
		{"another key", AttachAuth{Principal: &other}, 0, nil, errdefs.ErrNotFound},
		{"a token of another command", AttachAuth{Token: "act_" + ids.New("cmd")[3:] + "_" + secret}, 0, nil, errdefs.ErrUnauthenticated},
		{"the token", AttachAuth{Token: token}, 3, all[3:], nil},
		{"the token once spent", AttachAuth{Token: token}, 0, nil, errdefs.ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream, err := s.Attach(ctx, tt.auth, id, tt.after)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("got %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := read(t, stream); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("events\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}

	// envd's Connect attaches from the present: an exited command gives
	// its exit alone.
	stream, err := s.AttachNow(ctx, owner, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, stream); !reflect.DeepEqual(got, all[3:]) {
		t.Fatalf("attach from the present: %+v", got)
	}
}

func TestCheckToken(t *testing.T) {
	now := time.Now()
	c := store.Command{ID: "cmdabcdefghij0123456789", TokenHash: ids.SecretHash("s3cret"), TokenExpiresAt: now.Add(time.Minute)}
	good := "act_abcdefghij0123456789_s3cret"
	if err := checkToken(c, good, now); err != nil {
		t.Fatalf("good token: %v", err)
	}
	if id, ok := CommandIDFromToken(good); !ok || id != c.ID {
		t.Errorf("CommandIDFromToken = %q %v", id, ok)
	}
	spent := c
	spent.TokenSpent = true
	tests := []struct {
		name  string
		cmd   store.Command
		token string
		now   time.Time
		msg   string
	}{
		{"wrong secret", c, "act_abcdefghij0123456789_other", now, "not valid"},
		{"another command", c, "act_zzzzzzzzzz0123456789_s3cret", now, "not valid"},
		{"no prefix", c, "abcdefghij0123456789_s3cret", now, "not valid"},
		{"expired", c, good, now.Add(2 * time.Minute), "expired"},
		{"spent", spent, good, now, "spent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkToken(tt.cmd, tt.token, tt.now)
			if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v, want unauthenticated saying %q", err, tt.msg)
			}
		})
	}
}

func TestToExec(t *testing.T) {
	tests := []struct {
		name string
		req  apiv1.CommandRequest
		ok   bool
	}{
		{"argv", apiv1.CommandRequest{Argv: []string{"ls"}}, true},
		{"cmd with pty", apiv1.CommandRequest{Cmd: "ls", PTY: &apiv1.PTY{Rows: 1, Cols: 1}}, true},
		{"neither", apiv1.CommandRequest{}, false},
		{"both", apiv1.CommandRequest{Argv: []string{"ls"}, Cmd: "ls"}, false},
		{"negative timeout", apiv1.CommandRequest{Cmd: "ls", TimeoutS: -1}, false},
		{"zero pty", apiv1.CommandRequest{Cmd: "ls", PTY: &apiv1.PTY{}}, false},
		{"env key with =", apiv1.CommandRequest{Cmd: "ls", Env: map[string]string{"A=B": "c"}}, false},
		{"relative cwd", apiv1.CommandRequest{Cmd: "ls", Cwd: "tmp"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, err := toExec(tt.req)
			if tt.ok != (err == nil) {
				t.Fatalf("toExec: %v", err)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("%v is not invalid", err)
			}
			if err == nil && x.TimeoutMS != int64(tt.req.TimeoutS)*1000 {
				t.Errorf("timeout %d ms", x.TimeoutMS)
			}
		})
	}
}
