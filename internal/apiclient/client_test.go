package apiclient

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func newServer(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return New(srv.URL, "key1")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		class    error // nil: none
		wantCode string
		wantMsg  string
	}{
		{"invalid", 400, `{"error":{"code":"invalid_argument","message":"vcpus must be 1 to 8"}}`, errdefs.ErrInvalid, "invalid_argument", "vcpus must be 1 to 8"},
		{"too large", 413, `{"error":{"code":"payload_too_large","message":"too big"}}`, errdefs.ErrTooLarge, "payload_too_large", "too big"},
		{"not found", 404, `{"error":{"code":"not_found","message":"no sandbox sbx1"}}`, errdefs.ErrNotFound, "not_found", "no sandbox sbx1"},
		{"conflict", 409, `{"error":{"code":"conflict","message":"sandbox is paused"}}`, errdefs.ErrConflict, "conflict", "sandbox is paused"},
		{"exhausted", 429, `{"error":{"code":"resource_exhausted","message":"quota"}}`, errdefs.ErrExhausted, "resource_exhausted", "quota"},
		{"unauthenticated", 401, `{"error":{"code":"unauthenticated","message":"bad key"}}`, errdefs.ErrUnauthenticated, "unauthenticated", "bad key"},
		{"denied", 403, `{"error":{"code":"permission_denied","message":"admin only"}}`, errdefs.ErrPermission, "permission_denied", "admin only"},
		{"unavailable", 503, `{"error":{"code":"unavailable","message":"restarting"}}`, errdefs.ErrUnavailable, "unavailable", "restarting"},
		{"internal", 500, `{"error":{"code":"internal","message":"boom"}}`, nil, "internal", "boom"},
		{"no body, code from status", 404, ``, errdefs.ErrNotFound, "not_found", "the airlock server answered 404 Not Found"},
		{"text body", 502, "bad gateway\n", nil, "internal", "the airlock server answered 502 Bad Gateway: bad gateway"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			_, err := c.GetSandbox(context.Background(), "sbx1")
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("got %v (%T), want *Error", err, err)
			}
			if ae.Status != tc.status || ae.Code != tc.wantCode {
				t.Errorf("status %d code %q, want %d %q", ae.Status, ae.Code, tc.status, tc.wantCode)
			}
			if err.Error() != tc.wantMsg {
				t.Errorf("message %q, want %q", err.Error(), tc.wantMsg)
			}
			for _, class := range []error{errdefs.ErrInvalid, errdefs.ErrNotFound, errdefs.ErrConflict,
				errdefs.ErrExhausted, errdefs.ErrPrecondition, errdefs.ErrUnavailable, errdefs.ErrUnauthenticated,
				errdefs.ErrPermission, errdefs.ErrTooLarge} {
				if got, want := errors.Is(err, class), class == tc.class; got != want {
					t.Errorf("errors.Is(err, %v) = %v, want %v", class, got, want)
				}
			}
		})
	}
}

func TestErrorDetails(t *testing.T) {
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 409, apiv1.ErrorBody{Error: apiv1.Error{Code: "conflict", Message: "paused", Details: map[string]any{"state": "paused"}}})
	}))
	_, err := c.PauseSandbox(context.Background(), "sbx1")
	var ae *Error
	if !errors.As(err, &ae) || ae.Details["state"] != "paused" {
		t.Fatalf("got %#v", err)
	}
}

func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	_, err = New(url, "k").GetSandbox(context.Background(), "sbx1")
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("got %v, want unavailable wrapping ECONNREFUSED", err)
	}
	want := "cannot reach the airlock server at " + url + ": is `airlock serve` running? (set --url or AIRLOCK_URL)"
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

// recorder keeps the requests a fake server saw.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (rec *recorder) add(r *http.Request) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.reqs = append(rec.reqs, r.Clone(context.Background()))
}

func (rec *recorder) last() *http.Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.reqs[len(rec.reqs)-1]
}

func TestHeaders(t *testing.T) {
	rec := &recorder{}
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		switch {
		case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodPost:
			writeJSON(w, 202, apiv1.SandboxOperation{Sandbox: apiv1.Sandbox{ID: "sbx1"}, Operation: apiv1.Operation{ID: "op1"}})
		case strings.HasSuffix(r.URL.Path, "/attach"):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "id: 1\nevent: exit\ndata: {}\n\n")
		default:
			writeJSON(w, 200, map[string]string{"status": "ok"})
		}
	}))
	ctx := context.Background()

	so, err := c.CreateSandbox(ctx, apiv1.CreateSandbox{Template: "base"}, IdempotencyKey("retry-7"))
	if err != nil || so.Sandbox.ID != "sbx1" || so.Operation.ID != "op1" {
		t.Fatalf("CreateSandbox: %+v %v", so, err)
	}
	r := rec.last()
	if got := r.Header.Get("Idempotency-Key"); got != "retry-7" {
		t.Errorf("Idempotency-Key %q", got)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer key1" {
		t.Errorf("Authorization %q", got)
	}
	if got := r.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}

	if _, err := c.GetSandbox(ctx, "sbx1"); err != nil {
		t.Fatal(err)
	}
	if got := rec.last().Header.Get("Idempotency-Key"); got != "" {
		t.Errorf("Idempotency-Key sent without the option: %q", got)
	}

	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.last().Header.Get("Authorization"); got != "" {
		t.Errorf("healthz sent Authorization %q", got)
	}

	st, err := c.Attach(ctx, "cmd1", Token("attach-tok"), LastEventID(41))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	r = rec.last()
	if r.URL.Path != "/v1/commands/cmd1/attach" || r.Header.Get("Authorization") != "Bearer attach-tok" ||
		r.Header.Get("Last-Event-ID") != "41" || r.Header.Get("Accept") != "text/event-stream" {
		t.Errorf("attach request %s %v", r.URL.Path, r.Header)
	}
}

func TestListSandboxesQuery(t *testing.T) {
	rec := &recorder{}
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		writeJSON(w, 200, apiv1.List[apiv1.Sandbox]{Items: []apiv1.Sandbox{{ID: "sbx2"}}, NextPageToken: "t2"})
	}))
	page, err := c.ListSandboxes(context.Background(), SandboxFilter{State: "running", Metadata: map[string]string{"team": "a b"}},
		ListOptions{Limit: 10, PageToken: "t1"})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != "sbx2" || page.NextPageToken != "t2" {
		t.Fatalf("%+v %v", page, err)
	}
	q := rec.last().URL.Query()
	for k, want := range map[string]string{"state": "running", "metadata.team": "a b", "limit": "10", "page_token": "t1"} {
		if q.Get(k) != want {
			t.Errorf("query %s=%q, want %q", k, q.Get(k), want)
		}
	}
}

func TestSandboxMetrics(t *testing.T) {
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method != http.MethodGet:
			http.NotFound(w, r)
		case r.URL.Path == "/v1/sandboxes/sbx1/metrics":
			io.WriteString(w, `{"cpu_used_pct":12.5,"cpu_count":2,"mem_used_mib":41,"mem_total_mib":467,"mem_cache_mib":3,`+
				`"disk_used_mib":655,"disk_total_mib":1983,"vmm_cpu_pct":30.5,"vmm_mem_mib":510,"time":"2026-12-01T12:00:00Z"}`)
		case r.URL.Path == "/v1/sandboxes/sbx2/metrics":
			io.WriteString(w, `{"cpu_used_pct":1,"cpu_count":1,"mem_used_mib":1,"mem_total_mib":2,"mem_cache_mib":0,`+
				`"disk_used_mib":3,"disk_total_mib":4,"time":"2026-12-01T12:00:00Z"}`)
		default:
			writeJSON(w, 409, apiv1.ErrorBody{Error: apiv1.Error{Code: "conflict", Message: "sandbox is paused"}})
		}
	}))
	m, err := c.SandboxMetrics(context.Background(), "sbx1")
	want := apiv1.SandboxMetrics{CPUUsedPct: 12.5, CPUCount: 2, MemUsedMiB: 41, MemTotalMiB: 467, MemCacheMiB: 3,
		DiskUsedMiB: 655, DiskTotalMiB: 1983, VMMCPUPct: 30.5, VMMMemMiB: 510, Time: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	if err != nil || m != want {
		t.Fatalf("metrics with host-side fields: %+v %v", m, err)
	}
	if m, err = c.SandboxMetrics(context.Background(), "sbx2"); err != nil || m.VMMCPUPct != 0 || m.VMMMemMiB != 0 || m.DiskTotalMiB != 4 {
		t.Fatalf("metrics without host-side fields: %+v %v", m, err)
	}
	if _, err := c.SandboxMetrics(context.Background(), "sbx3"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("metrics of a paused sandbox: %v", err)
	}
}

func TestWaitOperation(t *testing.T) {
	var mu sync.Mutex
	polls := 0
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/operations/op1" || r.URL.Query().Get("wait_s") != "30" {
			writeJSON(w, 400, apiv1.ErrorBody{Error: apiv1.Error{Code: "invalid_argument", Message: "bad request " + r.URL.String()}})
			return
		}
		mu.Lock()
		polls++
		n := polls
		mu.Unlock()
		op := apiv1.Operation{ID: "op1", Kind: "create", Status: "running"}
		if n == 3 {
			op.Status = "failed"
			op.Error = &apiv1.Status{Code: "internal", Message: "boot failed"}
		}
		writeJSON(w, 200, op)
	}))
	op, err := c.WaitOperation(context.Background(), "op1")
	if err != nil {
		t.Fatal(err)
	}
	if op.Status != "failed" || op.Error == nil || op.Error.Message != "boot failed" || polls != 3 {
		t.Fatalf("op %+v after %d polls", op, polls)
	}
}

func TestLifecycleAnswers(t *testing.T) {
	// A lifecycle call may answer with the operation alone or with the
	// sandbox beside it.
	for name, body := range map[string]any{
		"bare":         apiv1.Operation{ID: "op9", Kind: "delete"},
		"with sandbox": apiv1.SandboxOperation{Sandbox: apiv1.Sandbox{ID: "sbx1"}, Operation: apiv1.Operation{ID: "op9", Kind: "delete"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodDelete || r.URL.Path != "/v1/sandboxes/sbx1" {
					http.NotFound(w, r)
					return
				}
				writeJSON(w, 202, body)
			}))
			op, err := c.DeleteSandbox(context.Background(), "sbx1")
			if err != nil || op.ID != "op9" || op.Kind != "delete" {
				t.Fatalf("%+v %v", op, err)
			}
		})
	}
}

// TestWriteFileStreams checks that an upload goes out while it is being
// produced: the producer stops after the first MiB until the server has
// received it, which a client that buffered the body would never let
// happen.
func TestWriteFileStreams(t *testing.T) {
	const total = 64 << 20
	const chunk = 1 << 20
	seenFirst := make(chan struct{})
	type result struct {
		n    int64
		sum  [32]byte
		path string
		mode string
	}
	got := make(chan result, 1)
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Path != "/v1/sandboxes/sbx1/files" {
			http.NotFound(w, r)
			return
		}
		h := sha256.New()
		n, err := io.CopyN(h, r.Body, chunk)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		close(seenFirst)
		m, _ := io.Copy(h, r.Body)
		var res result
		res.n, res.path, res.mode = n+m, r.URL.Query().Get("path"), r.URL.Query().Get("mode")
		copy(res.sum[:], h.Sum(nil))
		got <- res
		w.WriteHeader(http.StatusNoContent)
	}))

	pr, pw := io.Pipe()
	wantSum := make(chan [32]byte, 1)
	go func() {
		want := sha256.New()
		defer func() { wantSum <- [32]byte(want.Sum(nil)) }()
		block := make([]byte, chunk)
		for i := 0; i < total/chunk; i++ {
			for j := range block {
				block[j] = byte(i + j)
			}
			want.Write(block)
			if _, err := pw.Write(block); err != nil {
				return
			}
			if i == 0 {
				select {
				case <-seenFirst:
				case <-time.After(20 * time.Second):
					pw.CloseWithError(errors.New("the server got nothing while the body was still being produced"))
					return
				}
			}
		}
		pw.Close()
	}()
	if err := c.WriteFile(context.Background(), "sbx1", "/data/big.bin", 0o640, pr); err != nil {
		t.Fatal(err)
	}
	res, sum := <-got, <-wantSum
	if res.n != total || res.sum != sum {
		t.Fatalf("server got %d bytes (content matches: %v), want %d", res.n, res.sum == sum, total)
	}
	if res.path != "/data/big.bin" || res.mode != "0640" {
		t.Fatalf("path %q mode %q", res.path, res.mode)
	}
}

func TestFilesRoutes(t *testing.T) {
	rec := &recorder{}
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		switch r.URL.Path {
		case "/v1/sandboxes/sbx1/files":
			if r.Method == http.MethodGet {
				if r.URL.Query().Get("path") == "/missing" {
					writeJSON(w, 404, apiv1.ErrorBody{Error: apiv1.Error{Code: "not_found", Message: "no /missing"}})
					return
				}
				io.WriteString(w, "content of "+r.URL.Query().Get("path"))
				return
			}
			w.WriteHeader(204)
		case "/v1/sandboxes/sbx1/fs/stat":
			writeJSON(w, 200, apiv1.Stat{Path: r.URL.Query().Get("path"), Type: "dir", Mode: "0755"})
		case "/v1/sandboxes/sbx1/fs/list":
			writeJSON(w, 200, map[string]any{"items": []apiv1.Stat{{Path: "/a/b", Type: "file"}}})
		default:
			w.WriteHeader(204)
		}
	}))
	ctx := context.Background()
	rc, err := c.ReadFile(ctx, "sbx1", "/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "content of /etc/hostname" {
		t.Fatalf("ReadFile: %q", b)
	}
	if _, err := c.ReadFile(ctx, "sbx1", "/missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("ReadFile of a missing file: %v", err)
	}
	st, err := c.Stat(ctx, "sbx1", "/a")
	if err != nil || st.Type != "dir" || st.Path != "/a" {
		t.Fatalf("Stat: %+v %v", st, err)
	}
	items, err := c.List(ctx, "sbx1", "/a", 2)
	if err != nil || len(items) != 1 || rec.last().URL.Query().Get("depth") != "2" {
		t.Fatalf("List: %+v %v", items, err)
	}
	if err := c.Remove(ctx, "sbx1", "/a", true); err != nil {
		t.Fatal(err)
	}
	if r := rec.last(); r.Method != http.MethodDelete || r.URL.Query().Get("recursive") != "true" {
		t.Fatalf("Remove sent %s %s", r.Method, r.URL)
	}
	if err := c.Move(ctx, "sbx1", "/a", "/b"); err != nil {
		t.Fatal(err)
	}
	if r := rec.last(); r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes/sbx1/fs/move" {
		t.Fatalf("Move sent %s %s", r.Method, r.URL)
	}
}

// eventWriter writes SSE events to a response.
type eventWriter struct {
	w http.ResponseWriter
}

func (e eventWriter) event(id int64, name string, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(e.w, "id: %d\nevent: %s\ndata: %s\n\n", id, name, b)
	e.w.(http.Flusher).Flush()
}
