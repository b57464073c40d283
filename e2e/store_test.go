package e2e

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/localpg"
	"github.com/airlockhq/airlock/internal/testenv"
)

// TestPostgresStore: airlock serve with --store keeps its store in
// PostgreSQL, with real VMs: a sandbox is created, runs commands, survives
// a SIGKILL of the server and is deleted, and every step is in the
// database's rows. A second server on the same database is refused. While
// PostgreSQL is down, calls fail with 503 and the server keeps serving;
// when it is back, calls succeed with no restart, and the server holds its
// lock again.
func TestPostgresStore(t *testing.T) {
	pg, err := testenv.StartPostgres()
	if err != nil {
		if errors.Is(err, localpg.ErrNoServer) {
			testenv.Lacking(t, "%v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop) // after the server's cleanups, which need it
	url := pg.NewDatabase(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stateOf := func(id string) string {
		t.Helper()
		var state string
		if err := db.QueryRow("SELECT state FROM sandboxes WHERE id = $1", id).Scan(&state); err != nil {
			t.Fatalf("sandbox %s in PostgreSQL: %v", id, err)
		}
		return state
	}

	s := newServerEnv(t, []string{"AIRLOCK_STORE=" + url})
	if !strings.Contains(s.output(), ", store postgres)") {
		t.Errorf("the server does not say its store is PostgreSQL:\n%s", s.output())
	}
	if _, err := os.Stat(filepath.Join(s.home, "airlock.db")); !os.IsNotExist(err) {
		t.Errorf("a server on PostgreSQL made a SQLite file: %v", err)
	}
	sb := s.createSandbox(t, s.key, apiv1.CreateSandbox{Template: "tiny"})
	if out := s.run(t, s.key, sb.ID, apiv1.CommandRequest{Cmd: "echo on postgres"}); out.stdout != "on postgres\n" {
		t.Fatalf("exec: %+v", out)
	}
	if st := stateOf(sb.ID); st != apiv1.StateRunning {
		t.Errorf("state in PostgreSQL %q, want running", st)
	}
	var commands int
	if err := db.QueryRow("SELECT count(*) FROM commands WHERE sandbox_id = $1", sb.ID).Scan(&commands); err != nil || commands != 1 {
		t.Errorf("%d commands in PostgreSQL (%v), want 1", commands, err)
	}

	// One server per database.
	other, err := launchServer(nil, "--store", url)
	if err == nil {
		t.Fatal("a second server started on the same database")
	}
	if !strings.Contains(err.Error(), "in use by another airlock serve") {
		t.Errorf("the second server did not say why: %v", err)
	}
	if strings.Contains(other.output(), pgPasswordOf(url)) {
		t.Errorf("the second server printed the password: %s", other.output())
	}

	// PostgreSQL goes down: calls fail with 503, saying so.
	pg.Down()
	code, body := s.call(t, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil)
	if code != 503 || !strings.Contains(string(body), apiv1.CodeUnavailable) {
		t.Errorf("with PostgreSQL down: %d %s, want 503 unavailable", code, body)
	}
	if err := pg.Up(); err != nil {
		t.Fatal(err)
	}
	var got apiv1.Sandbox
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID, s.key, nil, &got)
	if out := s.run(t, s.key, sb.ID, apiv1.CommandRequest{Cmd: "echo back"}); out.stdout != "back\n" {
		t.Errorf("exec after PostgreSQL came back: %+v", out)
	}
	// The server takes its lock again (it checks every 5 s).
	deadline := time.Now().Add(20 * time.Second)
	for {
		var held int
		db.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").Scan(&held)
		if held == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not take its lock again: %d advisory locks held\n%s", held, s.output())
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A SIGKILL of the server loses nothing: the restarted one finds the
	// sandbox in PostgreSQL and adopts its VM. A request it was running
	// when killed (its Idempotency-Key claimed, never answered) runs again
	// when retried, at once.
	s.stop(syscall.SIGKILL)
	adminID := "key" + strings.Split(s.key, "_")[1]
	if _, err := db.Exec("INSERT INTO idempotency (key_id, key, request_hash, status, body, created_at)"+
		" VALUES ($1, 'cut-short', '\\x00', 0, '', $2)", adminID, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code, body := s.call(t, "POST", "/v1/secrets", s.key, `{"name": "retried", "value": "v"}`, "Idempotency-Key", "cut-short"); code != 201 || time.Since(start) > 5*time.Second {
		t.Errorf("the retry of a request the killed server held: %d %s after %s, want 201 at once", code, body, time.Since(start))
	}
	if out := s.run(t, s.key, sb.ID, apiv1.CommandRequest{Cmd: "echo adopted"}); out.stdout != "adopted\n" {
		t.Errorf("exec after the restart: %+v", out)
	}
	var list apiv1.List[apiv1.Command]
	s.must(t, 200, "GET", "/v1/sandboxes/"+sb.ID+"/commands", s.key, nil, &list)
	if len(list.Items) != 3 {
		t.Errorf("%d commands listed after the restart, want 3", len(list.Items))
	}

	s.deleteSandbox(t, s.key, sb.ID)
	if st := stateOf(sb.ID); st != apiv1.StateDeleted {
		t.Errorf("state in PostgreSQL after delete %q, want deleted", st)
	}
}

// pgPasswordOf returns the password in a postgres:// URL.
func pgPasswordOf(url string) string {
	at := strings.Index(url, "@")
	return url[strings.LastIndex(url[:at], ":")+1 : at]
}
