package api

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// An e2b key is minted by POST /v1/keys, shown once, works on the API with
// the tenancy of a native key, shows its format in the list, and stops
// working when revoked.
func TestE2BKeysAPI(t *testing.T) {
	s := newSecretServer(t)
	ctx := context.Background()

	var k apiv1.KeyCreated
	a := s.must(t, 201, "POST", "/v1/keys", s.admin, `{"name": "notebook", "format": "e2b"}`, &k)
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(k.Key) || k.Format != "e2b" || k.Role != "user" ||
		k.Name != "notebook" || !strings.HasPrefix(k.ID, "key") || k.CreatedAt.IsZero() {
		t.Fatalf("create answered %s", a.body)
	}
	var raw map[string]any
	json.Unmarshal(a.body, &raw)
	if raw["format"] != "e2b" {
		t.Errorf("the answer has no \"format\": %s", a.body)
	}
	var native apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.admin, `{"name": "ci", "role": "user", "format": "airlock"}`, &native)
	if native.Format != "airlock" || !strings.HasPrefix(native.Key, "alk_") {
		t.Errorf("format airlock made %+v", native)
	}
	var ops apiv1.KeyCreated
	s.must(t, 201, "POST", "/v1/keys", s.admin, `{"name": "ops", "role": "admin", "format": "e2b"}`, &ops)

	// The e2b key is a bearer key of the native API, and owns what it makes.
	s.must(t, 201, "POST", "/v1/secrets", k.Key, `{"name": "openai", "value": "sk-e2b"}`, nil)
	if v, err := s.svc.SecretValue(ctx, k.ID, "openai"); err != nil || v != "sk-e2b" {
		t.Errorf("the e2b key's secret is %q, %v; want it owned by %s", v, err, k.ID)
	}
	var secs apiv1.List[apiv1.Secret]
	s.must(t, 200, "GET", "/v1/secrets", s.user, "", &secs)
	if len(secs.Items) != 0 {
		t.Errorf("another user key sees the e2b key's secrets: %+v", secs.Items)
	}
	s.must(t, 403, "POST", "/v1/keys", k.Key, `{"name": "x", "format": "e2b"}`, nil)
	var mine apiv1.List[apiv1.Key]
	s.must(t, 200, "GET", "/v1/keys", k.Key, "", &mine)
	if len(mine.Items) != 1 || mine.Items[0].ID != k.ID || mine.Items[0].Format != "e2b" {
		t.Errorf("the e2b key lists %+v, want only itself", mine.Items)
	}
	// An admin e2b key is an admin.
	s.must(t, 201, "POST", "/v1/keys", ops.Key, `{"name": "by-e2b-admin"}`, nil)

	// The admin sees every key with its format, and no secret.
	var all apiv1.List[apiv1.Key]
	a = s.must(t, 200, "GET", "/v1/keys", s.admin, "", &all)
	var got []string
	for _, it := range all.Items {
		got = append(got, it.Name+"="+it.Format)
	}
	if want := "[admin=airlock user=airlock notebook=e2b ci=airlock ops=e2b by-e2b-admin=airlock]"; fmt.Sprint(got) != want {
		t.Errorf("keys %v, want %s", got, want)
	}
	if strings.Contains(string(a.body), k.Key) || strings.Contains(string(a.body), "alk_") || strings.Contains(string(a.body), `"key"`) {
		t.Errorf("the list shows secrets: %s", a.body)
	}

	// Near misses and revoked keys answer 401 like a wrong native key.
	flipped := k.Key[:len(k.Key)-1] + map[bool]string{true: "1", false: "0"}[strings.HasSuffix(k.Key, "0")]
	for _, bad := range []string{flipped, strings.ToUpper(k.Key), "e2b_" + strings.ToUpper(k.Key[4:]), k.Key[:len(k.Key)-1], k.Key + "a"} {
		s.must(t, 401, "GET", "/v1/keys", bad, "", nil)
	}
	s.must(t, 204, "DELETE", "/v1/keys/"+k.ID, s.admin, "", nil)
	a = s.must(t, 401, "GET", "/v1/keys", k.Key, "", nil)
	if !strings.Contains(string(a.body), "the API key is not valid") {
		t.Errorf("a revoked e2b key answered %s", a.body)
	}
	s.must(t, 200, "GET", "/v1/keys", ops.Key, "", nil)
}

func TestKeysBadInput(t *testing.T) {
	s := newSecretServer(t)
	count := func() int {
		var l apiv1.List[apiv1.Key]
		s.must(t, 200, "GET", "/v1/keys", s.admin, "", &l)
		return len(l.Items)
	}
	before := count()
	for _, tc := range []struct {
		name   string
		key    string
		body   string
		status int
		msg    string
	}{
		{"format a number", s.admin, `{"name": "k", "format": 5}`, 400, `field "format" must be string, not number`},
		{"format in capitals", s.admin, `{"name": "k", "format": "E2B"}`, 400, `format "E2B" is not "airlock" or "e2b"`},
		{"format unknown", s.admin, `{"name": "k", "format": "openai"}`, 400, `format "openai" is not "airlock" or "e2b"`},
		{"format an array", s.admin, `{"name": "k", "format": ["e2b"]}`, 400, `field "format" must be string, not array`},
		{"format a bool", s.admin, `{"name": "k", "format": true}`, 400, `field "format" must be string, not bool`},
		{"format too long to echo", s.admin, `{"name": "k", "format": "` + strings.Repeat("e", 200) + `"}`, 400,
			`format "` + strings.Repeat("e", 20) + `…" is not`},
		{"unknown field", s.admin, `{"name": "k", "format": "e2b", "prefix": "e2b_"}`, 400, `unknown field "prefix"`},
		{"misspelt format", s.admin, `{"name": "k", "fromat": "e2b"}`, 400, `unknown field "fromat"`},
		{"no name", s.admin, `{"format": "e2b"}`, 400, "name is required"},
		{"bad role", s.admin, `{"name": "k", "role": "root", "format": "e2b"}`, 400, `role "root" is not`},
		{"a user key", s.user, `{"name": "k", "format": "e2b"}`, 403, "only an admin key may create keys"},
		{"no key", "", `{"name": "k", "format": "e2b"}`, 401, "missing API key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := s.do(t, "POST", "/v1/keys", tc.key, tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tc.status)
			}
			var eb apiv1.ErrorBody
			if err := json.Unmarshal(a.body, &eb); err != nil || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("answer %s (%v), want it to say %q", a.body, err, tc.msg)
			}
			if n := count(); n != before {
				t.Errorf("%d keys after a refused create, want %d", n, before)
			}
		})
	}
	// Absent and empty mean the native form.
	for _, body := range []string{`{"name": "k"}`, `{"name": "k", "format": ""}`} {
		var k apiv1.KeyCreated
		s.must(t, 201, "POST", "/v1/keys", s.admin, body, &k)
		if k.Format != "airlock" || !strings.HasPrefix(k.Key, "alk_") {
			t.Errorf("%s made %+v", body, k)
		}
	}
}
