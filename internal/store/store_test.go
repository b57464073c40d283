package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// t0 is a fixed time with nanoseconds, to check that times round-trip whole.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// testSandbox returns a sandbox with every field set.
func testSandbox(id, owner string) Sandbox {
	exp := t0.Add(15 * time.Minute)
	return Sandbox{
		ID: id, Owner: owner, State: "creating",
		TemplateRef: "base:latest", TemplateDigest: "sha256:0123abcd",
		VCPUs: 2, MemoryMiB: 512, DiskMiB: 2048, TimeoutS: 900, OnTimeout: "delete",
		Env:       map[string]string{"PATH": "/usr/bin", "LANG": "C.UTF-8"},
		Metadata:  map[string]string{"team": "infra"},
		Network:   json.RawMessage(`{"egress":"deny","allow":["example.com"]}`),
		CreatedAt: t0,
		ExpiresAt: &exp,
	}
}

// createOp returns the create operation of sandbox id.
func createOp(id, sandboxID, owner string) Operation {
	return Operation{ID: id, Kind: "create", TargetID: sandboxID, Owner: owner, Status: "pending", CreatedAt: t0}
}

// mustInsertSandbox inserts a sandbox made by testSandbox with its create
// operation and returns it.
func mustInsertSandbox(t *testing.T, s *Store, id, owner string) Sandbox {
	t.Helper()
	sb := testSandbox(id, owner)
	if err := s.InsertSandbox(context.Background(), sb, createOp("op"+id, id, owner)); err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestOpenSettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "home", "airlock.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	// A write makes the -wal file exist.
	if err := s.InsertKey(ctx, Key{ID: "key1", Name: "k", Role: "admin", Hash: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}

	for _, tc := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"busy_timeout", "5000"},
		{"foreign_keys", "1"},
		{"synchronous", "1"}, // NORMAL
	} {
		t.Run(tc.pragma, func(t *testing.T) {
			var got string
			if err := s.db.QueryRowContext(ctx, "PRAGMA "+tc.pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("PRAGMA %s = %s, want %s", tc.pragma, got, tc.want)
			}
		})
	}
}

func TestOpenInvalidPath(t *testing.T) {
	for _, path := range []string{"", filepath.Join(t.TempDir(), "a?mode=ro")} {
		if _, err := Open(path); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want invalid", path, err)
		}
	}
}

func testReopenKeepsData(t *testing.T, b backend) {
	ctx := context.Background()
	addr := b.newDB(t)
	s, err := b.openAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	want := mustInsertSandbox(t, s, "sbx1", "key1")
	want.UpdatedAt = want.CreatedAt
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Opening again must not apply a migration twice: the tables exist, so a
	// second CREATE TABLE would fail.
	s, err = b.openAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.SchemaVersion(ctx); err != nil || v != len(migrations) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations))
	}
	got, err := s.GetSandbox(ctx, "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen got %+v, want %+v", got, want)
	}
}

func testNewerSchemaRefused(t *testing.T, b backend) {
	addr := b.newDB(t)
	s, err := b.openAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	newer := len(migrations) + 1
	if err := setSchemaVersion(context.Background(), s.db, s.db.eng, newer); err != nil {
		t.Fatal(err)
	}
	s.Close()

	_, err = b.openAddr(addr)
	if !errors.Is(err, errdefs.ErrPrecondition) {
		t.Fatalf("Open = %v, want a precondition error", err)
	}
	want := fmt.Sprintf("the database was written by a newer airlock (schema %d > %d): upgrade airlock", newer, len(migrations))
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// Every lookup and update of a missing record reports not found.
func testNotFound(t *testing.T, b backend) {
	s := b.newStore(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"GetKey", func() error { _, err := s.GetKey(ctx, "keyx"); return err }},
		{"DeleteKey", func() error { return s.DeleteKey(ctx, "keyx") }},
		{"GetSandbox", func() error { _, err := s.GetSandbox(ctx, "sbxx"); return err }},
		{"UpdateSandbox", func() error { return s.UpdateSandbox(ctx, testSandbox("sbxx", "k")) }},
		{"TransitionSandbox", func() error {
			return s.TransitionSandbox(ctx, testSandbox("sbxx", "k"), createOp("opx", "sbxx", "k"))
		}},
		{"GetOperation", func() error { _, err := s.GetOperation(ctx, "opx"); return err }},
		{"UpdateOperation", func() error { return s.UpdateOperation(ctx, Operation{ID: "opx", Status: "running"}) }},
		{"InsertCommand", func() error { return s.InsertCommand(ctx, testCommand("cmdx", "sbxx")) }},
		{"GetCommand", func() error { _, err := s.GetCommand(ctx, "cmdx"); return err }},
		{"UpdateCommand", func() error { return s.UpdateCommand(ctx, testCommand("cmdx", "sbxx")) }},
		{"SpendCommandToken", func() error { return s.SpendCommandToken(ctx, "cmdx") }},
		{"GetIdempotent", func() error { _, err := s.GetIdempotent(ctx, "keyx", "k"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("got %v, want not found", err)
			}
		})
	}
	// TransitionSandbox must not have left its operation behind.
	if _, err := s.GetOperation(ctx, "opx"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("operation of a failed transition: %v", err)
	}
}

// writeMix does one of each kind of write for sandbox id.
func writeMix(ctx context.Context, s *Store, id string) error {
	sb := testSandbox(id, "key1")
	if err := s.InsertSandbox(ctx, sb, createOp("op"+id, id, "key1")); err != nil {
		return err
	}
	if err := s.InsertCommand(ctx, testCommand("cmd"+id, id)); err != nil {
		return err
	}
	sb.State = "running"
	if err := s.TransitionSandbox(ctx, sb, Operation{ID: "op" + id, TargetID: id, Status: "succeeded"}); err != nil {
		return err
	}
	if _, err := s.GetSandbox(ctx, id); err != nil {
		return err
	}
	if _, err := s.ListSandboxes(ctx, SandboxFilter{Limit: 10}); err != nil {
		return err
	}
	return s.PutIdempotent(ctx, Idempotent{KeyID: "key1", Key: id, Status: 202, Body: []byte(id)})
}

func testConcurrentWrites(t *testing.T, b backend) {
	ctx := context.Background()
	// Two stores on one database stand for two processes, which contend
	// for SQLite's lock rather than for the one connection of a store, or
	// for PostgreSQL's row locks from two connection pools.
	stores := b.openN(t, 2)
	const workers, each = 20, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			s := stores[w%len(stores)]
			for i := range each {
				if err := writeMix(ctx, s, fmt.Sprintf("sbx%dx%d", w, i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	list, err := stores[0].ListSandboxes(ctx, SandboxFilter{States: []string{"running"}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != workers*each {
		t.Errorf("%d running sandboxes, want %d", len(list), workers*each)
	}
	ops, err := stores[1].ListOperations(ctx, "succeeded")
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != workers*each {
		t.Errorf("%d succeeded operations, want %d", len(ops), workers*each)
	}
}

// A database locked by another process beyond busy_timeout is unavailable,
// which a caller may retry.
func TestLockedIsUnavailable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "airlock.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.db.db.Begin() // IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()

	// Another connection that does not wait for the lock.
	other, err := sql.Open("sqlite", path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.Exec("INSERT INTO keys (id, name, role, hash, created_at) VALUES ('key1', '', 'user', x'', 1)")
	if err == nil {
		t.Fatal("wrote while another connection held the lock")
	}
	if err := classify(err); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("classify(%v) is not unavailable", err)
	}
	if other := errors.New("other"); classify(other) != other {
		t.Error("classify changed an unrelated error")
	}
}
