package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// TestRequireNodeToken: only the right token reaches the handler; a
// missing or wrong one (shorter, longer, one byte off) is answered 401 in
// the contract's shape, and says which.
func TestRequireNodeToken(t *testing.T) {
	token := strings.Repeat("k", MinNodeTokenLen)
	reached := 0
	h := RequireNodeToken(token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		io.WriteString(w, "ok")
	}))
	for _, tc := range []struct {
		name, token string
		ok          bool
		says        string
	}{
		{"right", token, true, ""},
		{"missing", "", false, "send the cluster's internal token"},
		{"shorter", token[1:], false, "is not this node's"},
		{"longer", token + "k", false, "is not this node's"},
		{"one byte off", "j" + token[1:], false, "is not this node's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := reached
			req := httptest.NewRequest(http.MethodGet, "/v1/sandboxes", nil)
			if tc.token != "" {
				req.Header.Set(NodeTokenHeader, tc.token)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if tc.ok {
				if rec.Code != 200 || reached != before+1 {
					t.Fatalf("status %d, reached %d times; want 200 and the handler", rec.Code, reached-before)
				}
				return
			}
			var body apiv1.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != http.StatusUnauthorized || body.Error.Code != apiv1.CodeUnauthenticated || !strings.Contains(body.Error.Message, tc.says) {
				t.Errorf("status %d, error %+v; want 401 unauthenticated saying %q", rec.Code, body.Error, tc.says)
			}
			if reached != before {
				t.Error("the handler was reached")
			}
		})
	}
}
