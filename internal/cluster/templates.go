package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/airlockhq/airlock/internal/api"
	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/clustertls"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
)

// TemplatesPath is where a node or an API replica serves its template
// images to the cluster's nodes, behind the internal token:
//
//	GET TemplatesPath + "sha256:<hex>"        the image's template.Export (JSON)
//	GET TemplatesPath + "sha256:<hex>/image"  the image's bytes
const TemplatesPath = "/internal/v1/templates/"

// ServeTemplates serves the images of ts under TemplatesPath. Put it
// behind api.RequireNodeToken: it is for the cluster's nodes only.
func ServeTemplates(ts *template.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			api.WriteError(w, fmt.Errorf("%s %s: templates are only read here, with GET: %w", r.Method, r.URL.Path, errdefs.ErrInvalid))
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, TemplatesPath)
		dgst, image := strings.CutSuffix(rest, "/image")
		if !ok {
			api.WriteError(w, fmt.Errorf("%s is not a template's path: %w", r.URL.Path, errdefs.ErrNotFound))
			return
		}
		e, f, err := ts.Export(dgst)
		if err != nil {
			api.WriteError(w, err)
			return
		}
		defer f.Close()
		if !image {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(e)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", time.Time{}, f)
	})
}

// FetchTimeout bounds one template's fetch from all its peers.
var FetchTimeout = 30 * time.Minute

// TemplateFetcher gets a node the template images it lacks, by digest,
// from the cluster's other nodes (those whose agents are up) and then
// from its sources (the API replicas' Service). Each image is checked
// against its digest before it is stored (template.Store.PutFetched), and
// its settings (the start command every sandbox of it runs among them),
// which the digest does not cover, against those the cluster's store
// recorded for the digest (FetcherConfig.Settings): a peer can withhold an
// image but never pass off another, nor the right image with other
// settings.
type TemplateFetcher struct {
	ts       *template.Store
	self     string // this node's name: not asked
	token    string
	sources  []*url.URL
	nodes    *nodeWatch // nil: the sources only
	settings func(ctx context.Context, dgst string) (template.Settings, error)
	clients  map[string]*http.Client // by peer kind: node or server
	log      *slog.Logger
	fetches  *prometheus.CounterVec
	bytes    *prometheus.CounterVec

	mu       sync.Mutex
	inflight map[string]*fetch // by digest
}

// fetch is one digest's fetch, shared by the creates that wait for it.
type fetch struct {
	done chan struct{}
	t    template.Template
	err  error
}

// FetcherConfig configures a TemplateFetcher.
type FetcherConfig struct {
	// Templates is the node's store, which fetched images go into.
	Templates *template.Store
	// Node is this node's name; Client, if set, lists the others, of
	// which those Nodes registers are asked (required with Client).
	Node   string
	Client kubernetes.Interface
	Nodes  NodeRegistry
	// Sources are base URLs asked after the nodes: the API replicas'.
	Sources []*url.URL
	// Token is the cluster's internal token.
	Token string
	// TLS is this node's cluster identity: peers are called over TLS,
	// their certificates checked against the cluster CA for their role
	// (a node's, or a source's the server role), and Sources must be
	// https. Nil: plain HTTP, for tests of the protocol only.
	TLS *clustertls.Identity
	// Settings returns the settings the cluster recorded for an image's
	// digest (the store's template catalogue), which a fetched image must
	// come with; errdefs.ErrNotFound when it recorded none, and then the
	// image is fetched only from Sources (the operator's), with theirs.
	// Required.
	Settings func(ctx context.Context, dgst string) (template.Settings, error)
	Log      *slog.Logger
	// Registry gets the fetcher's metrics; nil registers none.
	Registry prometheus.Registerer
}

// NewFetcher starts watching the airlock Nodes until ctx ends, when cfg
// has a client, and returns once they are listed.
func NewFetcher(ctx context.Context, cfg FetcherConfig) (*TemplateFetcher, error) {
	if cfg.Templates == nil || cfg.Token == "" || cfg.Settings == nil {
		return nil, errors.New("template fetcher: a template store, the internal token and the recorded settings are needed")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	clients := map[string]*http.Client{}
	for kind, role := range map[string]string{"node": clustertls.RoleNode, "server": clustertls.RoleServer} {
		tr := &http.Transport{Proxy: nil}
		if cfg.TLS != nil {
			tr = cfg.TLS.Transport(role)
		}
		// The image may be large: only the wait for each answer is bounded.
		tr.ResponseHeaderTimeout = 10 * time.Second
		clients[kind] = &http.Client{Transport: tr}
	}
	if cfg.TLS != nil {
		for _, u := range cfg.Sources {
			if u.Scheme != "https" {
				return nil, fmt.Errorf("template source %s: cluster traffic is TLS: give an https:// URL of the servers' internal listener: %w", u, errdefs.ErrInvalid)
			}
		}
	}
	f := &TemplateFetcher{ts: cfg.Templates, self: cfg.Node, token: cfg.Token, sources: cfg.Sources, log: cfg.Log, settings: cfg.Settings,
		clients:  clients,
		inflight: map[string]*fetch{},
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_node_template_fetches_total",
			Help: "Template images this node asked a peer for, by peer (node: another node; server: a --templates-from source) and result (fetched, absent: the peer lacks it, failed: any other answer, a wrong hash among them).",
		}, []string{"from", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_node_template_fetched_bytes_total",
			Help: "Bytes of the template images this node fetched and kept, by peer (node or server).",
		}, []string{"from"})}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(f.fetches, f.bytes)
	}
	if cfg.Client != nil {
		if cfg.Nodes == nil {
			return nil, errors.New("template fetcher: the registered nodes (Nodes) are needed with a client")
		}
		w, err := watchNodes(ctx, cfg.Client, cfg.Nodes)
		if err != nil {
			return nil, err
		}
		f.nodes = w
	}
	return f, nil
}

// Fetch stores template dgst from the first peer that has it, and
// returns it. Calls for one digest at once share one fetch. A digest no
// peer has is errdefs.ErrNotFound, with what each peer answered.
func (f *TemplateFetcher) Fetch(ctx context.Context, dgst string) (template.Template, error) {
	f.mu.Lock()
	c, ok := f.inflight[dgst]
	if !ok {
		c = &fetch{done: make(chan struct{})}
		f.inflight[dgst] = c
		go func() {
			// Not the caller's context: a create that gives up does not
			// cut a fetch others wait for.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FetchTimeout)
			c.t, c.err = f.fetch(fctx, dgst)
			cancel()
			f.mu.Lock()
			delete(f.inflight, dgst)
			f.mu.Unlock()
			close(c.done)
		}()
	}
	f.mu.Unlock()
	select {
	case <-c.done:
		return c.t, c.err
	case <-ctx.Done():
		return template.Template{}, ctx.Err()
	}
}

// peer is one place a template may be fetched from.
type peer struct {
	name string
	kind string // node or server
	base *url.URL
}

// peers are the other airlock nodes whose agents are up, by name, then
// the sources.
func (f *TemplateFetcher) peers() []peer {
	var out []peer
	if f.nodes != nil {
		nodes, _ := f.nodes.nodes.List(labels.Everything())
		now := time.Now()
		for _, n := range nodes {
			if n.Name == f.self || f.nodes.down(n.Name, now) != "" {
				continue
			}
			if u, err := f.nodes.endpoint(n.Name); err == nil {
				out = append(out, peer{"node " + n.Name, "node", u})
			}
		}
		slices.SortFunc(out, func(a, b peer) int { return strings.Compare(a.name, b.name) })
	}
	for _, u := range f.sources {
		out = append(out, peer{u.String(), "server", u})
	}
	return out
}

func (f *TemplateFetcher) fetch(ctx context.Context, dgst string) (template.Template, error) {
	peers := f.peers()
	if len(peers) == 0 {
		return template.Template{}, fmt.Errorf("template %s is not on this node and there is no other node or source to fetch it from: %w", dgst, errdefs.ErrNotFound)
	}
	var tried []string
	for _, p := range peers {
		start := time.Now()
		t, err := f.fetchFrom(ctx, p, dgst)
		switch {
		case err == nil:
			f.fetches.WithLabelValues(p.kind, "fetched").Inc()
			f.bytes.WithLabelValues(p.kind).Add(float64(t.SizeBytes))
		case errors.Is(err, errdefs.ErrNotFound):
			f.fetches.WithLabelValues(p.kind, "absent").Inc()
		default:
			f.fetches.WithLabelValues(p.kind, "failed").Inc()
		}
		if err == nil {
			f.log.Info("fetched a template", "template", dgst, "from", p.name, "bytes", t.SizeBytes, "took", time.Since(start).Round(time.Millisecond).String())
			return t, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			f.log.Warn("fetch a template", "template", dgst, "from", p.name, "err", err)
		}
		tried = append(tried, fmt.Sprintf("%s: %v", p.name, err))
	}
	return template.Template{}, fmt.Errorf("template %s is not on this node and no peer gave it (%s): %w", dgst, strings.Join(tried, "; "), errdefs.ErrNotFound)
}

// fetchFrom reads the image's Export, then its bytes, into the store.
func (f *TemplateFetcher) fetchFrom(ctx context.Context, p peer, dgst string) (template.Template, error) {
	var e template.Export
	resp, err := f.get(ctx, p, p.base.JoinPath(TemplatesPath, dgst))
	if err != nil {
		return template.Template{}, err
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e)
	resp.Body.Close()
	if err != nil {
		return template.Template{}, fmt.Errorf("read its settings: %w", err)
	}
	if e.Digest != dgst {
		return template.Template{}, fmt.Errorf("asked for %s, it described %s: %w", dgst, e.Digest, errdefs.ErrInvalid)
	}
	want, err := f.settings(ctx, dgst)
	switch {
	case errors.Is(err, errdefs.ErrNotFound) && p.kind == "server":
		// An image the store recorded no settings for is taken with its
		// settings only from a source the operator named, never from
		// another node.
		want = e.Settings
	case errors.Is(err, errdefs.ErrNotFound):
		return template.Template{}, fmt.Errorf("the cluster's store recorded no settings for %s, so the peer's cannot be checked: only a --templates-from source is trusted for it: %w", dgst, errdefs.ErrNotFound)
	case err != nil:
		return template.Template{}, fmt.Errorf("the settings the cluster recorded for %s: %w", dgst, err)
	}
	if got, exp := jsonOf(e.Settings), jsonOf(want); got != exp {
		return template.Template{}, fmt.Errorf("it described %s with settings %s, not the %s the cluster recorded: refused: %w",
			dgst, truncated(got, 300), truncated(exp, 300), errdefs.ErrInvalid)
	}
	if resp, err = f.get(ctx, p, p.base.JoinPath(TemplatesPath, dgst, "image")); err != nil {
		return template.Template{}, err
	}
	defer resp.Body.Close()
	return f.ts.PutFetched(ctx, e, resp.Body)
}

// get is a GET with the internal token; an answer other than 200 is
// the server's error (apiclient.ReadError), errdefs.ErrNotFound for a 404.
func (f *TemplateFetcher) get(ctx context.Context, p peer, u *url.URL) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(api.NodeTokenHeader, f.token)
	resp, err := f.clients[p.kind].Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, apiclient.ReadError(resp)
	}
	return resp, nil
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func truncated(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// StoreSettings is FetcherConfig.Settings from the cluster's store: the
// settings recorded for the digest when a server pinned it, or by the
// catalogue entry that names it.
func StoreSettings(st interface {
	TemplateSettings(ctx context.Context, digest string) ([]byte, error)
}) func(ctx context.Context, dgst string) (template.Settings, error) {
	return func(ctx context.Context, dgst string) (template.Settings, error) {
		b, err := st.TemplateSettings(ctx, dgst)
		if err != nil {
			return template.Settings{}, err
		}
		var s template.Settings
		if err := json.Unmarshal(b, &s); err != nil {
			return template.Settings{}, fmt.Errorf("recorded settings of %s: %w", dgst, err)
		}
		return s, nil
	}
}
