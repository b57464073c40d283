package e2b

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// checkpoint records a checkpoint of sandbox sbx of owner, named name, in
// state, as the checkpoint service would have left it (a ready or failed
// one with its event).
func (ts *testServer) checkpoint(t *testing.T, owner service.Principal, sbx, name, state string) string {
	t.Helper()
	ctx := context.Background()
	c := store.Checkpoint{
		ID: ids.New("chk"), Owner: owner.KeyID, SandboxID: sbx, Name: name, State: apiv1.CheckpointCreating,
		TemplateRef: "base:latest", TemplateDigest: "sha256:" + strings.Repeat("ab", 32),
		VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096, Network: json.RawMessage(`{"egress":"allow"}`),
		CreatedAt: time.Now().UTC(),
	}
	if err := ts.st.InsertCheckpoint(ctx, c, nil); err != nil {
		t.Fatal(err)
	}
	if state != apiv1.CheckpointCreating {
		c.State, c.SizeBytes = state, 1<<20
		if state == apiv1.CheckpointFailed {
			c.Error = &store.Error{Code: apiv1.CodeInternal, Message: "it broke"}
		}
		if err := ts.st.FinishCheckpoint(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	return c.ID
}

// snapshots lists every snapshot key sees through GET /snapshots with
// query, page by page of limit.
func (ts *testServer) snapshots(t *testing.T, key, query string, limit int) []SnapshotInfo {
	t.Helper()
	var all []SnapshotInfo
	token := ""
	for pages := 0; ; pages++ {
		q, err := url.ParseQuery(query)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 {
			q.Set("limit", strconv.Itoa(limit))
		}
		if token != "" {
			q.Set("nextToken", token)
		}
		var page []SnapshotInfo
		a := ts.must(t, 200, "GET", "/snapshots?"+q.Encode(), key, "", &page)
		if page == nil {
			t.Fatalf("GET /snapshots answered %s, want a list", a.body)
		}
		if limit > 0 && len(page) > limit {
			t.Fatalf("a page of %d with limit %d", len(page), limit)
		}
		all = append(all, page...)
		token = a.header.Get("X-Next-Token")
		if token == "" {
			return all
		}
		if pages > 100 {
			t.Fatal("GET /snapshots never ends")
		}
	}
}

func snapshotIDs(l []SnapshotInfo) []string {
	var out []string
	for _, s := range l {
		out = append(out, s.SnapshotID)
	}
	slices.Sort(out)
	return out
}

func sorted(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// TestListSnapshots: a key lists its own ready checkpoints as snapshots,
// with their names, filtered by sandbox and by name or ID, in pages.
func TestListSnapshots(t *testing.T) {
	ts := newTestServer(t)
	a1 := ts.row(t, ts.aliceP, apiv1.StateRunning)
	a2 := ts.row(t, ts.aliceP, apiv1.StateRunning)
	b1 := ts.row(t, ts.bobP, apiv1.StateRunning)
	named := ts.checkpoint(t, ts.aliceP, a1, "keep", apiv1.CheckpointReady)
	plain := ts.checkpoint(t, ts.aliceP, a1, "", apiv1.CheckpointReady)
	other := ts.checkpoint(t, ts.aliceP, a2, "other", apiv1.CheckpointReady)
	ts.checkpoint(t, ts.aliceP, a1, "broken", apiv1.CheckpointFailed)
	ts.checkpoint(t, ts.aliceP, a1, "making", apiv1.CheckpointCreating)
	bobs := ts.checkpoint(t, ts.bobP, b1, "keep", apiv1.CheckpointReady)

	all := ts.snapshots(t, ts.alice, "", 0)
	if got, want := snapshotIDs(all), sorted(named, plain, other); !slices.Equal(got, want) {
		t.Errorf("alice lists %v, want %v (ready ones only, none of bob's)", got, want)
	}
	for _, s := range all {
		want := map[string][]string{named: {"keep"}, plain: {}, other: {"other"}}[s.SnapshotID]
		if !slices.Equal(s.Names, want) || s.Names == nil {
			t.Errorf("snapshot %s has names %#v, want %#v", s.SnapshotID, s.Names, want)
		}
	}
	// The raw shape: E2B's field names, names a list even when empty.
	a := ts.must(t, 200, "GET", "/snapshots?name="+plain, ts.alice, "", nil)
	if got := strings.TrimSpace(string(a.body)); got != `[{"snapshotID":"`+plain+`","names":[]}]` {
		t.Errorf("GET /snapshots?name=%s answered %s", plain, got)
	}
	for _, c := range []struct {
		name, query string
		want        []string
	}{
		{"by sandbox", "sandboxID=" + a1, sorted(named, plain)},
		{"by name", "name=keep", []string{named}},
		{"by ID", "name=" + other, []string{other}},
		{"by sandbox and name", "sandboxID=" + a2 + "&name=keep", nil},
		{"another key's sandbox", "sandboxID=" + b1, nil},
		{"a sandbox ID that cannot be one", "sandboxID=" + url.QueryEscape("../"+strings.Repeat("x", 5000)), nil},
		{"an unknown name", "name=nope", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := snapshotIDs(ts.snapshots(t, ts.alice, c.query, 0)); !slices.Equal(got, c.want) {
				t.Errorf("alice lists %v, want %v", got, c.want)
			}
		})
	}
	// Pages of one and of two give the same as one page.
	for _, limit := range []int{1, 2, 100} {
		if got := snapshotIDs(ts.snapshots(t, ts.alice, "", limit)); !slices.Equal(got, snapshotIDs(all)) {
			t.Errorf("pages of %d list %v, want %v", limit, got, snapshotIDs(all))
		}
	}
	if got := snapshotIDs(ts.snapshots(t, ts.bob, "", 0)); !slices.Equal(got, []string{bobs}) {
		t.Errorf("bob lists %v, want only his own %s", got, bobs)
	}
	if got := snapshotIDs(ts.snapshots(t, ts.admin, "", 0)); len(got) != 4 {
		t.Errorf("the admin lists %v, want all 4 ready snapshots", got)
	}
	for _, q := range []string{"limit=0", "limit=101", "limit=-1", "limit=ten", "nextToken=garbage",
		"nextToken=" + fields.PageToken("sbx"+strings.Repeat("a", 20)), "limit=" + strings.Repeat("9", 40)} {
		e2bError(t, ts.do(t, "GET", "/snapshots?"+q, ts.alice, ""), 400)
	}
	e2bError(t, ts.do(t, "GET", "/snapshots", "", ""), 401)
}

// TestDeleteSnapshot: Sandbox.deleteSnapshot sends DELETE
// /templates/{snapshotID}; a snapshot of another key is not found, and
// the delete is recorded as an event.
func TestDeleteSnapshot(t *testing.T) {
	ts := newTestServer(t)
	sbx := ts.row(t, ts.aliceP, apiv1.StateRunning)
	chk := ts.checkpoint(t, ts.aliceP, sbx, "keep", apiv1.CheckpointReady)
	second := ts.checkpoint(t, ts.aliceP, sbx, "", apiv1.CheckpointReady)
	making := ts.checkpoint(t, ts.aliceP, sbx, "", apiv1.CheckpointCreating)

	// Bob's tries find nothing and change nothing.
	e2bError(t, ts.do(t, "DELETE", "/templates/"+chk, ts.bob, ""), 404, "not found")
	e2bError(t, ts.do(t, "DELETE", "/snapshots/"+chk, ts.bob, ""), 404, "not found")
	if got := snapshotIDs(ts.snapshots(t, ts.alice, "", 0)); !slices.Equal(got, sorted(chk, second)) {
		t.Fatalf("after bob's deletes alice lists %v", got)
	}
	for _, c := range []struct{ path, status, want string }{
		{"/templates/chk" + strings.Repeat("z", 20), "404", "not found"},
		{"/snapshots/chk" + strings.Repeat("z", 20), "404", "not found"},
		{"/snapshots/" + strings.Repeat("x", 3000), "404", "not found"},
		{"/snapshots/sbx" + strings.Repeat("z", 20), "404", "not found"},
		// Not a snapshot ID: a template, which this API does not delete.
		{"/templates/" + strings.Repeat("x", 3000), "501", "template builds"},
		{"/templates/chk%2F..", "404", "no route"},
	} {
		a := ts.do(t, "DELETE", c.path, ts.alice, "")
		e2bError(t, a, map[string]int{"404": 404, "501": 501}[c.status], c.want)
		if len(a.body) > 1000 {
			t.Errorf("DELETE %.40s…: an answer of %d bytes", c.path, len(a.body))
		}
	}
	e2bError(t, ts.do(t, "DELETE", "/templates/"+making, ts.alice, ""), 409, "being made")

	seq, err := ts.st.LastEventSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ts.must(t, 204, "DELETE", "/templates/"+chk, ts.alice, "", nil)
	e2bError(t, ts.do(t, "DELETE", "/templates/"+chk, ts.alice, ""), 404, "not found")
	ts.must(t, 204, "DELETE", "/snapshots/"+second, ts.alice, "", nil)
	if got := ts.snapshots(t, ts.alice, "", 0); len(got) != 0 {
		t.Errorf("after the deletes alice lists %v", got)
	}
	evs, err := ts.st.ListEvents(context.Background(), store.EventFilter{AfterSeq: seq, Types: []string{"checkpoint.*"}, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		var d struct {
			CheckpointID string `json:"checkpoint_id"`
		}
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatal(err)
		}
		if e.Owner != ts.aliceP.KeyID || e.SandboxID != sbx {
			t.Errorf("event %+v is not alice's, of %s", e, sbx)
		}
		got = append(got, e.Type+" "+d.CheckpointID)
	}
	if want := []string{apiv1.EventCheckpointDeleted + " " + chk, apiv1.EventCheckpointDeleted + " " + second}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestCreateSnapshot: bad input and other keys' sandboxes change nothing;
// a snapshot that fails (here no VM runs) answers 500 and leaves no
// checkpoint behind.
func TestCreateSnapshot(t *testing.T) {
	ts := newTestServer(t)
	run := ts.row(t, ts.aliceP, apiv1.StateRunning)
	bobs := ts.row(t, ts.bobP, apiv1.StateRunning)
	for _, c := range []struct {
		name, id, body string
		status         int
		want           []string
	}{
		{"name not a string", run, `{"name":5}`, 400, []string{`"name"`, "string"}},
		{"unknown field", run, `{"name":"a","memory":true}`, 400, []string{`"memory"`}},
		{"malformed", run, `{"name":`, 400, []string{"ends early"}},
		{"not an object", run, `"a"`, 400, []string{"JSON object"}},
		{"name too long", run, `{"name":"` + strings.Repeat("n", 129) + `"}`, 400, []string{"at most 128"}},
		{"name with a control character", run, `{"name":"a\u0007b"}`, 400, []string{"control"}},
		{"another key's sandbox", bobs, `{}`, 404, []string{"not found"}},
		{"an unknown sandbox", "sbx" + strings.Repeat("z", 20), `{}`, 404, []string{"not found"}},
		{"an ID that cannot be one", strings.Repeat("x", 3000), `{}`, 404, []string{"not found"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e2bError(t, ts.do(t, "POST", "/sandboxes/"+c.id+"/snapshots", ts.alice, c.body), c.status, c.want...)
		})
	}
	if l, err := ts.cps.List(context.Background(), ts.aliceP, "", "", 100); err != nil || len(l.Items) != 0 {
		t.Fatalf("bad requests left checkpoints %+v %v", l.Items, err)
	}
	// No VM runs here: the checkpoint fails, and its record goes.
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+run+"/snapshots", ts.alice, `{"name":"x"}`), 500, "snapshot of sandbox "+run)
	if l, err := ts.cps.List(context.Background(), ts.adminP(t), "", "", 100); err != nil || len(l.Items) != 0 {
		t.Errorf("a failed snapshot left checkpoints %+v %v", l.Items, err)
	}
	sb, err := ts.svc.GetSandbox(context.Background(), ts.aliceP, run)
	if err != nil || sb.State != apiv1.StateRunning {
		t.Errorf("the source after a failed snapshot: %+v %v", sb, err)
	}
}

// adminP is the admin key's principal.
func (ts *testServer) adminP(t *testing.T) service.Principal {
	t.Helper()
	p, err := ts.svc.Authenticate(context.Background(), ts.admin)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestForkBadInput: a count out of 1 to 100, a timeout not above 0, wrong
// types and other keys' sandboxes answer before anything is made.
func TestForkBadInput(t *testing.T) {
	ts := newTestServer(t)
	run := ts.row(t, ts.aliceP, apiv1.StateRunning)
	bobs := ts.row(t, ts.bobP, apiv1.StateRunning)
	for _, c := range []struct {
		name, id, body string
		status         int
		want           []string
	}{
		{"count 0", run, `{"count":0}`, 400, []string{"count 0", "1 to 100"}},
		{"count 101", run, `{"count":101}`, 400, []string{"count 101", "1 to 100"}},
		{"count -1", run, `{"count":-1}`, 400, []string{"count -1"}},
		{"count huge", run, `{"count":99999999999999999999}`, 400, []string{`"count"`}},
		{"count a string", run, `{"count":"2"}`, 400, []string{`"count"`, "integer"}},
		{"count a fraction", run, `{"count":1.5}`, 400, []string{`"count"`}},
		{"timeout 0", run, `{"timeout":0}`, 400, []string{"timeout 0"}},
		{"timeout negative", run, `{"count":2,"timeout":-1}`, 400, []string{"timeout -1"}},
		{"unknown field", run, `{"count":1,"metadata":{}}`, 400, []string{`"metadata"`}},
		{"not an object", run, `[1]`, 400, []string{"JSON object"}},
		{"another key's sandbox", bobs, `{"count":1}`, 404, []string{"not found"}},
		{"an unknown sandbox", "sbx" + strings.Repeat("z", 20), `{}`, 404, []string{"not found"}},
		{"an ID that cannot be one", strings.Repeat("x", 3000), `{}`, 404, []string{"not found"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e2bError(t, ts.do(t, "POST", "/sandboxes/"+c.id+"/fork", ts.alice, c.body), c.status, c.want...)
		})
	}
	// Here no template is installed: the children cannot be recorded,
	// and the fork ends before anything is made.
	e2bError(t, ts.do(t, "POST", "/sandboxes/"+run+"/fork", ts.alice, `{"count":3}`), 404, "fork child 1 of 3", "not found")
	ctx := context.Background()
	if l, err := ts.cps.List(ctx, ts.adminP(t), "", "", 100); err != nil || len(l.Items) != 0 {
		t.Errorf("bad forks left checkpoints %+v %v", l.Items, err)
	}
	l, err := ts.svc.ListSandboxes(ctx, ts.adminP(t), service.SandboxFilter{})
	if err != nil || len(l.Items) != 2 {
		t.Errorf("bad forks left sandboxes: %+v %v", l.Items, err)
	}
}

// TestCreateFromSnapshot: a templateID that is a snapshot's ID makes the
// sandbox from that checkpoint; another key's is not found, and a
// template whose name merely starts like one is still a template.
func TestCreateFromSnapshot(t *testing.T) {
	chk := ids.New("chk")
	in, err := createRequest(newSandbox{TemplateID: chk, EnvVars: map[string]string{"A": "1"}}, true)
	if err != nil || in.Checkpoint != chk || in.Template != "" || in.Env["A"] != "1" || in.TimeoutS == nil || *in.TimeoutS != 300 || len(in.Network) != 0 {
		t.Errorf("create from %s: %+v %v", chk, in, err)
	}
	for _, tpl := range []string{"chk", "chkpoint:v1", "CHK" + chk[3:], chk + ":default", "chk" + strings.Repeat("a", 80)} {
		in, err := createRequest(newSandbox{TemplateID: tpl}, true)
		if err != nil || in.Checkpoint != "" || in.Template != tpl {
			t.Errorf("templateID %q: %+v %v, want a template", tpl, in, err)
		}
	}

	ts := newTestServer(t)
	b1 := ts.row(t, ts.bobP, apiv1.StateRunning)
	a1 := ts.row(t, ts.aliceP, apiv1.StateRunning)
	bobs := ts.checkpoint(t, ts.bobP, b1, "", apiv1.CheckpointReady)
	failed := ts.checkpoint(t, ts.aliceP, a1, "", apiv1.CheckpointFailed)
	for _, c := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"another key's snapshot", `{"templateID":"` + bobs + `"}`, 404, "not found"},
		{"an unknown snapshot", `{"templateID":"chk` + strings.Repeat("z", 20) + `"}`, 404, "not found"},
		{"a failed snapshot", `{"templateID":"` + failed + `"}`, 409, "failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e2bError(t, ts.do(t, "POST", "/v2/sandboxes", ts.alice, c.body), c.status, c.want)
			e2bError(t, ts.do(t, "POST", "/sandboxes", ts.alice, c.body), c.status, c.want)
		})
	}
	l, err := ts.svc.ListSandboxes(context.Background(), ts.adminP(t), service.SandboxFilter{})
	if err != nil || len(l.Items) != 2 {
		t.Errorf("refused creates left sandboxes: %+v %v", l.Items, err)
	}
}

// TestForkResultShape: each result of a fork carries exactly one of
// sandbox and error, in E2B's names.
func TestForkResultShape(t *testing.T) {
	for _, c := range []struct {
		r    forkResult
		want string
	}{
		{forkResult{Sandbox: &Sandbox{TemplateID: "base", SandboxID: "sbxa", ClientID: clientID, EnvdVersion: "0.5.7", EnvdAccessToken: "tok"}},
			`{"sandbox":{"templateID":"base","sandboxID":"sbxa","clientID":"6532622b","envdVersion":"0.5.7","envdAccessToken":"tok","trafficAccessToken":null,"domain":null}}`},
		{forkResult{Error: &Error{Code: 429, Message: "limit"}}, `{"error":{"code":429,"message":"limit"}}`},
	} {
		b, err := json.Marshal(c.r)
		if err != nil || string(b) != c.want {
			t.Errorf("%+v: %s %v, want %s", c.r, b, err, c.want)
		}
	}
}
