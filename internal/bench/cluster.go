package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/localcluster"
)

// The cluster_ scenarios' local cluster: two node agents and two API
// replicas on this machine (internal/localcluster).
const (
	clusterNodes    = 2
	clusterReplicas = 2
)

// clusterCreateRounds is how many bursts each side of
// cluster_creates_per_second makes, alternating.
const clusterCreateRounds = 2

// clusterAPI returns a client of the local cluster's first replica,
// starting the cluster on first use, with a template snapshot made on
// every node so that no timed create pays for one.
func (r *runner) clusterAPI(ctx context.Context) (*apiServer, error) {
	if r.clusterSrv != nil {
		return r.clusterSrv, nil
	}
	self := r.cfg.Airlock
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "alc")
	if err != nil {
		return nil, err
	}
	r.clusterDir = dir
	r.progressf("starting a local cluster (%d nodes, %d replicas) in %s", clusterNodes, clusterReplicas, dir)
	c, err := localcluster.Start(ctx, localcluster.Config{Dir: dir, KubeBin: r.cfg.KubeBin, Airlock: self,
		Source: r.cfg.Dir, Nodes: clusterNodes, Replicas: clusterReplicas, Log: r.cfg.Progress,
		// One node alone holds a whole burst: 1 vCPU and the RuntimeClass's
		// 100m each.
		NodeCPUs: r.cfg.Sandboxes + r.cfg.Sandboxes/10 + 2,
		NodeArgs: []string{"--max-sandboxes", strconv.Itoa(max(32, r.cfg.Sandboxes+2*clusterNodes))}})
	r.cluster = c
	if err != nil {
		return nil, fmt.Errorf("the cluster_ scenarios run a local cluster: %w", err)
	}
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	s := &apiServer{url: c.Replicas[0], hc: hc, client: apiclient.New(c.Replicas[0], c.Key, apiclient.WithHTTPClient(hc)),
		live: map[string]bool{}}
	r.clusterSrv = s
	r.progressf("making %s's snapshot on each node", r.tpl.Ref())
	// kube-scheduler spreads sandboxes made at once over the nodes.
	// The first create on a node makes the snapshot, a boot from scratch.
	if _, err := r.burst(ctx, s, 2*clusterNodes, r.burstTimeout(2*clusterNodes)+2*time.Minute); err != nil {
		return nil, err
	}
	return s, nil
}

// closeCluster deletes what the cluster_ scenarios left and stops the
// local cluster.
func (r *runner) closeCluster() error {
	var errs []error
	if r.clusterSrv != nil {
		errs = append(errs, r.clusterSrv.close())
		r.clusterSrv = nil
	}
	if r.cluster != nil {
		r.cluster.Stop()
		r.cluster = nil
	}
	if r.clusterDir != "" {
		errs = append(errs, localcluster.Remove(r.clusterDir))
		r.clusterDir = ""
	}
	return errors.Join(errs...)
}

// clusterServers returns the two servers the cluster_ scenarios compare:
// the local cluster's first replica and the API scenarios' single host.
func (r *runner) clusterServers(ctx context.Context) (cl, single *apiServer, err error) {
	if cl, err = r.clusterAPI(ctx); err != nil {
		return nil, nil, err
	}
	if single, err = r.apiServer(ctx); err != nil {
		return nil, nil, err
	}
	return cl, single, nil
}

// clusterCreate times api_create_to_first_output through a replica of
// the local cluster against the single-host server of the api_ scenarios,
// in alternation.
func (r *runner) clusterCreate(ctx context.Context) (Result, error) {
	cl, single, err := r.clusterServers(ctx)
	if err != nil {
		return Result{}, err
	}
	n := r.cfg.APIRuns
	a, b, err := r.retryingPairs(ctx, ScenarioClusterCreate, n,
		"cluster", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutput(ctx, cl, r.cfg.Template)
		},
		"single host", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutput(ctx, single, r.cfg.Template)
		})
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: api_create_to_first_output (POST /v1/sandboxes of %s, the operation long-polled, "+
		"a command session of argv %v until its first stdout event) through an API replica of a local cluster "+
		"(`airlock localcluster`: %d node agents, %d replicas, PostgreSQL, kube-scheduler binding the Pod, the "+
		"command routed to the node); baseline: the same on a single-host server (SQLite) in this process; "+
		"%d samples each, alternating; ratio of p50s; p50 difference %+.0f ms",
		r.tpl.Ref(), firstOutputArgv, clusterNodes, clusterReplicas, n, a.P50-b.P50)
	return Result{Name: ScenarioClusterCreate, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// clusterExecRTT times POST /v1/sandboxes/{id}/exec through a replica of
// the local cluster, which forwards it to the sandbox's node, against the
// single-host server, interleaved.
func (r *runner) clusterExecRTT(ctx context.Context) (Result, error) {
	cl, single, err := r.clusterServers(ctx)
	if err != nil {
		return Result{}, err
	}
	a, b, err := r.pairedExecRTT(ctx, ScenarioClusterExecRTT, [2]*apiServer{cl, single}, [2]string{"cluster", "single-host"})
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: POST /v1/sandboxes/{id}/exec of argv %v until its answer, through an API replica "+
		"of a local cluster, which finds the sandbox's node and forwards the call to the node's internal API; "+
		"baseline: the same on a single-host server (SQLite) in this process; one running %s sandbox on each; "+
		"%d runs each after %d untimed, interleaved; ratio of p50s; p50 difference %+.2f ms",
		pairedExecArgv, r.tpl.Ref(), r.cfg.ExecRuns, execWarmup, a.P50-b.P50)
	return Result{Name: ScenarioClusterExecRTT, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// clusterCreates measures creates per second: bursts of sandboxes
// created at once through a replica, with both nodes schedulable against
// with the second cordoned, alternating.
func (r *runner) clusterCreates(ctx context.Context) (Result, error) {
	cl, err := r.clusterAPI(ctx)
	if err != nil {
		return Result{}, err
	}
	n := r.cfg.Sandboxes
	var two, one []float64
	for i := 1; i <= clusterCreateRounds; i++ {
		for _, nodes := range []int{2, 1} {
			if err := r.cluster.Cordon(r.cluster.Nodes[1], nodes == 1); err != nil {
				return Result{}, err
			}
			d, err := r.burst(ctx, cl, n, r.burstTimeout(n))
			if err != nil {
				r.cluster.Cordon(r.cluster.Nodes[1], false)
				return Result{}, err
			}
			rate := float64(n) / d.Seconds()
			r.progressf("%s %d/%d: %d creates on %d node(s) in %s (%.2f/s)", ScenarioClusterCreates, i, clusterCreateRounds,
				n, nodes, d.Round(time.Millisecond), rate)
			if nodes == 2 {
				two = append(two, rate)
			} else {
				one = append(one, rate)
			}
		}
	}
	if err := r.cluster.Cordon(r.cluster.Nodes[1], false); err != nil {
		return Result{}, err
	}
	a, b := summarizeRates(two), summarizeRates(one)
	notes := fmt.Sprintf("airlock: %d sandboxes of %s created at once through an API replica of a local cluster, "+
		"until every create operation succeeded, with both node agents schedulable; baseline: the same with the "+
		"second node cordoned, so that kube-scheduler binds every Pod to the first; creates per second (higher is "+
		"better: a ratio above 1 means two nodes create faster than one); %d bursts each, alternating, each "+
		"deleted before the next. Both nodes share this host's CPUs, so here the ratio shows what spreading costs "+
		"or gains on one machine, not the capacity a second host adds", n, r.tpl.Ref(), clusterCreateRounds)
	return Result{Name: ScenarioClusterCreates, Unit: "creates/s", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// burstTimeout bounds each create of a burst of n: they share this host's
// CPUs, whichever node makes them.
func (r *runner) burstTimeout(n int) time.Duration {
	return concurrentBootTimeout(r.cfg.BootTimeout, n, runtime.NumCPU()) + execTimeout
}

// burst creates n sandboxes at once through s, each within timeout,
// waits for every create to succeed, then deletes them all (untimed), and
// returns the time from the first request to the last create's end.
func (r *runner) burst(ctx context.Context, s *apiServer, n int, timeout time.Duration) (time.Duration, error) {
	var mu sync.Mutex
	var made []string
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			created, err := s.client.CreateSandbox(ctx, apiv1.CreateSandbox{Template: r.cfg.Template})
			if err != nil {
				errs[i] = fmt.Errorf("create a sandbox over the API: %w", err)
				return
			}
			mu.Lock()
			made = append(made, created.Sandbox.ID)
			mu.Unlock()
			op, err := s.client.WaitOperation(ctx, created.Operation.ID)
			if err == nil && op.Status != apiv1.OpSucceeded {
				err = errors.New(opFailure(op))
			}
			if err != nil {
				errs[i] = fmt.Errorf("create sandbox %s: %w", created.Sandbox.ID, err)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	// Deleted at once too, and each one's error kept.
	dels := make([]error, len(made))
	for i, id := range made {
		wg.Add(1)
		go func() { defer wg.Done(); dels[i] = s.deleteSandbox(id) }()
	}
	wg.Wait()
	return took, errors.Join(append(errs, dels...)...)
}
