package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/sandbox/sandboxtest"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// secretServer is the real API over a real transport, with a service that
// has a store and a secrets box but no VMs: enough for keys and secrets.
type secretServer struct {
	url         string
	url2        string // a second API server on the same service and store, as a replica
	svc         *service.Service
	box         *secrets.Box
	admin, user string // API keys
	adminID     string
	userID      string
	log         *syncBuffer // what the server and the service logged
	st          *store.Store
	rt          *sandboxtest.Runtime // the service's runtime
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func newSecretServer(t *testing.T) *secretServer {
	t.Helper()
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(dir.Store())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	box, err := secrets.OpenBox(filepath.Join(dir.Root, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rt := sandboxtest.New(t, dir)
	svc, err := service.New(ctx, service.Config{Dir: dir, Runtime: service.RuntimeOf(rt), Store: st, Log: log, Secrets: box})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	admin, err := svc.EnsureAdminKey(ctx, dir.AdminKey())
	if err != nil {
		t.Fatal(err)
	}
	ap, err := svc.Authenticate(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	user, err := svc.CreateKey(ctx, ap, apiv1.CreateKey{Name: "user", Role: apiv1.RoleUser})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{Service: svc, Store: st, Log: log, Secrets: box}))
	t.Cleanup(srv.Close)
	srv2 := httptest.NewServer(New(Config{Service: svc, Store: st, Log: log, Secrets: box}))
	t.Cleanup(srv2.Close)
	return &secretServer{url: srv.URL, url2: srv2.URL, box: box, svc: svc, admin: admin, user: user.Key, adminID: ap.KeyID, userID: user.ID, log: logs, st: st, rt: rt}
}

// answer is what a request got back.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request; body is sent as is.
func (s *secretServer) do(t *testing.T, method, path, key, body string, header ...string) answer {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// must sends a request that must answer status, and decodes the answer
// into out when out is not nil.
func (s *secretServer) must(t *testing.T, status int, method, path, key, body string, out any) answer {
	t.Helper()
	a := s.do(t, method, path, key, body)
	if a.status != status {
		t.Fatalf("%s %s: %d %s, want %d", method, path, a.status, a.body, status)
	}
	if out != nil {
		if err := json.Unmarshal(a.body, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, a.body)
		}
	}
	return a
}

// state is every secret of both keys with its value and times, as the
// service sees them.
func (s *secretServer) state(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, p := range []service.Principal{{KeyID: s.adminID, Role: apiv1.RoleAdmin}, {KeyID: s.userID, Role: apiv1.RoleUser}} {
		l, err := s.svc.ListSecrets(ctx, p, fields.MaxLimit, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range l.Items {
			v, err := s.svc.SecretValue(ctx, p.KeyID, sec.Name)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %s=%q %s %s\n", p.KeyID, sec.Name, v, sec.CreatedAt.Format(time.RFC3339Nano), sec.UpdatedAt.Format(time.RFC3339Nano))
		}
	}
	return b.String()
}

func TestSecretsAPI(t *testing.T) {
	s := newSecretServer(t)
	const value = "sk-live-DO-NOT-SHOW-0001"

	var first apiv1.Secret
	a := s.must(t, 201, "POST", "/v1/secrets", s.user, `{"name": "openai", "value": "`+value+`"}`, &first)
	if first.Name != "openai" || first.CreatedAt.IsZero() || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("create answered %s", a.body)
	}
	var replaced apiv1.Secret
	s.must(t, 200, "POST", "/v1/secrets", s.user, `{"name": "openai", "value": "`+value+`-2"}`, &replaced)
	if !replaced.CreatedAt.Equal(first.CreatedAt) || replaced.UpdatedAt.Before(first.UpdatedAt) {
		t.Errorf("replace answered %+v, want created_at %v kept", replaced, first.CreatedAt)
	}
	if v, err := s.svc.SecretValue(context.Background(), s.userID, "openai"); err != nil || v != value+"-2" {
		t.Errorf("the stored value is %q, %v", v, err)
	}
	s.must(t, 201, "POST", "/v1/secrets", s.user, `{"name": "github", "value": "ghp"}`, nil)
	s.must(t, 201, "POST", "/v1/secrets", s.admin, `{"name": "admin-only", "value": "adm"}`, nil)

	// A key lists only its own, an admin key too; values are never shown.
	for _, tc := range []struct {
		key  string
		want string
	}{{s.user, "[github openai]"}, {s.admin, "[admin-only]"}} {
		var l apiv1.List[apiv1.Secret]
		a := s.must(t, 200, "GET", "/v1/secrets", tc.key, "", &l)
		var names []string
		for _, it := range l.Items {
			names = append(names, it.Name)
		}
		if fmt.Sprint(names) != tc.want || l.NextPageToken != "" {
			t.Errorf("list: %s, want %s", a.body, tc.want)
		}
		if bytes.Contains(a.body, []byte("value")) || bytes.Contains(a.body, []byte("sk-live")) {
			t.Errorf("the list shows values: %s", a.body)
		}
	}
	var paged apiv1.List[apiv1.Secret]
	s.must(t, 200, "GET", "/v1/secrets?limit=1", s.user, "", &paged)
	if len(paged.Items) != 1 || paged.Items[0].Name != "github" || paged.NextPageToken == "" {
		t.Fatalf("first page %+v", paged)
	}
	s.must(t, 200, "GET", "/v1/secrets?limit=1&page_token="+paged.NextPageToken, s.user, "", &paged)
	if len(paged.Items) != 1 || paged.Items[0].Name != "openai" || paged.NextPageToken != "" {
		t.Fatalf("second page %+v", paged)
	}

	// Another key's secret cannot be deleted, and is not told apart from none.
	a = s.must(t, 404, "DELETE", "/v1/secrets/openai", s.admin, "", nil)
	s.must(t, 204, "DELETE", "/v1/secrets/openai", s.user, "", nil)
	b := s.must(t, 404, "DELETE", "/v1/secrets/openai", s.user, "", nil)
	if !bytes.Equal(a.body, b.body) {
		t.Errorf("another key's secret answers %s, a missing one %s", a.body, b.body)
	}

	// The value is in no log line and no answer.
	if strings.Contains(s.log.String(), "sk-live") {
		t.Errorf("the log holds a value:\n%s", s.log.String())
	}
}

func TestSecretsBadInput(t *testing.T) {
	s := newSecretServer(t)
	s.must(t, 201, "POST", "/v1/secrets", s.user, `{"name": "keep", "value": "kept"}`, nil)
	s.must(t, 201, "POST", "/v1/secrets", s.admin, `{"name": "keep", "value": "admin kept"}`, nil)
	base := s.state(t)
	const value = "hunter2-never-echoed"

	type badCase struct {
		name         string
		method, path string
		key          string
		body         string
		status       int
		msg          string // the error message holds this
	}
	post := func(name, body string, status int, msg string) badCase {
		return badCase{name, "POST", "/v1/secrets", s.user, body, status, msg}
	}
	cases := []badCase{
		post("name a number", `{"name": 5, "value": "`+value+`"}`, 400, `field "name" must be string, not number`),
		post("value a number", `{"name": "x", "value": 5}`, 400, `field "value" must be string, not number`),
		post("name an array", `{"name": ["x"], "value": "`+value+`"}`, 400, `field "name" must be string, not array`),
		post("value an object", `{"name": "x", "value": {"v": "`+value+`"}}`, 400, `field "value" must be string, not object`),
		post("value a bool", `{"name": "keep", "value": true}`, 400, `field "value" must be string, not bool`),
		post("empty object", `{}`, 400, `secret name "" is not valid`),
		post("no name", `{"value": "`+value+`"}`, 400, `secret name "" is not valid`),
		post("no value", `{"name": "keep"}`, 400, "secret keep: value is required"),
		post("empty value", `{"name": "keep", "value": ""}`, 400, "value is required"),
		post("null value", `{"name": "keep", "value": null}`, 400, "value is required"),
		post("name with a slash", `{"name": "a/b", "value": "`+value+`"}`, 400, `secret name "a/b" is not valid`),
		post("name ..", `{"name": "..", "value": "`+value+`"}`, 400, `secret name ".." is not valid`),
		post("name with ..", `{"name": "a..b", "value": "`+value+`"}`, 400, `secret name "a..b" is not valid`),
		post("name with NUL", `{"name": "a\u0000b", "value": "`+value+`"}`, 400, `secret name "a\x00b" is not valid`),
		post("name of 65 characters", `{"name": "`+strings.Repeat("n", 65)+`", "value": "`+value+`"}`, 400, "use 1 to 64 letters"),
		post("value over 64 KiB", `{"name": "keep", "value": "`+value+strings.Repeat("x", service.MaxSecretValue)+`"}`, 400,
			"secret keep: value is 65556 bytes, over the limit of 65536"),
		post("unknown field", `{"name": "keep", "value": "`+value+`", "ttl": 5}`, 400, `unknown field "ttl"`),
		post("misspelt field", `{"name": "keep", "values": "`+value+`"}`, 400, `unknown field "values"`),
		post("data after the object", `{"name": "keep", "value": "`+value+`"} {}`, 400, "data after its JSON object"),
		post("not JSON", `name=keep&value=`+value, 400, "not valid JSON"),
		post("an array", `[{"name": "keep", "value": "`+value+`"}]`, 400, "must be a JSON object, not array"),
		post("a string", `"`+value+`"`, 400, "must be a JSON object, not string"),
		post("empty body", ``, 400, "the body is empty"),
		post("body over 1 MiB", `{"name": "keep", "value": "`+value+strings.Repeat("x", MaxJSONBody)+`"}`, 413, "over 1048576 bytes"),
		{"query parameter", "POST", "/v1/secrets?name=keep", s.user, `{"name": "keep", "value": "` + value + `"}`, 400, `unknown query parameter "name"`},
		{"no key", "POST", "/v1/secrets", "", `{"name": "keep", "value": "` + value + `"}`, 401, "missing API key"},
		{"bad key", "POST", "/v1/secrets", s.user + "x", `{"name": "keep", "value": "` + value + `"}`, 401, "the API key is not valid"},

		{"list limit 0", "GET", "/v1/secrets?limit=0", s.user, "", 400, "limit 0 is out of bounds"},
		{"list limit not a number", "GET", "/v1/secrets?limit=ten", s.user, "", 400, `limit must be an integer, not "ten"`},
		{"list limit too large", "GET", "/v1/secrets?limit=1001", s.user, "", 400, "limit 1001 is out of bounds"},
		{"list bad page token", "GET", "/v1/secrets?page_token=garbage", s.user, "", 400, "page_token is not one this server gave"},
		{"list unknown parameter", "GET", "/v1/secrets?name=keep", s.user, "", 400, `unknown query parameter "name"`},
		{"list without a key", "GET", "/v1/secrets", "", "", 401, "missing API key"},

		{"delete a missing name", "DELETE", "/v1/secrets/nope", s.user, "", 404, "secret nope is not stored for this key"},
		{"delete an escaped slash", "DELETE", "/v1/secrets/a%2Fkeep", s.user, "", 400, `secret name "a/keep" is not valid`},
		{"delete NUL", "DELETE", "/v1/secrets/keep%00", s.user, "", 400, `secret name "keep\x00" is not valid`},
		{"delete 65 characters", "DELETE", "/v1/secrets/" + strings.Repeat("k", 65), s.user, "", 400, "use 1 to 64 letters"},
		{"delete ..", "DELETE", "/v1/secrets/..", s.user, "", 404, "no route"},
		{"delete a sub-path", "DELETE", "/v1/secrets/keep/x", s.user, "", 404, "no route"},
		{"delete with a query", "DELETE", "/v1/secrets/keep?force=1", s.user, "", 400, `unknown query parameter "force"`},
		{"delete without a key", "DELETE", "/v1/secrets/keep", "", "", 401, "missing API key"},
		{"put is not a route", "PUT", "/v1/secrets/keep", s.user, `{"value": "` + value + `"}`, 404, "no route PUT /v1/secrets/keep"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := s.do(t, tc.method, tc.path, tc.key, tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tc.status)
			}
			if strings.Contains(string(a.body), value) {
				t.Errorf("the answer holds the value: %.300s", a.body)
			}
			if tc.msg != "" {
				var eb apiv1.ErrorBody
				if err := json.Unmarshal(a.body, &eb); err != nil || a.header.Get("Content-Type") != "application/json" {
					t.Fatalf("not an error body (%v, %s): %.300s", err, a.header.Get("Content-Type"), a.body)
				}
				if want := badCodes[tc.status]; eb.Error.Code != want {
					t.Errorf("code %q, want %q", eb.Error.Code, want)
				}
				if !strings.Contains(eb.Error.Message, tc.msg) {
					t.Errorf("message %q, want it to say %q", eb.Error.Message, tc.msg)
				}
			}
			if got := s.state(t); got != base {
				t.Errorf("the secrets changed:\n%s\nwant\n%s", got, base)
			}
		})
	}
	if strings.Contains(s.log.String(), value) {
		t.Errorf("the log holds a value:\n%s", s.log.String())
	}
}

var badCodes = map[int]string{
	400: apiv1.CodeInvalidArgument, 401: apiv1.CodeUnauthenticated, 404: apiv1.CodeNotFound,
	409: apiv1.CodeConflict, 413: apiv1.CodePayloadTooLarge,
}

func TestSecretsIdempotency(t *testing.T) {
	s := newSecretServer(t)
	body := `{"name": "openai", "value": "v1"}`
	first := s.do(t, "POST", "/v1/secrets", s.user, body, "Idempotency-Key", "k1")
	again := s.do(t, "POST", "/v1/secrets", s.user, body, "Idempotency-Key", "k1")
	if first.status != 201 || again.status != 201 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, retry %d %s (replayed %q)", first.status, first.body, again.status, again.body, again.header.Get("Idempotent-Replayed"))
	}
	other := s.do(t, "POST", "/v1/secrets", s.user, `{"name": "openai", "value": "v2"}`, "Idempotency-Key", "k1")
	if other.status != 409 {
		t.Fatalf("another value under the same Idempotency-Key: %d %s", other.status, other.body)
	}
	if v, err := s.svc.SecretValue(context.Background(), s.userID, "openai"); err != nil || v != "v1" {
		t.Errorf("value %q, %v after the refused retry, want v1", v, err)
	}
}

// The same request sent at once to two API servers with one Idempotency-Key
// runs once: the store gives the key to one request, and the others wait
// for its answer and replay it. A key that stays claimed past
// IdempotencyWait is refused with 409, and once released runs again.
func TestIdempotentAcrossReplicas(t *testing.T) {
	s := newSecretServer(t)
	ctx := context.Background()
	body := `{"name": "race", "role": "user"}`
	const n = 12
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := *s
			if i%2 == 1 {
				c.url = s.url2
			}
			answers[i] = c.do(t, "POST", "/v1/keys", s.admin, body, "Idempotency-Key", "race-1")
		})
	}
	wg.Wait()
	fresh := 0
	for i, a := range answers {
		if a.status != 201 || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d: %d %s, want 201 %s", i, a.status, a.body, answers[0].body)
		}
		if a.header.Get("Idempotent-Replayed") != "true" {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d answers were not replays, want 1", fresh)
	}
	keys, err := s.st.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for _, k := range keys {
		if k.Name == "race" {
			made++
		}
	}
	if made != 1 {
		t.Fatalf("%d keys named race, want 1: the request ran more than once", made)
	}

	// A claim held elsewhere (its server still at work) makes a request wait,
	// then refuses it; released, the key runs the request.
	defer func(d time.Duration) { IdempotencyWait = d }(IdempotencyWait)
	IdempotencyWait = 300 * time.Millisecond
	body = `{"name": "held", "role": "user"}`
	sum := s.box.MAC([]byte("POST\n/v1/keys\n" + body))
	if _, claimed, err := s.st.ClaimIdempotent(ctx, s.adminID, "held-1", sum); err != nil || !claimed {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	start := time.Now()
	a := s.do(t, "POST", "/v1/keys", s.admin, body, "Idempotency-Key", "held-1")
	if a.status != 409 || !strings.Contains(string(a.body), "still under way") || time.Since(start) < IdempotencyWait {
		t.Fatalf("request under a held key: %d %s after %s, want 409 after %s", a.status, a.body, time.Since(start), IdempotencyWait)
	}
	if err := s.st.ReleaseIdempotent(ctx, s.adminID, "held-1", sum); err != nil {
		t.Fatal(err)
	}
	if a := s.do(t, "POST", "/v1/keys", s.admin, body, "Idempotency-Key", "held-1"); a.status != 201 || a.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after the release: %d %s (replayed %q)", a.status, a.body, a.header.Get("Idempotent-Replayed"))
	}
}

// What the store remembers of idempotent requests that hold a secret is
// sealed (a new key) and keyed (a secret's value): neither can be read or
// guessed from the database alone, and a retry still gets its answer.
func TestIdempotentSecretsSealed(t *testing.T) {
	s := newSecretServer(t)
	ctx := context.Background()
	keyBody := `{"name": "ci", "role": "user"}`
	first := s.do(t, "POST", "/v1/keys", s.admin, keyBody, "Idempotency-Key", "mint-1")
	again := s.do(t, "POST", "/v1/keys", s.admin, keyBody, "Idempotency-Key", "mint-1")
	var made apiv1.KeyCreated
	if first.status != 201 || json.Unmarshal(first.body, &made) != nil || made.Key == "" {
		t.Fatalf("create key: %d %s", first.status, first.body)
	}
	if again.status != 201 || !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s", again.status, again.body)
	}
	row, err := s.st.GetIdempotent(ctx, s.adminID, "mint-1")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(row.Body, []byte(made.Key)) || bytes.Contains(row.Body, []byte(`"key"`)) {
		t.Errorf("the store holds the new key in clear: %q", row.Body)
	}
	plain := sha256.Sum256([]byte("POST\n/v1/keys\n" + keyBody))
	if bytes.Equal(row.RequestHash, plain[:]) {
		t.Errorf("the fingerprint of a key request is a plain sha256")
	}

	secretBody := `{"name": "openai", "value": "sk-guessable"}`
	if a := s.do(t, "POST", "/v1/secrets", s.user, secretBody, "Idempotency-Key", "put-1"); a.status != 201 {
		t.Fatalf("put secret: %d %s", a.status, a.body)
	}
	row, err = s.st.GetIdempotent(ctx, s.userID, "put-1")
	if err != nil {
		t.Fatal(err)
	}
	plain = sha256.Sum256([]byte("POST\n/v1/secrets\n" + secretBody))
	if bytes.Equal(row.RequestHash, plain[:]) {
		t.Errorf("the fingerprint of a secret's value is a plain sha256: it could be tested against guesses")
	}
}

// A server started without a secrets box refuses secret calls, saying why.
func TestSecretsWithoutBox(t *testing.T) {
	ctx := context.Background()
	dir := datadir.Dir{Root: t.TempDir()}
	st, err := store.Open(dir.Store())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc, err := service.New(ctx, service.Config{Dir: dir, Runtime: service.RuntimeOf(sandboxtest.New(t, dir)), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	key, err := svc.EnsureAdminKey(ctx, dir.AdminKey())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{Service: svc, Store: st}))
	defer srv.Close()
	s := &secretServer{url: srv.URL}
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/secrets", `{"name": "a", "value": "v"}`}, {"GET", "/v1/secrets", ""}, {"DELETE", "/v1/secrets/a", ""},
	} {
		a := s.do(t, r.method, r.path, key, r.body)
		if a.status != 503 || !strings.Contains(string(a.body), "this server keeps no secrets") {
			t.Errorf("%s %s: %d %s, want 503 saying why", r.method, r.path, a.status, a.body)
		}
	}
}
