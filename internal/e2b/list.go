package e2b

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/service"
)

// Page sizes of GET /v2/sandboxes.
const (
	defaultListLimit = 100
	maxListLimit     = 100
)

// visible lists every sandbox p may see that E2B would show, by asking the
// service page by page.
func (s *Server) visible(ctx context.Context, p service.Principal) ([]apiv1.Sandbox, error) {
	var all []apiv1.Sandbox
	token := ""
	for {
		page, err := s.svc.ListSandboxes(ctx, p, service.SandboxFilter{PageToken: token, Limit: fields.MaxLimit})
		if err != nil {
			return nil, err
		}
		for _, sb := range page.Items {
			// A creating sandbox is not shown yet: create answers once it runs.
			if e2bState(sb.State) != "" && sb.State != apiv1.StateCreating {
				all = append(all, sb)
			}
		}
		if page.NextPageToken == "" {
			return all, nil
		}
		token = page.NextPageToken
	}
}

// query parses the request's query, refusing one that is not valid.
func query(r *http.Request) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("the query string is not valid: %v: %w", err, errdefs.ErrInvalid)
	}
	return q, nil
}

// parseMetadata reads E2B's metadata filter: "k1=v1&k2=v2", each key and
// value URL-encoded once more by the SDK before the query is encoded.
func parseMetadata(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return nil, fmt.Errorf("metadata %q is not key=value pairs joined by &: %w", truncate(raw, 80), errdefs.ErrInvalid)
	}
	out := make(map[string]string, len(vals))
	for k, vs := range vals {
		v := vs[len(vs)-1]
		if u, err := url.QueryUnescape(k); err == nil {
			k = u
		}
		if u, err := url.QueryUnescape(v); err == nil {
			v = u
		}
		out[k] = v
	}
	return out, nil
}

func matchMetadata(sb apiv1.Sandbox, want map[string]string) bool {
	for k, v := range want {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// listRunning is the deprecated GET /sandboxes: the running sandboxes,
// all of them, optionally filtered by metadata.
func (s *Server) listRunning(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q, err := query(r)
	if err != nil {
		return err
	}
	md, err := parseMetadata(q.Get("metadata"))
	if err != nil {
		return err
	}
	all, err := s.visible(r.Context(), p)
	if err != nil {
		return err
	}
	out := []ListedSandbox{}
	for _, sb := range all {
		if e2bState(sb.State) == stateRunning && matchMetadata(sb, md) {
			out = append(out, s.listedView(sb))
		}
	}
	slices.SortFunc(out, func(a, b ListedSandbox) int { return b.StartedAt.Compare(a.StartedAt) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

// cursor is where a page of GET /v2/sandboxes starts: after the sandbox
// started at time with ID id, in the list's order.
type cursor struct {
	time time.Time
	id   string
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.time.UnixNano(), 10) + ":" + c.id))
}

func parseCursor(tok string) (cursor, error) {
	bad := fmt.Errorf("nextToken is not one this server gave: start again without it: %w", errdefs.ErrInvalid)
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return cursor{}, bad
	}
	ns, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return cursor{}, bad
	}
	return cursor{time: time.Unix(0, n).UTC(), id: id}, nil
}

// list is GET /v2/sandboxes: running and paused sandboxes, filtered by
// state, metadata, template and start time, ordered by start time (newest
// first unless order=asc), a page of limit (1 to 100, default 100) at a
// time, the next page's token in X-Next-Token. X-Total-Running counts
// the caller's running sandboxes. Unknown query parameters (such as the
// SDK's "source") are ignored, as E2B ignores them.
func (s *Server) list(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q, err := query(r)
	if err != nil {
		return err
	}
	md, err := parseMetadata(q.Get("metadata"))
	if err != nil {
		return err
	}
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != stateRunning && st != statePaused {
				return fmt.Errorf("state %q is not running or paused: %w", truncate(st, 40), errdefs.ErrInvalid)
			}
			states[st] = true
		}
	}
	desc := true
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		desc = false
	default:
		return fmt.Errorf("order %q is not asc or desc: %w", truncate(q.Get("order"), 40), errdefs.ErrInvalid)
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return fmt.Errorf("startedAfter %q is not an RFC 3339 time: %w", truncate(v, 40), errdefs.ErrInvalid)
		}
	}
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > maxListLimit {
			return fmt.Errorf("limit %q is out of bounds: use 1 to %d: %w", truncate(v, 20), maxListLimit, errdefs.ErrInvalid)
		}
	}
	var from *cursor
	if v := q.Get("nextToken"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return err
		}
		from = &c
	}
	tpl := q.Get("template")

	all, err := s.visible(r.Context(), p)
	if err != nil {
		return err
	}
	running := 0
	var match []apiv1.Sandbox
	for _, sb := range all {
		st := e2bState(sb.State)
		if st == stateRunning {
			running++
		}
		switch {
		case len(states) > 0 && !states[st]:
		case !matchMetadata(sb, md):
		case tpl != "" && tpl != templateID(sb) && tpl != alias(sb) && templateRef(tpl) != alias(sb) && templateRef(tpl) != sb.Template.Ref:
		case !after.IsZero() && sb.CreatedAt.Before(after):
		default:
			match = append(match, sb)
		}
	}
	less := func(a, b cursor) int {
		if c := a.time.Compare(b.time); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	}
	order := func(a, b cursor) int {
		if desc {
			return less(b, a)
		}
		return less(a, b)
	}
	at := func(sb apiv1.Sandbox) cursor { return cursor{time: sb.CreatedAt.UTC(), id: sb.ID} }
	slices.SortFunc(match, func(a, b apiv1.Sandbox) int { return order(at(a), at(b)) })
	if from != nil {
		i, _ := slices.BinarySearchFunc(match, *from, func(sb apiv1.Sandbox, c cursor) int { return order(at(sb), c) })
		for i < len(match) && order(at(match[i]), *from) <= 0 {
			i++
		}
		match = match[i:]
	}
	if len(match) > limit {
		w.Header().Set("X-Next-Token", at(match[limit-1]).token())
		match = match[:limit]
	}
	out := make([]ListedSandbox, 0, len(match))
	for _, sb := range match {
		out = append(out, s.listedView(sb))
	}
	w.Header().Set("X-Total-Running", strconv.Itoa(running))
	writeJSON(w, http.StatusOK, out)
	return nil
}
