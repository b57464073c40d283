package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithPostgres(m)) }

// backend makes databases of one engine for the conformance suite.
type backend struct {
	name string
	// newDB returns the address of a new, empty database: a file path for
	// SQLite, a URL for PostgreSQL.
	newDB func(t *testing.T) string
}

// openAddr opens the store at addr on the backend's engine.
func (b backend) openAddr(addr string) (*Store, error) {
	if IsPostgresURL(addr) {
		return OpenPostgres(context.Background(), addr)
	}
	return Open(addr)
}

// newStore opens a store on a new database, closed at the end of the test.
func (b backend) newStore(t *testing.T) *Store {
	t.Helper()
	return b.openN(t, 1)[0]
}

// openN opens n stores on one new database, as n processes would.
func (b backend) openN(t *testing.T, n int) []*Store {
	t.Helper()
	addr := b.newDB(t)
	var stores []*Store
	for range n {
		s, err := b.openAddr(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	return stores
}

var sqliteBackend = backend{name: "sqlite", newDB: func(t *testing.T) string {
	return filepath.Join(t.TempDir(), "airlock.db")
}}

var postgresBackend = backend{name: "postgres", newDB: func(t *testing.T) string {
	return testenv.SharedPostgres(t).NewDatabase(t)
}}

// conformance is the suite every engine passes alike.
var conformance = []struct {
	name string
	test func(t *testing.T, b backend)
}{
	{"Builds", testBuilds},
	{"EventsOfSandboxes", testEventsOfSandboxes},
	{"EventsOnlyWithTheirChange", testEventsOnlyWithTheirChange},
	{"EventsOfIdleness", testEventsOfIdleness},
	{"EventsOfBuilds", testEventsOfBuilds},
	{"EventsNeverSkip", testEventsNeverSkip},
	{"PruneEvents", testPruneEvents},
	{"AnnounceExpiring", testAnnounceExpiring},
	{"Webhooks", testWebhooks},
	{"TemplateTags", testTemplateTags},
	{"BuildContextNodes", testBuildContextNodes},
	{"TemplatesInUse", testTemplatesInUse},
	{"CommandRoundTrip", testCommandRoundTrip},
	{"InsertCommandRefusals", testInsertCommandRefusals},
	{"UpdateCommand", testUpdateCommand},
	{"SpendCommandToken", testSpendCommandToken},
	{"ListCommands", testListCommands},
	{"Idempotent", testIdempotent},
	{"IdempotentClaims", testIdempotentClaims},
	{"ReleaseAllClaims", testReleaseAllClaims},
	{"Keys", testKeys},
	{"KeyCreatedAtDefaultsToNow", testKeyCreatedAtDefaultsToNow},
	{"KeyByHash", testKeyByHash},
	{"KeyFormatDefault", testKeyFormatDefault},
	{"Operations", testOperations},
	{"SandboxRoundTrip", testSandboxRoundTrip},
	{"InsertSandboxRefusals", testInsertSandboxRefusals},
	{"UpdateSandbox", testUpdateSandbox},
	{"TransitionSandbox", testTransitionSandbox},
	{"BeginOperation", testBeginOperation},
	{"FinishedOperationFreesSandbox", testFinishedOperationFreesSandbox},
	{"ListSandboxesFilter", testListSandboxesFilter},
	{"ListSandboxesPagination", testListSandboxesPagination},
	{"ListExpired", testListExpired},
	{"Secrets", testSecrets},
	{"SecretTimesDefaultToNow", testSecretTimesDefaultToNow},
	{"ReopenKeepsData", testReopenKeepsData},
	{"NewerSchemaRefused", testNewerSchemaRefused},
	{"NotFound", testNotFound},
	{"ConcurrentWrites", testConcurrentWrites},
	{"RacesHaveOneWinner", testRacesHaveOneWinner},
	{"PagesNeverSkipAConcurrentInsert", testPagesNeverSkip},
	{"BadText", testBadText},
	{"SandboxNodes", testSandboxNodes},
	{"Settings", testSettings},
	{"KeyUsage", testKeyUsage},
	{"InsertSandboxWithin", testInsertSandboxWithin},
	{"ClusterNodes", testClusterNodes},
}

// testSettings: the first value of a setting stays; later ones read it;
// names are kept apart; a bad name changes nothing.
func testSettings(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	if got, err := s.EnsureSetting(ctx, "token", "first"); err != nil || got != "first" {
		t.Errorf("first set: %q, %v", got, err)
	}
	if got, err := s.EnsureSetting(ctx, "token", "second"); err != nil || got != "first" {
		t.Errorf("second set: %q, %v; want first kept", got, err)
	}
	if got, err := s.EnsureSetting(ctx, "other", "x"); err != nil || got != "x" {
		t.Errorf("another name: %q, %v", got, err)
	}
	for _, name := range []string{"", "a\x00b"} {
		if _, err := s.EnsureSetting(ctx, name, "v"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("name %q: %v, want invalid", name, err)
		}
	}
}

// testSandboxNodes: a node is recorded per sandbox, survives updates of
// the rest of the row, is listed by state, and a sandbox the store lacks
// is not found.
func testSandboxNodes(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	mustInsertSandbox(t, s, "sbx1", "key1")
	mustInsertSandbox(t, s, "sbx2", "key1")
	if err := s.SetSandboxNode(ctx, "sbx1", "host-a"); err != nil {
		t.Fatal(err)
	}
	sb, err := s.GetSandbox(ctx, "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	sb.State = "paused"
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if nodes, err := s.SandboxNodes(ctx); err != nil || len(nodes) != 1 || nodes["sbx1"] != "host-a" {
		t.Errorf("nodes %v, %v; want only sbx1 on host-a", nodes, err)
	}
	if nodes, err := s.SandboxNodes(ctx, "running", "paused"); err != nil || len(nodes) != 1 || nodes["sbx1"] != "host-a" {
		t.Errorf("nodes of running or paused sandboxes %v, %v; want sbx1 on host-a", nodes, err)
	}
	if nodes, err := s.SandboxNodes(ctx, "running"); err != nil || len(nodes) != 0 {
		t.Errorf("nodes of running sandboxes %v, %v; want none", nodes, err)
	}
	// NodesOf: only the named, bound ones; more names than one query takes.
	many := []string{"sbx2", "sbx9"}
	for i := range 1200 {
		many = append(many, fmt.Sprintf("sbxnone%d", i))
	}
	for _, ids := range [][]string{{"sbx1"}, append(many, "sbx1")} {
		if nodes, err := s.NodesOf(ctx, ids); err != nil || len(nodes) != 1 || nodes["sbx1"] != "host-a" {
			t.Errorf("NodesOf %d IDs: %v, %v; want only sbx1 on host-a", len(ids), nodes, err)
		}
	}
	if nodes, err := s.NodesOf(ctx, many); err != nil || len(nodes) != 0 {
		t.Errorf("NodesOf unbound and unknown sandboxes: %v, %v; want none", nodes, err)
	}
	if err := s.SetSandboxNode(ctx, "sbx9", "host-a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("node of an unknown sandbox: %v, want not found", err)
	}
	if err := s.SetSandboxNode(ctx, "sbx2", "host\x00"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a node name with NUL: %v, want invalid", err)
	}
	if err := s.SetSandboxNode(ctx, "sbx1", ""); err != nil {
		t.Fatal(err)
	}
	if nodes, err := s.SandboxNodes(ctx); err != nil || len(nodes) != 0 {
		t.Errorf("nodes after unbinding: %v, %v; want none", nodes, err)
	}

	// A claim takes an unbound sandbox; a later claim by another node
	// gets the first's name back and changes nothing.
	if got, err := s.ClaimSandboxNode(ctx, "sbx2", "host-b"); err != nil || got != "host-b" {
		t.Errorf("first claim: %q, %v; want host-b", got, err)
	}
	if got, err := s.ClaimSandboxNode(ctx, "sbx2", "host-a"); err != nil || got != "host-b" {
		t.Errorf("second claim: %q, %v; want host-b kept", got, err)
	}
	if got, err := s.SandboxNode(ctx, "sbx2"); err != nil || got != "host-b" {
		t.Errorf("node of sbx2: %q, %v; want host-b", got, err)
	}
	if got, err := s.SandboxNode(ctx, "sbx1"); err != nil || got != "" {
		t.Errorf("node of unbound sbx1: %q, %v; want none", got, err)
	}
	if _, err := s.ClaimSandboxNode(ctx, "sbx9", "host-a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("claim of an unknown sandbox: %v, want not found", err)
	}
	if _, err := s.ClaimSandboxNode(ctx, "sbx1", ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("claim for no node: %v, want invalid", err)
	}
}

// TestConformance runs the suite on SQLite and on PostgreSQL (a throwaway
// cluster; a host without PostgreSQL's server skips it, and CI fails).
func TestConformance(t *testing.T) {
	for _, b := range []backend{sqliteBackend, postgresBackend} {
		t.Run(b.name, func(t *testing.T) {
			if b.name == "postgres" {
				testenv.SharedPostgres(t) // skip or fail once, not per test
			}
			for _, c := range conformance {
				t.Run(c.name, func(t *testing.T) { c.test(t, b) })
			}
		})
	}
}

// racers is how many stores (standing for server processes) race in the
// tests of concurrency, each on its own goroutine.
const racers = 8

// race runs fn once on each of racers stores of one database at the same
// time and returns their errors.
func race(t *testing.T, stores []*Store, fn func(s *Store) error) []error {
	t.Helper()
	errs := make([]error, len(stores))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() {
			<-start
			errs[i] = fn(s)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// Where processes race for one record, exactly one wins and the others get
// the error the API turns into its answer; none gets an error of the
// engine.
func testRacesHaveOneWinner(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, racers)
	mustInsertSandbox(t, stores[0], "sbx1", "key1")
	if err := stores[0].InsertCommand(ctx, testCommand("cmd1", "sbx1")); err != nil {
		t.Fatal(err)
	}
	oneWinner := func(what string, errs []error, loser error) {
		t.Helper()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, loser):
				t.Errorf("%s: a loser got %v, want %v", what, err, loser)
			}
		}
		if won != 1 {
			t.Errorf("%s: %d winners, want 1 (%v)", what, won, errs)
		}
	}
	for round := range 5 {
		oneWinner("insert sandbox", race(t, stores, func(s *Store) error {
			id := fmt.Sprintf("sbxrace%d", round)
			sb := testSandbox(id, "key1")
			return s.InsertSandbox(ctx, sb, createOp(fmt.Sprintf("op%d-%p", round, s), id, "key1"))
		}), errdefs.ErrConflict)
		oneWinner("put idempotent", race(t, stores, func(s *Store) error {
			return s.PutIdempotent(ctx, Idempotent{KeyID: "key1", Key: fmt.Sprint("k", round), Status: 202, Body: []byte("x")})
		}), errdefs.ErrConflict)
		cmd := fmt.Sprint("cmdrace", round)
		if err := stores[0].InsertCommand(ctx, testCommand(cmd, "sbx1")); err != nil {
			t.Fatal(err)
		}
		oneWinner("spend token", race(t, stores, func(s *Store) error {
			return s.SpendCommandToken(ctx, cmd)
		}), errdefs.ErrConflict)

		// Putting a new secret is not exclusive, but only one put creates it.
		var mu sync.Mutex
		created := 0
		for _, err := range race(t, stores, func(s *Store) error {
			c, err := s.PutSecret(ctx, Secret{Owner: "key1", Name: fmt.Sprint("S", round), Sealed: []byte{byte(round)}})
			if c {
				mu.Lock()
				created++
				mu.Unlock()
			}
			return err
		}) {
			if err != nil {
				t.Errorf("put secret: %v", err)
			}
		}
		if created != 1 {
			t.Errorf("put secret: %d puts created it, want 1", created)
		}
	}
	// Only the winners' records exist.
	list, err := stores[1].ListSandboxes(ctx, SandboxFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 6 {
		t.Errorf("%d sandboxes, want 6", len(list))
	}
	ops, err := stores[1].ListOperations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 6 {
		t.Errorf("%d operations, want 6: a losing insert left its operation", len(ops))
	}
}

// walkPages reads pages of 7 from list, each after the last ID of the one
// before, until a short page, and returns the IDs in order.
func walkPages(t *testing.T, list func(after string) ([]string, error)) []string {
	t.Helper()
	var all []string
	for after := ""; ; {
		page, err := list(after)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 7 {
			return all
		}
		after = page[len(page)-1]
	}
}

// idsOf maps records to their IDs.
func idsOf[T any](records []T, id func(T) string) []string {
	out := make([]string, len(records))
	for i, r := range records {
		out[i] = id(r)
	}
	return out
}

// A reader paging through sandboxes and commands while other processes
// insert them never skips one: every row before the last one it saw (in
// the final order) was on its pages. Rows inserted after a page was read
// may be missing, never ones before.
func testPagesNeverSkip(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.openN(t, 4)
	mustInsertSandbox(t, stores[0], "sbxcmds", "key1")
	const writers, each = 3, 40
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers*each*2)
	for w := range writers {
		wg.Go(func() {
			s := stores[1+w]
			for i := range each {
				id := fmt.Sprintf("w%dx%d", w, i)
				if err := s.InsertSandbox(ctx, testSandbox("sbx"+id, "key1"), createOp("op"+id, "sbx"+id, "key1")); err != nil {
					errs <- err
				}
				if err := s.InsertCommand(ctx, testCommand("cmd"+id, "sbxcmds")); err != nil {
					errs <- err
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()

	type walk struct{ sandboxes, commands []string }
	var walks []walk
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		w := walk{
			sandboxes: walkPages(t, func(after string) ([]string, error) {
				page, err := stores[0].ListSandboxes(ctx, SandboxFilter{After: after, Limit: 7})
				return idsOf(page, func(sb Sandbox) string { return sb.ID }), err
			}),
			commands: walkPages(t, func(after string) ([]string, error) {
				page, err := stores[0].ListCommands(ctx, "sbxcmds", after, 7)
				return idsOf(page, func(c Command) string { return c.ID }), err
			}),
		}
		walks = append(walks, w)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	all, err := stores[0].ListSandboxes(ctx, SandboxFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	final := idsOf(all, func(sb Sandbox) string { return sb.ID })
	cmds, err := stores[0].ListCommands(ctx, "sbxcmds", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	finalCmds := idsOf(cmds, func(c Command) string { return c.ID })
	if len(final) != 1+writers*each || len(finalCmds) != writers*each {
		t.Fatalf("%d sandboxes and %d commands, want %d and %d", len(final), len(finalCmds), 1+writers*each, writers*each)
	}
	// A walk must be a prefix of the final order.
	for i, w := range walks {
		if !slices.Equal(w.sandboxes, final[:len(w.sandboxes)]) {
			t.Fatalf("walk %d of %d skipped or reordered sandboxes:\n got %v\nwant %v", i, len(walks), w.sandboxes, final[:len(w.sandboxes)])
		}
		if !slices.Equal(w.commands, finalCmds[:len(w.commands)]) {
			t.Fatalf("walk %d of %d skipped or reordered commands:\n got %v\nwant %v", i, len(walks), w.commands, finalCmds[:len(w.commands)])
		}
	}
	t.Logf("%d walks while %d writers inserted", len(walks), writers)
}

// Text PostgreSQL cannot hold (a NUL byte, invalid UTF-8) is invalid input
// on both engines: never stored, never found, and nothing changes.
func testBadText(t *testing.T, b backend) {
	ctx := context.Background()
	s := b.newStore(t)
	mustInsertSandbox(t, s, "sbx1", "key1")
	for _, bad := range []string{"sbx\x00", "sbx\xff", "\xc3("} {
		sb := testSandbox(bad, "key1")
		for name, err := range map[string]error{
			"InsertSandbox": s.InsertSandbox(ctx, sb, createOp("op"+bad, bad, "key1")),
			"GetSandbox":    func() error { _, err := s.GetSandbox(ctx, bad); return err }(),
			"InsertKey":     s.InsertKey(ctx, Key{ID: bad, Name: "k", Role: "user", Hash: []byte(bad)}),
			"PutSecret": func() error {
				_, err := s.PutSecret(ctx, Secret{Owner: "key1", Name: bad, Sealed: []byte{1}})
				return err
			}(),
			"ListSandboxes": func() error {
				_, err := s.ListSandboxes(ctx, SandboxFilter{Metadata: map[string]string{bad: "x"}, Limit: 1})
				return err
			}(),
			"UpdateSandbox": func() error {
				sb := testSandbox("sbx1", "key1")
				sb.TemplateRef = bad
				return s.UpdateSandbox(ctx, sb)
			}(),
		} {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s(%q) = %v, want invalid", name, bad, err)
			}
		}
	}
	got, err := s.GetSandbox(ctx, "sbx1")
	if err != nil || got.TemplateRef != "base:latest" {
		t.Errorf("after the refused update: %+v, %v", got, err)
	}
	if list, err := s.ListSandboxes(ctx, SandboxFilter{Limit: 10}); err != nil || len(list) != 1 {
		t.Errorf("%d sandboxes (%v), want 1", len(list), err)
	}
}
