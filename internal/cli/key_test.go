package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
)

// runKey runs `airlock key SUB --url URL ARGS...` against s with the API
// key apiKey.
func (s *secretServer) runKey(t *testing.T, apiKey, sub string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	t.Setenv("AIRLOCK_API_KEY", apiKey)
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
	err = Run(context.Background(), env, append([]string{"key", sub, "--url", s.url}, args...))
	return out.String(), errb.String(), err
}

func TestKeyCreateListRemove(t *testing.T) {
	s := newSecretServer(t)
	ctx := context.Background()

	// --e2b: the key alone on stdout, the warning on stderr.
	stdout, stderr, err := s.runKey(t, s.key, "create", "--name", "notebook", "--e2b")
	if err != nil {
		t.Fatal(err)
	}
	e2bKey := strings.TrimSuffix(stdout, "\n")
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(e2bKey) || strings.Count(stdout, "\n") != 1 {
		t.Fatalf("create --e2b printed %q, want the key on one line", stdout)
	}
	if !strings.Contains(stderr, "shown only this once") || !strings.Contains(stderr, "format e2b") || strings.Contains(stderr, e2bKey) {
		t.Errorf("create --e2b said on stderr %q", stderr)
	}
	p, err := s.svc.Authenticate(ctx, e2bKey)
	if err != nil || p.Role != apiv1.RoleUser {
		t.Fatalf("the e2b key: %+v, %v", p, err)
	}

	// The flags may come in any order; without --e2b the native form.
	stdout, _, err = s.runKey(t, s.key, "create", "--role", "admin", "--json", "--name", "ops")
	var admin apiv1.KeyCreated
	if err != nil || json.Unmarshal([]byte(stdout), &admin) != nil || admin.Role != apiv1.RoleAdmin ||
		admin.Format != apiv1.KeyFormatAirlock || !strings.HasPrefix(admin.Key, "alk_") || admin.Name != "ops" {
		t.Fatalf("create --json: %q, %v", stdout, err)
	}
	if pa, err := s.svc.Authenticate(ctx, admin.Key); err != nil || !pa.Admin() || pa.KeyID != admin.ID {
		t.Fatalf("the admin key: %+v, %v", pa, err)
	}
	stdout, _, err = s.runKey(t, s.key, "create")
	if err != nil || !strings.HasPrefix(stdout, "alk_") {
		t.Fatalf("create with no flags: %q, %v", stdout, err)
	}

	// ls: every key with its format, never a secret.
	stdout, _, err = s.runKey(t, s.key, "ls")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 5 || !slices.Equal(strings.Fields(lines[0]), []string{"ID", "NAME", "ROLE", "FORMAT", "CREATED"}) {
		t.Fatalf("ls table:\n%s", stdout)
	}
	var rows []string
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		rows = append(rows, f[1]+" "+f[2]+" "+f[3])
	}
	if rows[0] != "admin admin airlock" || rows[1] != "notebook user e2b" || rows[2] != "ops admin airlock" || !strings.HasSuffix(rows[3], " user airlock") {
		t.Errorf("ls rows %q", rows)
	}
	if strings.Contains(stdout, e2bKey) || strings.Contains(stdout, admin.Key) || strings.Contains(stdout, "alk_") {
		t.Errorf("ls shows secrets:\n%s", stdout)
	}
	stdout, _, err = s.runKey(t, s.key, "ls", "--json")
	var items []apiv1.Key
	if err != nil || json.Unmarshal([]byte(stdout), &items) != nil || len(items) != 4 || items[1].ID != p.KeyID || items[1].Format != "e2b" {
		t.Fatalf("ls --json: %q, %v", stdout, err)
	}
	// The e2b key works on the native API, and sees only itself.
	stdout, _, err = s.runKey(t, e2bKey, "ls", "--json")
	if err != nil || json.Unmarshal([]byte(stdout), &items) != nil || len(items) != 1 || items[0].ID != p.KeyID {
		t.Fatalf("ls with the e2b key: %q, %v", stdout, err)
	}

	// rm: the ID of each key revoked; the key stops working.
	stdout, _, err = s.runKey(t, s.key, "rm", p.KeyID)
	if err != nil || stdout != p.KeyID+"\n" {
		t.Fatalf("rm: %q, %v", stdout, err)
	}
	if _, err := s.svc.Authenticate(ctx, e2bKey); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a revoked e2b key still works: %v", err)
	}
	_, _, err = s.runKey(t, e2bKey, "ls")
	if ExitCode(err) != 2 || !strings.Contains(Message(err), "the API key is not valid") {
		t.Errorf("ls with a revoked key: exit %d, %v", ExitCode(err), err)
	}
	stdout, stderr, err = s.runKey(t, s.key, "rm", admin.ID, "keynope", p.KeyID)
	if stdout != admin.ID+"\n" || ExitCode(err) != 2 || !strings.Contains(stderr, `airlock: key rm keynope: key "keynope" not found`+"\n") ||
		!strings.Contains(stderr, "airlock: key rm "+p.KeyID+`: key "`+p.KeyID+`" not found`+"\n") {
		t.Fatalf("rm of several: stdout %q, stderr %q, exit %d", stdout, stderr, ExitCode(err))
	}
	// The last admin key stays.
	_, _, err = s.runKey(t, s.key, "rm", s.id)
	if ExitCode(err) != 2 || !strings.Contains(Message(err), "last admin key") {
		t.Errorf("rm of the last admin key: exit %d, %v", ExitCode(err), err)
	}
}

func TestKeyBadInput(t *testing.T) {
	s := newSecretServer(t)
	user, err := s.svc.CreateKey(context.Background(), adminOf(t, s), apiv1.CreateKey{Name: "u", Format: apiv1.KeyFormatE2B})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		l, err := s.svc.ListKeys(context.Background(), adminOf(t, s), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	before := count()
	tests := []struct {
		name string
		key  string
		sub  string
		args []string
		msg  string
	}{
		{"bad role", s.key, "create", []string{"--role", "root"}, `--role "root" is not user or admin`},
		{"role in capitals", s.key, "create", []string{"--role", "Admin"}, `--role "Admin" is not user or admin`},
		{"a positional name", s.key, "create", []string{"ci"}, "unexpected arguments"},
		{"empty name", s.key, "create", []string{"--name", ""}, "name is required"},
		{"name of two lines", s.key, "create", []string{"--name", "a\nb"}, "name is required: one line"},
		{"unknown flag", s.key, "create", []string{"--format", "e2b"}, "flag provided but not defined: -format"},
		{"a value for --e2b", s.key, "create", []string{"--e2b=yes"}, "invalid boolean value"},
		{"a user key creates", user.Key, "create", []string{"--e2b"}, "only an admin key may create keys"},
		{"a user key revokes", user.Key, "rm", []string{user.ID}, "only an admin key may delete keys"},
		{"ls with an argument", s.key, "ls", []string{"extra"}, "unexpected arguments"},
		{"rm without IDs", s.key, "rm", nil, "give the IDs of the keys to revoke"},
		{"rm of something not a key", s.key, "rm", []string{"sbx123"}, `key "sbx123" not found`},
		{"no such key", "e2b_" + strings.Repeat("0", 40), "ls", nil, "the API key is not valid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, _, err := s.runKey(t, tc.key, tc.sub, tc.args...)
			if ExitCode(err) != 2 || !strings.Contains(Message(err), tc.msg) {
				t.Fatalf("exit %d (%v), want 2 saying %q", ExitCode(err), err, tc.msg)
			}
			if stdout != "" {
				t.Errorf("stdout %q", stdout)
			}
			if n := count(); n != before {
				t.Errorf("%d keys, want %d", n, before)
			}
		})
	}
}

func TestKeyUsage(t *testing.T) {
	s := newSecretServer(t)
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
	if err := Run(context.Background(), env, []string{"key"}); ExitCode(err) != 2 || !strings.Contains(errb.String(), "airlock key COMMAND") {
		t.Errorf("key without a command: %v, %q", err, errb.String())
	}
	if err := Run(context.Background(), env, []string{"key", "show", "x"}); !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 {
		t.Errorf("key show (no such command): %v", err)
	}
	out.Reset()
	if err := Run(context.Background(), env, []string{"help"}); err != nil || !strings.Contains(out.String(), "create, list, limit and remove API keys") {
		t.Errorf("help does not list key: %v\n%s", err, out.String())
	}
	_, stderr, err := s.runKey(t, s.key, "create", "-h")
	if ExitCode(err) != 0 || !strings.Contains(stderr, "Usage: airlock key create [FLAGS]") ||
		!strings.Contains(stderr, "shown this once") || !strings.Contains(stderr, "-e2b") || !strings.Contains(stderr, "E2B_API_KEY") {
		t.Errorf("create -h: exit %d, help:\n%s", ExitCode(err), stderr)
	}
}

// adminOf is the principal of s's admin key.
func adminOf(t *testing.T, s *secretServer) service.Principal {
	t.Helper()
	p, err := s.svc.Authenticate(context.Background(), s.key)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
