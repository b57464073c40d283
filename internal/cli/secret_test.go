package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// secretServer is the real API server over a real transport, with a store
// and a secrets box and no VMs: the secret commands need nothing more.
type secretServer struct {
	url string
	svc *service.Service
	key string // the admin key
	id  string // its ID
}

func newSecretServer(t *testing.T) *secretServer {
	t.Helper()
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(dir.Store())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	box, err := secrets.OpenBox(filepath.Join(dir.Root, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(ctx, service.Config{Dir: dir, Runtime: service.RuntimeOf(sandboxtest.New(t, dir)), Store: st, Secrets: box})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	key, err := svc.EnsureAdminKey(ctx, dir.AdminKey())
	if err != nil {
		t.Fatal(err)
	}
	p, err := svc.Authenticate(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Service: svc, Store: st}))
	t.Cleanup(srv.Close)
	return &secretServer{url: srv.URL, svc: svc, key: key, id: p.KeyID}
}

// run runs `airlock secret SUB --url URL ARGS...` with stdin from the
// given bytes.
func (s *secretServer) run(t *testing.T, stdin string, sub string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	t.Setenv("AIRLOCK_API_KEY", s.key)
	in, inw, perr := os.Pipe()
	if perr != nil {
		t.Fatal(perr)
	}
	defer in.Close()
	go func() {
		io.WriteString(inw, stdin)
		inw.Close()
	}()
	var out, errb bytes.Buffer
	env := &Env{Stdin: in, Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
	full := append([]string{"secret", sub, "--url", s.url}, args...)
	err = Run(context.Background(), env, full)
	return out.String(), errb.String(), err
}

// value is the stored value of name, or "" when there is none.
func (s *secretServer) value(t *testing.T, name string) string {
	t.Helper()
	v, err := s.svc.SecretValue(context.Background(), s.id, name)
	if err != nil {
		return ""
	}
	return v
}

func TestSecretSet(t *testing.T) {
	s := newSecretServer(t)
	stdout, _, err := s.run(t, "sk-one\n", "set", "openai")
	if err != nil || stdout != "secret openai created\n" {
		t.Fatalf("set: %q, %v", stdout, err)
	}
	if v := s.value(t, "openai"); v != "sk-one" {
		t.Errorf("stored %q, want the value without its newline", v)
	}
	stdout, _, err = s.run(t, "sk-two", "set", "openai")
	if err != nil || stdout != "secret openai replaced\n" || s.value(t, "openai") != "sk-two" {
		t.Fatalf("replace: %q, %v, stored %q", stdout, err, s.value(t, "openai"))
	}

	dir := t.TempDir()
	for _, tc := range []struct {
		content, want string
	}{
		{"ghp_token\r\n", "ghp_token"},
		{"line one\nline two\n\n", "line one\nline two\n"}, // only one newline goes
		{"-----BEGIN KEY-----\nabc\n-----END KEY-----", "-----BEGIN KEY-----\nabc\n-----END KEY-----"},
	} {
		file := filepath.Join(dir, "value")
		if err := os.WriteFile(file, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		// The flag may come after the name, and stdin is not read.
		if _, _, err := s.run(t, "from stdin", "set", "github", "--value-file", file); err != nil {
			t.Fatal(err)
		}
		if v := s.value(t, "github"); v != tc.want {
			t.Errorf("--value-file holding %q stored %q, want %q", tc.content, v, tc.want)
		}
	}
}

func TestSecretSetBadInput(t *testing.T) {
	s := newSecretServer(t)
	if _, _, err := s.run(t, "kept", "set", "keep"); err != nil {
		t.Fatal(err)
	}
	const value = "sk-never-shown"
	notUTF8 := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(notUTF8, []byte(value+"\xff\xfe"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		stdin string
		args  []string
		msg   string
	}{
		{"value on the command line", "", []string{"keep", value}, "never the command line"},
		{"no name", value, nil, "give one NAME"},
		{"empty stdin", "", []string{"keep"}, "the value is empty"},
		{"only a newline", "\n", []string{"keep"}, "the value is empty"},
		{"too large", strings.Repeat("x", maxSecretValue+1), []string{"keep"}, "the value is over 65536 bytes"},
		{"not UTF-8", value + "\xff", []string{"keep"}, "not UTF-8 text"},
		{"not UTF-8 in a file", "", []string{"--value-file", notUTF8, "keep"}, "not UTF-8 text"},
		{"missing file", "", []string{"--value-file", filepath.Join(t.TempDir(), "none"), "keep"}, "--value-file: open"},
		{"name with a slash", value, []string{"a/keep"}, `secret name "a/keep" is not valid`},
		{"name of 65 characters", value, []string{strings.Repeat("k", 65)}, "use 1 to 64 letters"},
		{"name ..", value, []string{".."}, `secret name ".." is not valid`},
		{"unknown flag", value, []string{"--value", value, "keep"}, "flag provided but not defined: -value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := s.run(t, tc.stdin, "set", tc.args...)
			if ExitCode(err) != 2 || !strings.Contains(Message(err), tc.msg) {
				t.Fatalf("exit %d (%v), want 2 saying %q", ExitCode(err), err, tc.msg)
			}
			if strings.Contains(err.Error()+stdout+stderr, value) && tc.name != "unknown flag" {
				t.Errorf("the value was printed: %v %q %q", err, stdout, stderr)
			}
			if v := s.value(t, "keep"); v != "kept" {
				t.Errorf("the stored value changed to %q", v)
			}
			l, _ := s.svc.ListSecrets(context.Background(), service.Principal{KeyID: s.id}, 0, "")
			if len(l.Items) != 1 {
				t.Errorf("secrets after a refused set: %+v", l.Items)
			}
		})
	}
}

func TestSecretListAndRemove(t *testing.T) {
	s := newSecretServer(t)
	stdout, _, err := s.run(t, "", "ls", "--json")
	if err != nil || strings.TrimSpace(stdout) != "[]" {
		t.Fatalf("empty ls --json: %q, %v", stdout, err)
	}
	for _, n := range []string{"openai", "github", "aws.key"} {
		if _, _, err := s.run(t, "v-"+n, "set", n); err != nil {
			t.Fatal(err)
		}
	}
	stdout, _, err = s.run(t, "", "ls")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 4 || strings.Fields(lines[0])[0] != "NAME" || !strings.Contains(lines[0], "CREATED") || !strings.Contains(lines[0], "UPDATED") {
		t.Fatalf("ls table:\n%s", stdout)
	}
	var names []string
	for _, l := range lines[1:] {
		names = append(names, strings.Fields(l)[0])
	}
	if !slices.Equal(names, []string{"aws.key", "github", "openai"}) {
		t.Errorf("ls names %q, want them by name", names)
	}
	if strings.Contains(stdout, "v-") {
		t.Errorf("ls shows values:\n%s", stdout)
	}
	stdout, _, err = s.run(t, "", "ls", "--json")
	var items []apiv1.Secret
	if err != nil || json.Unmarshal([]byte(stdout), &items) != nil || len(items) != 3 || items[0].Name != "aws.key" || items[0].CreatedAt.IsZero() {
		t.Fatalf("ls --json: %q, %v", stdout, err)
	}
	if _, _, err := s.run(t, "", "ls", "extra"); ExitCode(err) != 2 {
		t.Errorf("ls with an argument: %v", err)
	}

	stdout, _, err = s.run(t, "", "rm", "github")
	if err != nil || stdout != "github\n" || s.value(t, "github") != "" {
		t.Fatalf("rm: %q, %v", stdout, err)
	}
	_, _, err = s.run(t, "", "rm", "github")
	if ExitCode(err) != 2 || !strings.Contains(Message(err), "secret github is not stored for this key") {
		t.Fatalf("rm of a missing secret: exit %d, %v", ExitCode(err), err)
	}
	stdout, stderr, err := s.run(t, "", "rm", "openai", "nope", "aws.key")
	if stdout != "openai\naws.key\n" || ExitCode(err) != 2 || !strings.Contains(stderr, "airlock: secret rm nope: secret nope is not stored") {
		t.Fatalf("rm of several: stdout %q, stderr %q, exit %d", stdout, stderr, ExitCode(err))
	}
	if _, _, err := s.run(t, "", "rm"); ExitCode(err) != 2 {
		t.Errorf("rm without names: %v", err)
	}
}

func TestSecretUsage(t *testing.T) {
	s := newSecretServer(t)
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
	if err := Run(context.Background(), env, []string{"secret"}); ExitCode(err) != 2 || !strings.Contains(errb.String(), "airlock secret COMMAND") {
		t.Errorf("secret without a command: %v, %q", err, errb.String())
	}
	if err := Run(context.Background(), env, []string{"secret", "get", "x"}); !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 {
		t.Errorf("secret get (no such command): %v", err)
	}
	_, stderr, err := s.run(t, "", "set", "-h")
	if ExitCode(err) != 0 || !strings.Contains(stderr, "Usage: airlock secret set [FLAGS] NAME") ||
		!strings.Contains(stderr, "never from the command line") || !strings.Contains(stderr, "in ps") || !strings.Contains(stderr, "-value-file") {
		t.Errorf("set -h: exit %d, help:\n%s", ExitCode(err), stderr)
	}
}
