package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/secrets"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/tenancy"
	"github.com/airlockhq/airlock/internal/webhooks"
)

// eventRuns is how many changes of state event_latency times.
const eventRuns = 100

// eventLatency times a sandbox's change of state, recorded in a store, to
// the webhook delivery of its event to a receiver on loopback, against a
// POST of the same body to the same receiver.
func (r *runner) eventLatency(ctx context.Context) (Result, error) {
	dir, err := os.MkdirTemp("", "alb-events")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	st, err := store.Open(filepath.Join(dir, "airlock.db"))
	if err != nil {
		return Result{}, err
	}
	defer st.Close()
	box, err := secrets.OpenBox(filepath.Join(dir, "secrets.key"))
	if err != nil {
		return Result{}, err
	}
	got := make(chan time.Time, eventRuns+1)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got <- time.Now()
	}))
	defer rcv.Close()

	svc := webhooks.New(webhooks.Config{Store: st, Secrets: box, Private: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	owner := tenancy.Principal{KeyID: "keybench", Role: apiv1.RoleUser}
	if _, err := svc.Create(ctx, owner, apiv1.CreateWebhook{URL: rcv.URL, Types: []string{apiv1.EventSandboxPaused, apiv1.EventSandboxRunning}}); err != nil {
		return Result{}, err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { svc.Run(wctx); close(done) }()
	defer func() { stop(); <-done }()

	sb := store.Sandbox{ID: "sbxbench", Owner: owner.KeyID, State: apiv1.StateCreating, TemplateRef: "tiny:latest", TemplateDigest: "sha256:00",
		VCPUs: 1, MemoryMiB: 256, DiskMiB: 512, OnTimeout: "delete", Env: map[string]string{}, Metadata: map[string]string{}}
	if err := st.InsertSandbox(ctx, sb, store.Operation{ID: "opbench", Kind: apiv1.OpCreate, TargetID: sb.ID, Owner: owner.KeyID, Status: apiv1.OpSucceeded}); err != nil {
		return Result{}, err
	}
	wait := func() (time.Time, error) {
		select {
		case t := <-got:
			return t, nil
		case <-time.After(30 * time.Second):
			return time.Time{}, fmt.Errorf("event_latency: no delivery within 30 s")
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
	var airlock, baseline []time.Duration
	client := &http.Client{Timeout: 10 * time.Second}
	body := []byte(`{"id":"evtbench","seq":1,"type":"sandbox.running","sandbox_id":"sbxbench","data":{"from":"paused","state":"running"}}`)
	for i := range eventRuns {
		sb.State = []string{apiv1.StateRunning, apiv1.StatePaused}[i%2]
		start := time.Now()
		if err := st.UpdateSandbox(ctx, sb); err != nil {
			return Result{}, err
		}
		at, err := wait()
		if err != nil {
			return Result{}, err
		}
		airlock = append(airlock, at.Sub(start))

		start = time.Now()
		resp, err := client.Post(rcv.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			return Result{}, err
		}
		resp.Body.Close()
		if at, err = wait(); err != nil {
			return Result{}, err
		}
		baseline = append(baseline, at.Sub(start))
	}
	a, b := summarize(airlock), summarize(baseline)
	return Result{Name: ScenarioEventLatency, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50),
		Notes: fmt.Sprintf("%d changes of state, each recorded with its event in one SQLite transaction and delivered by the webhook loop (woken by the commit), signed, to a receiver on loopback; p99 %.2f ms", eventRuns, a.P99)}, nil
}
