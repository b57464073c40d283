package bench

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }

// The postgres_ scenarios' server keeps its store in PostgreSQL: its admin
// key is there, and the API answers from it.
func TestAPIServerOnPostgres(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	real, _ := dataDirWithTemplate(t, "tiny")
	url := testenv.SharedPostgres(t).NewDatabase(t)
	s, err := startAPIServer(context.Background(), Config{Dir: real, Accel: "tcg"}.withDefaults(), nil, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if s.st.Engine() != "postgres" {
		t.Fatalf("store engine %s, want postgres", s.st.Engine())
	}
	if _, err := os.Stat(s.home + "/airlock.db"); !os.IsNotExist(err) {
		t.Errorf("a SQLite file was made: %v", err)
	}
	keys, err := s.client.ListKeys(context.Background(), apiclient.ListOptions{})
	if err != nil || len(keys.Items) != 1 {
		t.Fatalf("keys over the API: %v, %v; want the admin key", keys, err)
	}
	if n, err := s.st.CountKeys(context.Background(), ""); err != nil || n != 1 {
		t.Errorf("keys in PostgreSQL: %d, %v", n, err)
	}
}

func TestPostgresScenariosListed(t *testing.T) {
	all := Scenarios()
	i, j := slices.Index(all, ScenarioPGCreate), slices.Index(all, ScenarioPGExecRTT)
	if i < 0 || j != i+1 {
		t.Errorf("Scenarios() = %v, want %s then %s", all, ScenarioPGCreate, ScenarioPGExecRTT)
	}
}
