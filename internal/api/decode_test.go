package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestDecode(t *testing.T) {
	type req struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	tests := []struct {
		name    string
		body    string
		class   error
		message string
	}{
		{"valid", `{"name":"a","count":2}`, nil, ""},
		{"empty", ``, errdefs.ErrInvalid, "the body is empty"},
		{"wrong type", `{"count":"two"}`, errdefs.ErrInvalid, `field "count" must be int, not string`},
		{"unknown field", `{"name":"a","bogus":1}`, errdefs.ErrInvalid, `unknown field "bogus"`},
		{"not json", `name=a`, errdefs.ErrInvalid, "not valid JSON"},
		{"array", `[1,2]`, errdefs.ErrInvalid, "must be a JSON object, not array"},
		{"trailing data", `{"name":"a"} {"name":"b"}`, errdefs.ErrInvalid, "data after its JSON object"},
		{"too large", `{"name":"` + strings.Repeat("x", MaxJSONBody) + `"}`, errdefs.ErrTooLarge, "over 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", strings.NewReader(tt.body))
			var v req
			err := decode(httptest.NewRecorder(), r, &v)
			if tt.class == nil {
				if err != nil || v.Name != "a" || v.Count != 2 {
					t.Fatalf("decode: %+v, %v", v, err)
				}
				return
			}
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("error %v, want class %v containing %q", err, tt.class, tt.message)
			}
		})
	}
}

func TestWriteError(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("bad: %w", errdefs.ErrInvalid), 400, "invalid_argument"},
		{fmt.Errorf("who: %w", errdefs.ErrUnauthenticated), 401, "unauthenticated"},
		{fmt.Errorf("no: %w", errdefs.ErrPermission), 403, "permission_denied"},
		{fmt.Errorf("gone: %w", errdefs.ErrNotFound), 404, "not_found"},
		{fmt.Errorf("state: %w", errdefs.ErrConflict), 409, "conflict"},
		{fmt.Errorf("big: %w", errdefs.ErrTooLarge), 413, "payload_too_large"},
		{fmt.Errorf("full: %w", errdefs.ErrExhausted), 429, "resource_exhausted"},
		{fmt.Errorf("later: %w", errdefs.ErrUnavailable), 503, "unavailable"},
		{errors.New("boom"), 500, "internal"},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			w := httptest.NewRecorder()
			writeError(w, tt.err)
			var body apiv1.ErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tt.status || body.Error.Code != tt.code || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("%d %+v, want %d %s", w.Code, body, tt.status, tt.code)
			}
			if strings.Contains(body.Error.Message, ": "+strings.SplitN(tt.code, "_", 2)[0]) && tt.code != "internal" {
				t.Errorf("message %q still carries its error class", body.Error.Message)
			}
			if tt.status == 429 && w.Header().Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
		})
	}
}

func TestQueryRefusesUnknownParameters(t *testing.T) {
	tests := []struct {
		url string
		ok  bool
	}{
		{"/x?path=/a", true},
		{"/x?metadata.team=a&state=running", true},
		{"/x?pth=/a", false},
		{"/x?path=%zz", false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "http://h"+tt.url, nil)
		_, err := query(r, "path", "state", "metadata.")
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.url, err)
		}
	}
}

func TestRoutesAreUnique(t *testing.T) {
	seen := map[Route]bool{}
	for _, r := range Routes() {
		if seen[r] {
			t.Errorf("route %s %s registered twice", r.Method, r.Path)
		}
		seen[r] = true
		if r.Method != http.MethodGet && r.Method != http.MethodPost && r.Method != http.MethodPut && r.Method != http.MethodDelete && r.Method != http.MethodPatch {
			t.Errorf("route %s %s has an odd method", r.Method, r.Path)
		}
	}
}
