package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }

func TestServeStoreFlags(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(strings.Repeat("a", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := testClusterTLS(t)
	cl := []string{"--cluster", "kubernetes", "--store", "postgres://u:hunter2@127.0.0.1:1/x", "--token-file", tok}
	t.Setenv("AIRLOCK_CLUSTER_TLS", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store-wait", "-1s"}, "--store-wait must not be negative"},
		{[]string{"--store", "sqlite:///tmp/x.db"}, "want a postgres:// or postgresql:// URL"},
		{[]string{"--store", "postgres://u:hunter2@127.0.0.1/x?sslmode=maybe"}, "sslmode is invalid"},
		{[]string{"--cluster", "nomad"}, "is not kubernetes"},
		{[]string{"--cluster", "kubernetes"}, "needs the cluster's PostgreSQL store"},
		{[]string{"--cluster", "kubernetes", "--store", "postgres://u:hunter2@127.0.0.1:1/x"}, "no internal token"},
		{[]string{"--cluster", "kubernetes", "--store", "postgres://u:hunter2@127.0.0.1:1/x", "--warm", "1:base"}, "not served in cluster mode yet"},
		{[]string{"--cluster", "kubernetes", "--store", "postgres://u:hunter2@127.0.0.1:1/x", "--kube-wait", "-1s"}, "--kube-wait must not be negative"},
		{cl, "give --cluster-tls DIR"},
		{[]string{"--cluster-tls", certs}, "--cluster-tls is for an API replica of a cluster"},
		{[]string{"--internal-listen", "127.0.0.1:0"}, "--internal-listen is for an API replica of a cluster"},
		{append(cl, "--cluster-tls", filepath.Join(certs, "node")), "is not a certificate of the CA in ca.crt for airlock-server"},
	} {
		var out, errb bytes.Buffer
		env := &Env{Stdout: &out, Stderr: &errb, Dir: datadir.Dir{Root: t.TempDir()}}
		err := Run(t.Context(), env, append([]string{"serve", "--listen", "127.0.0.1:0"}, tc.args...))
		if !errors.Is(err, errdefs.ErrInvalid) || ExitCode(err) != 2 || !strings.Contains(Message(err), tc.want) ||
			strings.Contains(Message(err), "hunter2") {
			t.Errorf("%q: exit %d, %v", tc.args, ExitCode(err), err)
		}
	}
}
