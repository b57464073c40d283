package cli

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestNodeFlags: `airlock node` with a bad flag stops before it touches
// anything, with exit 2 and a message that names what to fix.
func TestNodeFlags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "token")
	if err := os.WriteFile(good, []byte(strings.Repeat("a", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tooshort"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte("this is not a kubeconfig: ["), 0o600); err != nil {
		t.Fatal(err)
	}
	pg := "postgres://u:hunter2@127.0.0.1:1/x?sslmode=disable"
	certs := testClusterTLS(t)
	base := []string{"node", "--listen", "127.0.0.1:0", "--name", "host-a", "--store", pg, "--token-file", good,
		"--cluster-tls", filepath.Join(certs, "node")}
	noTLS := []string{"node", "--listen", "127.0.0.1:0", "--name", "host-a", "--store", pg, "--token-file", good}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "--name", "host-a", "--token-file", good}, "must be the cluster's postgres:// URL"},
		{[]string{"node", "--name", "host-a", "--store", "sqlite:///x.db", "--token-file", good}, "must be the cluster's postgres:// URL"},
		{[]string{"node", "--name", "host-a", "--store", pg}, "no internal token"},
		{[]string{"node", "--name", "host-a", "--store", pg, "--token-file", short}, "at least 32 characters"},
		{[]string{"node", "--name", "host-a", "--store", pg, "--token-file", filepath.Join(dir, "none")}, "--token-file"},
		{[]string{"node", "--name", "Host_A", "--store", pg, "--token-file", good}, "is not a DNS name"},
		{[]string{"node", "--name", "a\x00b", "--store", pg, "--token-file", good}, "is not a DNS name"},
		{[]string{"node", "--name", strings.Repeat("a", 300), "--store", pg, "--token-file", good}, "1 to 253 characters"},
		{noTLS, "give --cluster-tls DIR"},
		{append(noTLS, "--cluster-tls", filepath.Join(certs, "server")), "is not a certificate of the CA in ca.crt for airlock-node"},
		{append(noTLS, "--cluster-tls", filepath.Join(dir, "none")), "cluster-certs"},
		{append(base, "--cpus", "0"), "must be positive"},
		{append(base, "--memory", "0"), "must be positive"},
		{append(base, "--lease-duration", "1s"), "between 4s and 10m"},
		{append(base, "--kube-wait", "-1s"), "must not be negative"},
		{append(base, "--default-egress", "maybe"), "is not allow or deny"},
		{append(base, "--egress-private", "127.0.0.0/8"), "--egress-private: \"127.0.0.0/8\" is not within a private range"},
		{append(base, "--advertise", "not-an-ip", "--kubeconfig", kc), "kubeconfig"},
		{append(base, "--kubeconfig", kc), "--kubeconfig " + kc},
		{append(base, "extra"), "unexpected argument"},
		{append(base, "--templates-from", "ftp://airlock"), "is not a base URL"},
		{append(base, "--templates-from", "http://a/?x=1"), "is not a base URL"},
		{append(base, "--templates-from", "http://u:p@a"), "is not a base URL"},
		{append(base, "--templates-from", "airlock.svc"), "is not a base URL"},
		{append(base, "--max-builds", "0"), "--max-builds and --max-build-context must be at least 1"},
		{append(base, "--max-build-context", "0"), "--max-builds and --max-build-context must be at least 1"},
		{append(base, "--e2b-domain", "e2b.test/x"), "is not a domain name"},
		{append(base, "--reclaim-interval", "10ms"), "between 1s and 24h"},
		{append(base, "--trusted-registries", "ghcr.io/x"), "is not a registry HOST[:PORT]"},
	} {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		t.Setenv("AIRLOCK_NODE_TOKEN", "")
		t.Setenv("AIRLOCK_STORE", "")
		t.Setenv("KUBECONFIG", "")
		t.Setenv("AIRLOCK_CLUSTER_TLS", "")
		err := Run(t.Context(), env, tc.args)
		if !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 || !strings.Contains(Message(err), tc.want) ||
			strings.Contains(Message(err), "hunter2") {
			t.Errorf("%q: exit %d, %v; want %q", tc.args, ExitCode(err), err, tc.want)
		}
		if entries, _ := os.ReadDir(env.Dir.Root); len(entries) > 0 {
			t.Errorf("%q left files in the data directory", tc.args)
		}
	}
}

// TestNodeStartChecks: on the cluster's store, the first node's internal
// token becomes the cluster's, and a node with another is refused before
// it registers; an apiserver that does not answer is tried again until
// --kube-wait, then named in the error.
func TestNodeStartChecks(t *testing.T) {
	storeURL := testenv.SharedPostgres(t).NewDatabase(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://%s\", insecure-skip-tls-verify: true}\n"+
		"users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n", addr)
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	home := "home"
	certs := testClusterTLS(t)
	run := func(token, wait string) (string, time.Duration, error) {
		t.Setenv("AIRLOCK_NODE_TOKEN", token)
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: filepath.Join(dir, home)}, Log: slog.New(slog.NewTextHandler(&errb, nil))}
		start := time.Now()
		err := Run(t.Context(), env, []string{"node", "--listen", "127.0.0.1:0", "--name", "host-a", "--kubeconfig", kc,
			"--store", storeURL, "--kube-wait", wait, "--cluster-tls", filepath.Join(certs, "node")})
		return errb.String(), time.Since(start), err
	}
	first, second := strings.Repeat("a", 40), strings.Repeat("b", 40)

	logs, took, err := run(first, "1500ms")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(Message(err), "the apiserver does not answer") ||
		!strings.Contains(Message(err), "gave up after 1.5s (--kube-wait)") {
		t.Errorf("an unreachable apiserver: %v", err)
	}
	if took < 700*time.Millisecond || took > 15*time.Second {
		t.Errorf("gave up after %s, want about 1.5s", took)
	}
	if !strings.Contains(logs, "apiserver unreachable; trying again") {
		t.Errorf("no retry was logged: %s", logs)
	}

	if _, _, err := run(second, "0s"); !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 ||
		!strings.Contains(Message(err), "the internal token is not the cluster's") {
		t.Errorf("another token: %v", err)
	}
	// The first token is still the cluster's.
	if _, _, err := run(first, "0s"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("the first token again: %v", err)
	}

	// A data directory with keys of its own is refused: what the cluster
	// sealed would not open there.
	home = "other"
	if _, _, err := run(first, "0s"); !errors.Is(err, errdefs.ErrPrecondition) || ExitCode(err) != 2 ||
		!strings.Contains(Message(err), "secrets.key is not the cluster's key") {
		t.Errorf("another secrets key: %v", err)
	}
	secretsKey, _ := os.ReadFile(filepath.Join(dir, "home", "secrets.key"))
	if err := os.WriteFile(filepath.Join(dir, "other", "secrets.key"), secretsKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(first, "0s"); !errors.Is(err, errdefs.ErrPrecondition) ||
		!strings.Contains(Message(err), "e2b-token.key is not the cluster's key") {
		t.Errorf("the cluster's secrets key and another E2B token key: %v", err)
	}
	// With the cluster's keys, a directory of its own is one more node.
	tokenKey, _ := os.ReadFile(filepath.Join(dir, "home", "e2b-token.key"))
	if err := os.WriteFile(filepath.Join(dir, "other", "e2b-token.key"), tokenKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(first, "0s"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("the cluster's keys in another directory: %v", err)
	}
}

// testClusterTLS is a directory `airlock cluster-certs` made.
func testClusterTLS(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tls")
	var out bytes.Buffer
	if err := Run(t.Context(), &Env{Stdout: &out, Stderr: &out}, []string{"cluster-certs", dir}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "create secret generic airlock-node-tls") {
		t.Errorf("cluster-certs printed %q, want the kubectl lines", out.String())
	}
	return dir
}
