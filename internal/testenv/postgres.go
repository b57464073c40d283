package testenv

import (
	"errors"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/localpg"
)

// Postgres is a throwaway PostgreSQL cluster for tests (internal/localpg).
type Postgres struct{ *localpg.Cluster }

// PostgresUser is the superuser of a test cluster.
const PostgresUser = localpg.User

var (
	sharedPG     *Postgres
	sharedPGErr  error
	sharedPGOnce sync.Once
)

// SharedPostgres returns the cluster of this test binary, started on first
// use; StopSharedPostgres (from TestMain) stops it. A host without
// PostgreSQL's server binaries is Lacking.
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	sharedPGOnce.Do(func() { sharedPG, sharedPGErr = StartPostgres() })
	if errors.Is(sharedPGErr, localpg.ErrNoServer) {
		Lacking(t, "%v", sharedPGErr)
	}
	if sharedPGErr != nil {
		t.Fatal(sharedPGErr)
	}
	return sharedPG
}

// RunWithPostgres is a TestMain body for packages that use SharedPostgres:
// it runs the tests, then stops the cluster, and returns the exit code.
//
//	func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }
func RunWithPostgres(m *testing.M) int {
	code := m.Run()
	StopSharedPostgres()
	return code
}

// StopSharedPostgres stops the cluster SharedPostgres started, if any.
func StopSharedPostgres() {
	if sharedPG != nil {
		sharedPG.Stop()
	}
}

// StartPostgres starts a cluster of the test's own; Stop stops it.
func StartPostgres() (*Postgres, error) {
	c, err := localpg.Start()
	if err != nil {
		return nil, err
	}
	return &Postgres{c}, nil
}

// NewDatabase creates an empty database and returns its URL. It is dropped
// at the end of the test.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	name, err := p.CreateDatabase()
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() { p.DropDatabase(name) })
	return p.URL(name)
}

// Exec runs a statement as the superuser in database db (for tests that
// break things: terminating connections, revoking rights).
func (p *Postgres) Exec(t testing.TB, db, query string, args ...any) {
	t.Helper()
	if err := p.Cluster.Exec(db, query, args...); err != nil {
		t.Fatal(err)
	}
}
