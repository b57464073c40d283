package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestSecretsRoutes(t *testing.T) {
	var mu sync.Mutex
	stored := map[string]string{}
	var seen []string // method, escaped path and query of each request
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Method+" "+r.URL.RequestURI())
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/secrets":
			var req apiv1.PutSecret
			dec := json.NewDecoder(r.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil || r.Header.Get("Content-Type") != "application/json" {
				writeJSON(w, 400, apiv1.ErrorBody{Error: apiv1.Error{Code: "invalid_argument", Message: "bad body"}})
				return
			}
			status := http.StatusOK
			if _, ok := stored[req.Name]; !ok {
				status = http.StatusCreated
			}
			stored[req.Name] = req.Value
			writeJSON(w, status, apiv1.Secret{Name: req.Name, CreatedAt: created, UpdatedAt: created})
		case r.Method == http.MethodGet && r.URL.Path == "/v1/secrets":
			writeJSON(w, 200, apiv1.List[apiv1.Secret]{Items: []apiv1.Secret{{Name: "openai", CreatedAt: created}}, NextPageToken: "t2"})
		case r.Method == http.MethodDelete && r.URL.Path == "/v1/secrets/openai":
			w.WriteHeader(204)
		default:
			writeJSON(w, 404, apiv1.ErrorBody{Error: apiv1.Error{Code: "not_found", Message: "secret is not stored"}})
		}
	}))
	ctx := context.Background()

	sec, isNew, err := c.PutSecret(ctx, apiv1.PutSecret{Name: "openai", Value: "sk-1"})
	if err != nil || !isNew || sec.Name != "openai" || !sec.CreatedAt.Equal(created) {
		t.Fatalf("first PutSecret = %+v, %v, %v", sec, isNew, err)
	}
	if _, isNew, err := c.PutSecret(ctx, apiv1.PutSecret{Name: "openai", Value: "sk-2"}); err != nil || isNew {
		t.Fatalf("second PutSecret = %v, %v; want a replace", isNew, err)
	}
	mu.Lock()
	if stored["openai"] != "sk-2" {
		t.Errorf("the server got %q", stored["openai"])
	}
	mu.Unlock()

	l, err := c.ListSecrets(ctx, ListOptions{Limit: 5, PageToken: "t1"})
	if err != nil || len(l.Items) != 1 || l.NextPageToken != "t2" {
		t.Fatalf("ListSecrets = %+v, %v", l, err)
	}
	if err := c.DeleteSecret(ctx, "openai"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSecret(ctx, "a/b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("DeleteSecret of a missing name: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"POST /v1/secrets", "POST /v1/secrets",
		"GET /v1/secrets?limit=5&page_token=t1",
		"DELETE /v1/secrets/openai",
		"DELETE /v1/secrets/a%2Fb", // one path segment, escaped
	}
	if len(seen) != len(want) {
		t.Fatalf("requests %q, want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d: %s, want %s", i, seen[i], want[i])
		}
	}
}
