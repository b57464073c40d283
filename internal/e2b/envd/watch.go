package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/service"
)

// Bounds on watching, which polls: entries under one watched directory,
// sync watchers per sandbox, events a sync watcher holds between two
// reads, and how long a sync watcher lives unread.
const (
	maxWatchEntries  = 10000
	maxWatchers      = 16
	maxWatcherEvents = 10000
	watcherIdle      = 5 * time.Minute
)

// agentTempPrefix starts the name of the temporary file beside a file
// the guest agent writes; watches do not report it.
const agentTempPrefix = ".airlock-write-"

// snapshot is a listing of a watched directory by path relative to it.
type snapshot map[string]service.Entry

// change is a difference between two snapshots.
type change struct {
	name  string
	typ   string // an EVENT_TYPE_* name
	entry *service.Entry
}

// diff lists what changed from old to cur, by name: a new name is
// CREATE, a gone one REMOVE, another type REMOVE then CREATE, a new size
// or modification time WRITE, new permissions CHMOD.
func diff(old, cur snapshot) []change {
	names := make([]string, 0, len(old)+len(cur))
	for n := range old {
		names = append(names, n)
	}
	for n := range cur {
		if _, ok := old[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var out []change
	for _, n := range names {
		o, had := old[n]
		c, has := cur[n]
		switch {
		case !had:
			out = append(out, change{n, eventCreate, &c})
		case !has:
			out = append(out, change{n, eventRemove, nil})
		case o.Type != c.Type || o.Target != c.Target:
			out = append(out, change{n, eventRemove, nil}, change{n, eventCreate, &c})
		default:
			if o.SizeBytes != c.SizeBytes || !o.ModifiedAt.Equal(c.ModifiedAt) {
				out = append(out, change{n, eventWrite, &c})
			}
			if o.Mode != c.Mode {
				out = append(out, change{n, eventChmod, &c})
			}
		}
	}
	return out
}

// poller watches a directory by listing it through the service.
type poller struct {
	s            *Server
	req          Request
	asked        string // the path as asked, resolved
	dir          string // the directory listed (a symlink's target)
	depth        int
	includeEntry bool
	last         snapshot
	interval     time.Duration // until the next listing
}

// newPoller checks the watched path and takes the first listing.
func (s *Server) newPoller(ctx context.Context, req Request, r *http.Request, wr watchRequest) (*poller, error) {
	user, err := basicUser(r)
	if err != nil {
		return nil, err
	}
	p, err := resolve(wr.Path, user)
	if err != nil {
		return nil, err
	}
	root, err := s.svc.StatEntry(ctx, req.Principal, req.SandboxID, p)
	if err != nil {
		return nil, err
	}
	dir := p
	if root.Type == "symlink" {
		target, te, ok := s.resolver(ctx, req).follow(root)
		if !ok {
			return nil, errorf(codeNotFound, "path %s not found: a dangling symlink", p)
		}
		dir, root = target, te
	}
	if root.Type != "dir" {
		return nil, errorf(codeInvalidArgument, "path %s not a directory", p)
	}
	pl := &poller{s: s, req: req, asked: p, dir: dir, depth: 1, includeEntry: wr.IncludeEntry, interval: s.poll}
	if wr.Recursive {
		pl.depth = service.MaxListDepth
	}
	if pl.last, err = pl.list(ctx); err != nil {
		return nil, err
	}
	return pl, nil
}

func (pl *poller) list(ctx context.Context) (snapshot, error) {
	began := time.Now()
	items, err := pl.s.svc.ListEntries(ctx, pl.req.Principal, pl.req.SandboxID, pl.dir, pl.depth)
	if err != nil {
		return nil, err
	}
	// Poll no more often than ten times what a listing costs.
	pl.interval = max(pl.s.poll, 10*time.Since(began))
	if len(items) > maxWatchEntries {
		return nil, errorf(codeResourceExhausted, "%s holds over %d entries: watch a smaller directory", pl.asked, maxWatchEntries)
	}
	snap := make(snapshot, len(items))
	for _, it := range items {
		if strings.HasPrefix(path.Base(it.Path), agentTempPrefix) {
			continue // a file the agent is writing, renamed into place when whole
		}
		snap[strings.TrimPrefix(strings.TrimPrefix(it.Path, pl.dir), "/")] = it
	}
	return snap, nil
}

// poll lists the directory again and returns the events since the last
// listing.
func (pl *poller) poll(ctx context.Context) ([]fsEvent, error) {
	cur, err := pl.list(ctx)
	if err != nil {
		return nil, err
	}
	changes := diff(pl.last, cur)
	pl.last = cur
	evs := make([]fsEvent, 0, len(changes))
	var rs *resolver
	for _, ch := range changes {
		ev := fsEvent{Name: ch.name, Type: ch.typ}
		if pl.includeEntry && ch.entry != nil {
			if rs == nil {
				rs = pl.s.resolver(ctx, pl.req)
			}
			info := rs.entry(*ch.entry)
			info.Path = path.Join(pl.asked, ch.name)
			ev.Entry = &info
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// watchDir is Filesystem.WatchDir: start, then events as polling finds
// them, with keepalives while it is quiet.
func (s *Server) watchDir(ctx context.Context, req Request, r *http.Request, m message, c call, out *streamWriter) error {
	wr, err := readWatchRequest(m)
	if err != nil {
		return err
	}
	pl, err := s.newPoller(ctx, req, r, wr)
	if err != nil {
		return err
	}
	if err := out.send(watchResponse{Start: &struct{}{}}); err != nil {
		return err
	}
	interval := keepaliveInterval(r)
	keepalive := time.NewTicker(interval)
	defer keepalive.Stop()
	next := time.NewTimer(pl.interval)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-keepalive.C:
			if err := out.send(watchResponse{Keepalive: &struct{}{}}); err != nil {
				return err
			}
		case <-next.C:
			evs, err := pl.poll(ctx)
			if err != nil {
				return err
			}
			for i := range evs {
				if err := out.send(watchResponse{Filesystem: &evs[i]}); err != nil {
					return err
				}
			}
			if len(evs) > 0 {
				keepalive.Reset(interval)
			}
			next.Reset(pl.interval)
		}
	}
}

// watcher is a sync watcher (CreateWatcher): a poller in the background
// whose events wait to be read.
type watcher struct {
	id      string
	sandbox string
	cancel  context.CancelFunc

	mu     sync.Mutex // guards the fields below
	events []fsEvent
	err    error     // polling stopped with it
	seen   time.Time // created or last read
}

func (s *Server) createWatcher(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	wr, err := readWatchRequest(m)
	if err != nil {
		return nil, err
	}
	pl, err := s.newPoller(ctx, req, r, wr)
	if err != nil {
		return nil, err
	}
	var b [12]byte
	rand.Read(b[:])
	wctx, cancel := context.WithCancel(s.ctx)
	w := &watcher{id: "w" + hex.EncodeToString(b[:]), sandbox: req.SandboxID, cancel: cancel, seen: s.now()}
	s.mu.Lock()
	n := 0
	for _, o := range s.watchers {
		if o.sandbox == req.SandboxID {
			n++
		}
	}
	if n >= maxWatchers || s.ctx.Err() != nil {
		s.mu.Unlock()
		cancel()
		return nil, errorf(codeResourceExhausted, "the sandbox has %d watchers, the most it may: remove one first", n)
	}
	s.watchers[w.id] = w
	s.mu.Unlock()
	go s.runWatcher(wctx, w, pl)
	return createWatcherResponse{WatcherID: w.id}, nil
}

// runWatcher polls for w. It ends when w is removed, when it has not been
// read for watcherIdle, or with the Server.
func (s *Server) runWatcher(ctx context.Context, w *watcher, pl *poller) {
	defer s.dropWatcher(w)
	next := time.NewTimer(pl.interval)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
		}
		w.mu.Lock()
		idle, failed := s.now().Sub(w.seen) > watcherIdle, w.err != nil
		w.mu.Unlock()
		if idle {
			return
		}
		if !failed {
			evs, err := pl.poll(ctx)
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			switch {
			case err != nil:
				w.err = err
			case len(w.events)+len(evs) > maxWatcherEvents:
				w.err = errorf(codeResourceExhausted, "over %d events waited to be read: create the watcher again", maxWatcherEvents)
				w.events = nil
			default:
				w.events = append(w.events, evs...)
			}
			w.mu.Unlock()
		}
		next.Reset(pl.interval)
	}
}

func (s *Server) dropWatcher(w *watcher) {
	w.cancel()
	s.mu.Lock()
	if s.watchers[w.id] == w {
		delete(s.watchers, w.id)
	}
	s.mu.Unlock()
}

// watcherOf returns the sandbox's watcher named in the request.
func (s *Server) watcherOf(req Request, m message) (*watcher, error) {
	id, err := m.str("watcherId")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	w, ok := s.watchers[id]
	s.mu.Unlock()
	if !ok || w.sandbox != req.SandboxID {
		return nil, errorf(codeNotFound, "watcher with id %s not found", quote(id))
	}
	return w, nil
}

func (s *Server) getWatcherEvents(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	w, err := s.watcherOf(req, m)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, werr := w.events, w.err
	w.events, w.seen = nil, s.now()
	w.mu.Unlock()
	if werr != nil {
		s.dropWatcher(w)
		return nil, werr
	}
	if evs == nil {
		evs = []fsEvent{}
	}
	return watcherEventsResponse{Events: evs}, nil
}

func (s *Server) removeWatcher(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	w, err := s.watcherOf(req, m)
	if err != nil {
		return nil, err
	}
	s.dropWatcher(w)
	return empty{}, nil
}
