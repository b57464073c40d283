package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }

func TestOpenStore(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// No address: the SQLite file of the data directory.
	st, err := OpenStore(ctx, dir.Store(), "", time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	if st.Engine() != "sqlite" {
		t.Errorf("engine %s, want sqlite", st.Engine())
	}
	st.Close()
	if _, err := os.Stat(dir.Store()); err != nil {
		t.Errorf("no SQLite file: %v", err)
	}

	// Not PostgreSQL: refused, password masked.
	_, err = OpenStore(ctx, dir.Store(), "mysql://u:hunter2@db/x", time.Second, log)
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
	_, err = OpenStore(ctx, dir.Store(), fmt.Sprintf("postgres://u:hunter2@127.0.0.1:%d/x?sslmode=disable", port), 1500*time.Millisecond, log)
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
	_, err = OpenStore(ctx, dir.Store(), bad, time.Minute, log)
	if err == nil || errors.Is(err, errdefs.ErrUnavailable) || time.Since(start) > 5*time.Second || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a wrong password: %v after %s", err, time.Since(start))
	}

	// The real one opens, on PostgreSQL.
	st, err = OpenStore(ctx, dir.Store(), pg.NewDatabase(t), time.Second, log)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Engine() != "postgres" {
		t.Errorf("engine %s, want postgres", st.Engine())
	}
}
