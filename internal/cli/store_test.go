package cli

import (
	"bytes"
	"context"
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

func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }

func TestOpenServeStore(t *testing.T) {
	ctx := context.Background()
	env := &Env{Dir: datadir.Dir{Root: t.TempDir()}}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// No address: the SQLite file of the data directory.
	st, err := openServeStore(ctx, env, "", time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	if st.Engine() != "sqlite" {
		t.Errorf("engine %s, want sqlite", st.Engine())
	}
	st.Close()
	if _, err := os.Stat(env.Dir.Store()); err != nil {
		t.Errorf("no SQLite file: %v", err)
	}

	// Not PostgreSQL: refused, password masked.
	_, err = openServeStore(ctx, env, "mysql://u:hunter2@db/x", time.Second, log)
	if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "postgres://") {
		t.Errorf("a mysql URL: %v", err)
	}

	// Nothing listens: tried again until --store-wait, each try logged.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	start := time.Now()
	_, err = openServeStore(ctx, env, fmt.Sprintf("postgres://u:hunter2@127.0.0.1:%d/x?sslmode=disable", port), 1500*time.Millisecond, log)
	took := time.Since(start)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "gave up after 1.5s") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("an unreachable server: %v", err)
	}
	if took < 700*time.Millisecond || took > 10*time.Second {
		t.Errorf("gave up after %s, want about 1.5 s", took)
	}
	if n := strings.Count(logs.String(), "store unreachable; trying again"); n < 2 || strings.Contains(logs.String(), "hunter2") {
		t.Errorf("%d retries logged, want at least 2, without the password:\n%s", n, logs.String())
	}

	// A wrong password is not retried.
	pg := testenv.SharedPostgres(t)
	bad := strings.Replace(pg.URL("postgres"), testenv.PostgresUser+":", testenv.PostgresUser+":hunter2", 1)
	start = time.Now()
	_, err = openServeStore(ctx, env, bad, time.Minute, log)
	if err == nil || errors.Is(err, errdefs.ErrUnavailable) || time.Since(start) > 5*time.Second || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a wrong password: %v after %s", err, time.Since(start))
	}

	// The real one opens, on PostgreSQL.
	st, err = openServeStore(ctx, env, pg.NewDatabase(t), time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Engine() != "postgres" {
		t.Errorf("engine %s, want postgres", st.Engine())
	}
}

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
