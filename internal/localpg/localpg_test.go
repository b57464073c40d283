package localpg_test

import (
	"database/sql"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/localpg"
	"github.com/airlockhq/airlock/internal/testenv"
)

// A cluster starts, takes databases, keeps them across Down and Up,
// accepts only its password, and leaves nothing once stopped.
func TestCluster(t *testing.T) {
	c, err := localpg.Start()
	if errors.Is(err, localpg.ErrNoServer) {
		testenv.Lacking(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	name, err := c.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(name, "CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('kept')"); err != nil {
		t.Fatal(err)
	}
	c.Down()
	if err := c.Exec(name, "SELECT 1"); err == nil {
		t.Fatal("a statement ran while the server was down")
	}
	if err := c.Up(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", c.URL(name))
	if err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRow("SELECT v FROM t").Scan(&v); err != nil || v != "kept" {
		t.Errorf("after Down and Up: %q, %v", v, err)
	}
	db.Close()
	bad := strings.Replace(c.URL(name), localpg.User+":", localpg.User+":x", 1)
	if db, err := sql.Open("pgx", bad); err == nil {
		if err := db.Ping(); err == nil {
			t.Error("a wrong password was accepted")
		}
		db.Close()
	}
	if err := c.DropDatabase(name); err != nil {
		t.Fatal(err)
	}
	dir := c.Dir()
	c.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory is left: %v", err)
	}
}
