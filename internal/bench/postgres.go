package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/localpg"
	"github.com/airlockhq/airlock/internal/sandbox"
)

// pgAPIServer returns the API server whose store is PostgreSQL, starting a
// throwaway cluster and the server on first use. It is the same server as
// apiServer's in every other way, with a data directory of its own.
func (r *runner) pgAPIServer(ctx context.Context) (*apiServer, error) {
	if r.pgAPI != nil {
		return r.pgAPI, nil
	}
	if r.pg == nil {
		r.progressf("starting a throwaway PostgreSQL cluster")
		c, err := localpg.Start()
		if err != nil {
			return nil, fmt.Errorf("the postgres_ scenarios run a server on PostgreSQL: %w", err)
		}
		r.pg = c
	}
	db, err := r.pg.CreateDatabase()
	if err != nil {
		return nil, err
	}
	s, err := startAPIServer(ctx, r.cfg, nil, r.pg.URL(db))
	if err != nil {
		return nil, fmt.Errorf("start an API server on PostgreSQL: %w", err)
	}
	r.pgAPI = s
	r.progressf("serving the API on %s with its store in PostgreSQL", s.url)
	if err := r.prepareSnapshot(ctx, s.rt, sandbox.Spec{Template: r.cfg.Template}); err != nil {
		return nil, err
	}
	return s, nil
}

// storeServers returns the two servers the postgres_ scenarios compare: the
// one on PostgreSQL and the API scenarios' one on SQLite.
func (r *runner) storeServers(ctx context.Context) (pg, lite *apiServer, err error) {
	if lite, err = r.apiServer(ctx); err != nil {
		return nil, nil, err
	}
	if pg, err = r.pgAPIServer(ctx); err != nil {
		return nil, nil, err
	}
	return pg, lite, nil
}

// closePostgres stops the PostgreSQL server and its cluster.
func (r *runner) closePostgres() error {
	var errs []error
	if r.pgAPI != nil {
		errs = append(errs, r.pgAPI.close())
		r.pgAPI = nil
	}
	if r.pg != nil {
		r.pg.Stop()
		r.pg = nil
	}
	return errors.Join(errs...)
}

// pgCreate times api_create_to_first_output on a server whose store is
// PostgreSQL against one whose store is SQLite, in alternation.
func (r *runner) pgCreate(ctx context.Context) (Result, error) {
	pg, lite, err := r.storeServers(ctx)
	if err != nil {
		return Result{}, err
	}
	n := r.cfg.APIRuns
	a, b, err := r.retryingPairs(ctx, ScenarioPGCreate, n,
		"postgres", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutput(ctx, pg, r.cfg.Template)
		},
		"sqlite", func(ctx context.Context) (time.Duration, error) {
			return r.apiFirstOutput(ctx, lite, r.cfg.Template)
		})
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: api_create_to_first_output (POST /v1/sandboxes of %s, the operation long-polled, "+
		"a command session of argv %v until its first stdout event) on a server in this process whose store is "+
		"PostgreSQL (a throwaway local cluster over loopback, fsync off); baseline: the same on a server whose "+
		"store is SQLite; %d samples each, alternating; ratio of p50s; p50 difference %+.0f ms",
		r.tpl.Ref(), firstOutputArgv, n, a.P50-b.P50)
	return Result{Name: ScenarioPGCreate, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// pgExecRTT times POST /v1/sandboxes/{id}/exec on a server whose store is
// PostgreSQL against one whose store is SQLite, interleaved. An exec
// authenticates its key and records its command in the store.
func (r *runner) pgExecRTT(ctx context.Context) (Result, error) {
	pg, lite, err := r.storeServers(ctx)
	if err != nil {
		return Result{}, err
	}
	a, b, err := r.pairedExecRTT(ctx, ScenarioPGExecRTT, [2]*apiServer{pg, lite}, [2]string{"postgres", "sqlite"})
	if err != nil {
		return Result{}, err
	}
	notes := fmt.Sprintf("airlock: POST /v1/sandboxes/{id}/exec of argv %v until its answer, on a server in this "+
		"process whose store is PostgreSQL (a throwaway local cluster over loopback, fsync off); baseline: the same on "+
		"a server whose store is SQLite; one running %s sandbox on each; %d runs each after %d untimed, interleaved; "+
		"ratio of p50s; p50 difference %+.2f ms", pairedExecArgv, r.tpl.Ref(), r.cfg.ExecRuns, execWarmup, a.P50-b.P50)
	return Result{Name: ScenarioPGExecRTT, Unit: "ms", Airlock: a, Baseline: b, Ratio: ratio(a.P50, b.P50), Notes: notes}, nil
}

// pairedExecArgv is what pairedExecRTT runs.
var pairedExecArgv = []string{"true"}

// pairedExecRTT times POST /v1/sandboxes/{id}/exec of pairedExecArgv on
// two servers, one running sandbox on each, interleaved after a warm-up;
// labels name the sides in progress lines.
func (r *runner) pairedExecRTT(ctx context.Context, scenario string, servers [2]*apiServer, labels [2]string) (_, _ Measurement, err error) {
	var ids [2]string
	for i, s := range servers {
		// cerr, not err: an err declared here would shadow the result
		// that the deferred delete joins its error into.
		id, cerr := s.createSandbox(ctx, r.cfg.Template)
		if id != "" {
			defer func() { err = errors.Join(err, s.deleteSandbox(id)) }()
		}
		if cerr != nil {
			return Measurement{}, Measurement{}, cerr
		}
		ids[i] = id
	}
	exec := func(s *apiServer, id string) measure {
		return timed(func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, execTimeout)
			defer cancel()
			return apiExec(ctx, s.client, id, pairedExecArgv)
		})
	}
	sides := []side{{labels[0] + " exec run", exec(servers[0], ids[0])}, {labels[1] + " exec run", exec(servers[1], ids[1])}}
	ds, err := r.warmRounds(ctx, scenario, r.cfg.ExecRuns, 10, sides)
	if err != nil {
		return Measurement{}, Measurement{}, err
	}
	return summarize(ds[0]), summarize(ds[1]), nil
}
