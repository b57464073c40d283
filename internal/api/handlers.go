package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/builds"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/events"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/service"
)

func (s *Server) health(w http.ResponseWriter, r *http.Request, _ service.Principal) error {
	writeJSON(w, http.StatusOK, apiv1.Health{Status: "ok"})
	return nil
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request, _ service.Principal) error {
	promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	return nil
}

// jsonCall is a handler that decodes a JSON body, calls f with the path's
// {id} (if any) and answers status with f's result.
func jsonCall[Req, Res any](status int, f func(ctx context.Context, p service.Principal, id string, req Req) (Res, error)) func(http.ResponseWriter, *http.Request, service.Principal) error {
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		var req Req
		if err := decode(w, r, &req); err != nil {
			return err
		}
		res, err := f(r.Context(), p, r.PathValue("id"), req)
		if err != nil {
			return err
		}
		if status == http.StatusNoContent {
			w.WriteHeader(status)
			return nil
		}
		if st, ok := any(res).(jsonStreamer); ok {
			defer st.Close()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			if err := st.WriteJSON(w); err != nil {
				// The status is sent: the client sees a body cut short.
				panic(http.ErrAbortHandler)
			}
			return nil
		}
		writeJSON(w, status, res)
		return nil
	}
}

// jsonStreamer is an answer too large to hold in memory: it writes its
// own JSON, a piece at a time (sessions.ExecOutput).
type jsonStreamer interface {
	WriteJSON(w io.Writer) error
	Close() error
}

// jsonAction is jsonCall for calls that answer 204 without a body.
func jsonAction[Req any](f func(ctx context.Context, p service.Principal, id string, req Req) error) func(http.ResponseWriter, *http.Request, service.Principal) error {
	return jsonCall(http.StatusNoContent, func(ctx context.Context, p service.Principal, id string, req Req) (*struct{}, error) {
		return nil, f(ctx, p, id, req)
	})
}

// query checks a query string against the parameters a route knows, so
// that a misspelt parameter is an error rather than silently ignored.
func query(r *http.Request, known ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("the query string is malformed: %w", errdefs.ErrInvalid)
	}
	for k := range q {
		ok := false
		for _, kn := range known {
			if k == kn || strings.HasSuffix(kn, ".") && strings.HasPrefix(k, kn) {
				ok = true
			}
		}
		if !ok {
			return nil, fmt.Errorf("unknown query parameter %q: this route takes %s: %w", truncate(k, 40), strings.Join(known, ", "), errdefs.ErrInvalid)
		}
	}
	return q, nil
}

func intParam(q url.Values, name string, def int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s must be an integer, not %q: %w", name, truncate(v, 20), errdefs.ErrInvalid)
	}
	return n, nil
}

func boolParam(q url.Values, name string) (bool, error) {
	switch q.Get(name) {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, fmt.Errorf("%s must be true or false: %w", name, errdefs.ErrInvalid)
}

// Keys.

func (s *Server) createKey(ctx context.Context, p service.Principal, _ string, req apiv1.CreateKey) (apiv1.KeyCreated, error) {
	return s.svc.CreateKey(ctx, p, req)
}

// pageParams reads limit and page_token.
func pageParams(r *http.Request) (url.Values, int, string, error) {
	q := r.URL.Query()
	limit, err := intParam(q, "limit", 0)
	if err != nil {
		return nil, 0, "", err
	}
	if limit == 0 && q.Has("limit") {
		return nil, 0, "", fmt.Errorf("limit 0 is out of bounds: use 1 to %d: %w", fields.MaxLimit, errdefs.ErrInvalid)
	}
	return q, limit, q.Get("page_token"), nil
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	_, limit, token, err := pageParams(r)
	if err != nil {
		return err
	}
	keys, err := s.svc.ListKeys(r.Context(), p, limit, token)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, keys)
	return nil
}

// getKey answers a key with its limits and usage; "self" is the caller's.
func (s *Server) getKey(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	k, err := s.svc.GetKey(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, k)
	return nil
}

func (s *Server) deleteKey(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.svc.DeleteKey(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Operations.

// MaxWait bounds an operation long-poll.
const MaxWait = 60

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	wait, err := intParam(q, "wait_s", 0)
	if err != nil {
		return err
	}
	if wait < 0 || wait > MaxWait {
		return fmt.Errorf("wait_s %d is out of bounds: use 0 to %d: %w", wait, MaxWait, errdefs.ErrInvalid)
	}
	op, err := s.svc.GetOperation(r.Context(), p, r.PathValue("id"), time.Duration(wait)*time.Second)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, op)
	return nil
}

// Sandboxes.

func (s *Server) createSandbox(ctx context.Context, p service.Principal, _ string, req apiv1.CreateSandbox) (apiv1.SandboxOperation, error) {
	return s.svc.CreateSandbox(ctx, p, req)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q, limit, token, err := pageParams(r)
	if err != nil {
		return err
	}
	f := service.SandboxFilter{State: q.Get("state"), PageToken: token, Limit: limit}
	for k, v := range q {
		if name, ok := strings.CutPrefix(k, "metadata."); ok {
			if name == "" || len(v) != 1 {
				return fmt.Errorf("filter %q needs a label name and one value: %w", truncate(k, 40), errdefs.ErrInvalid)
			}
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[name] = v[0]
		}
	}
	list, err := s.svc.ListSandboxes(r.Context(), p, f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	sb, err := s.svc.GetSandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	res, err := s.svc.DeleteSandbox(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, res)
	return nil
}

func (s *Server) keep(ctx context.Context, p service.Principal, id string, req apiv1.Keep) (apiv1.Sandbox, error) {
	return s.svc.Keep(ctx, p, id, req.TimeoutS)
}

// lifecycle is the handler of a lifecycle call without parameters: its
// body, if any, must be an empty JSON object.
func (s *Server) lifecycle(f func(ctx context.Context, p service.Principal, id string) (apiv1.SandboxOperation, error)) func(http.ResponseWriter, *http.Request, service.Principal) error {
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		if r.ContentLength != 0 {
			var empty struct{}
			if err := decode(w, r, &empty); err != nil {
				return err
			}
		}
		res, err := f(r.Context(), p, r.PathValue("id"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusAccepted, res)
		return nil
	}
}

// Commands.

func (s *Server) signal(ctx context.Context, p service.Principal, id string, req apiv1.Signal) error {
	return s.cmds.Signal(ctx, p, id, req.Signal)
}

// resizeReq is the body of POST /v1/commands/{id}/resize.
type resizeReq struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

func (s *Server) resize(ctx context.Context, p service.Principal, id string, req resizeReq) error {
	return s.cmds.Resize(ctx, p, id, req.Rows, req.Cols)
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	_, limit, token, err := pageParams(r)
	if err != nil {
		return err
	}
	list, err := s.cmds.ListCommands(r.Context(), p, r.PathValue("id"), token, limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	c, err := s.cmds.GetCommand(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

// MaxStdinBody bounds one stdin post; larger input goes in several.
const MaxStdinBody = 16 << 20

func (s *Server) stdin(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	eof, err := boolParam(q, "eof")
	if err != nil {
		return err
	}
	if r.ContentLength > MaxStdinBody {
		return fmt.Errorf("a stdin post is at most %d bytes: send more in several posts: %w", MaxStdinBody, errdefs.ErrTooLarge)
	}
	body := http.MaxBytesReader(w, r.Body, MaxStdinBody)
	if err := s.cmds.Stdin(r.Context(), p, r.PathValue("id"), body, eof); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("a stdin post is at most %d bytes: %w", MaxStdinBody, errdefs.ErrTooLarge)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Files.

func (s *Server) mkdir(ctx context.Context, p service.Principal, id string, req apiv1.Path) error {
	return s.svc.Mkdir(ctx, p, id, req.Path)
}

func (s *Server) move(ctx context.Context, p service.Principal, id string, req apiv1.Move) error {
	return s.svc.Move(ctx, p, id, req.From, req.To)
}

func pathParam(q url.Values) (string, error) {
	if len(q["path"]) != 1 {
		return "", fmt.Errorf("give one path query parameter (an absolute path in the sandbox): %w", errdefs.ErrInvalid)
	}
	return q.Get("path"), nil
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	mode, err := service.ParseMode(q.Get("mode"))
	if err != nil {
		return err
	}
	if err := s.svc.WriteFile(r.Context(), p, r.PathValue("id"), path, mode, r.Body); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	st, copyTo, err := s.svc.OpenFile(r.Context(), p, r.PathValue("id"), path)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if st.Type == "file" {
		w.Header().Set("Content-Length", strconv.FormatInt(st.SizeBytes, 10))
	}
	w.WriteHeader(http.StatusOK)
	return copyTo(w)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	recursive, err := boolParam(q, "recursive")
	if err != nil {
		return err
	}
	if err := s.svc.Remove(r.Context(), p, r.PathValue("id"), path, recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) stat(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	st, err := s.svc.Stat(r.Context(), p, r.PathValue("id"), path)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	depth, err := intParam(q, "depth", 1)
	if err != nil {
		return err
	}
	items, err := s.svc.List(r.Context(), p, r.PathValue("id"), path, depth)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct {
		Items []apiv1.Stat `json:"items"`
	}{items})
	return nil
}

func (s *Server) archiveOut(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	copyTo, err := s.svc.OpenArchive(r.Context(), p, r.PathValue("id"), path)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	return copyTo(w)
}

func (s *Server) archiveIn(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	path, err := pathParam(q)
	if err != nil {
		return err
	}
	if err := s.svc.ExtractArchive(r.Context(), p, r.PathValue("id"), path, r.Body); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Templates.

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	_, limit, token, err := pageParams(r)
	if err != nil {
		return err
	}
	list, err := s.bld.ListTemplates(r.Context(), limit, token)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	t, err := s.bld.GetTemplate(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

func (s *Server) createTemplate(ctx context.Context, p service.Principal, _ string, req apiv1.CreateTemplate) (apiv1.TemplateOperation, error) {
	return s.bld.CreateTemplate(ctx, caller(p), req)
}

func (s *Server) saveSandbox(ctx context.Context, p service.Principal, id string, req apiv1.SaveTemplate) (apiv1.TemplateOperation, error) {
	return s.bld.SaveSandbox(ctx, caller(p), id, req)
}

// caller is p as builds know a caller.
func caller(p service.Principal) builds.Principal {
	return builds.Principal{KeyID: p.KeyID, Admin: p.Admin()}
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.bld.DeleteTemplate(r.Context(), caller(p), r.PathValue("ref")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// putBuildContext stores a tar body as a build context, streamed to disk
// and bounded by the server's limit (413 past it).
func (s *Server) putBuildContext(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	limit, keyMiB, err := s.bld.ContextLimit(r.Context(), caller(p))
	if err != nil {
		return err
	}
	bc, err := s.bld.PutBuildContext(r.Context(), r.Body, limit)
	if errors.Is(err, errdefs.ErrTooLarge) && keyMiB >= 0 {
		// The key's own limit stopped it, not the server's.
		asked := keyMiB + 1
		if r.ContentLength > 0 {
			asked = (r.ContentLength + 1<<20 - 1) >> 20
		}
		return &service.LimitError{Limit: "build_context_mib", Max: keyMiB, Requested: asked, Key: p.KeyID}
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, bc)
	return nil
}

// buildLog streams a template build's log: every line so far, then the
// rest as it comes while the build runs, then how it ended.
func (s *Server) buildLog(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	var out *sse
	started := func() *sse {
		if out == nil {
			out = startSSE(w)
		}
		return out
	}
	end, err := s.bld.FollowBuildLog(ctx, r.PathValue("ref"), s.cfg.PingInterval, func(ln *apiv1.BuildLogLine) error {
		if ln == nil {
			return started().ping()
		}
		data, _ := json.Marshal(ln)
		return started().event(0, "log", data)
	})
	if err != nil {
		if out == nil {
			return err
		}
		return nil // the stream is out: the client went away or the server is closing
	}
	data, _ := json.Marshal(end)
	started().event(0, "end", data)
	return nil
}

func (s *Server) sandboxMetrics(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	m, err := s.svc.SandboxMetrics(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, m)
	return nil
}

// Events.

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q := r.URL.Query()
	var eq events.Query
	var err error
	if v := q.Get("after_seq"); v != "" {
		if eq.AfterSeq, err = strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("after_seq must be an integer, not %q: %w", truncate(v, 20), errdefs.ErrInvalid)
		}
	}
	if eq.Limit, err = intParam(q, "limit", 0); err != nil {
		return err
	}
	wait, err := intParam(q, "wait_s", 0)
	if err != nil {
		return err
	}
	if wait < 0 || wait > MaxWait {
		return fmt.Errorf("wait_s %d is out of bounds: use 0 to %d: %w", wait, MaxWait, errdefs.ErrInvalid)
	}
	eq.Wait = time.Duration(wait) * time.Second
	for _, v := range q["type"] {
		eq.Types = append(eq.Types, strings.Split(v, ",")...)
	}
	evs, err := s.cfg.Events.List(r.Context(), p, eq)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, evs)
	return nil
}

// Webhooks.

func (s *Server) createWebhook(ctx context.Context, p service.Principal, _ string, req apiv1.CreateWebhook) (apiv1.WebhookCreated, error) {
	return s.cfg.Webhooks.Create(ctx, p, req)
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	l, err := s.cfg.Webhooks.List(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.cfg.Webhooks.Delete(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) webhookDeliveries(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	l, err := s.cfg.Webhooks.Deliveries(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}
