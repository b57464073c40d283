package api

import (
	"context"
	"net/http"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/service"
)

// optionalJSON is jsonCall for a call whose body may be left out: no
// body is the zero request.
func optionalJSON[Req, Res any](status int, f func(ctx context.Context, p service.Principal, id string, req Req) (Res, error)) func(http.ResponseWriter, *http.Request, service.Principal) error {
	call := jsonCall(status, f)
	return func(w http.ResponseWriter, r *http.Request, p service.Principal) error {
		if r.ContentLength == 0 {
			var req Req
			res, err := f(r.Context(), p, r.PathValue("id"), req)
			if err != nil {
				return err
			}
			writeJSON(w, status, res)
			return nil
		}
		return call(w, r, p)
	}
}

func (s *Server) createCheckpoint(ctx context.Context, p service.Principal, id string, req apiv1.CreateCheckpoint) (apiv1.CheckpointOperation, error) {
	return s.cfg.Checkpoints.Create(ctx, p, id, req)
}

func (s *Server) fork(ctx context.Context, p service.Principal, id string, req apiv1.Fork) (apiv1.Forked, error) {
	return s.cfg.Checkpoints.Fork(ctx, p, id, req)
}

func (s *Server) rollback(ctx context.Context, p service.Principal, id string, req apiv1.Rollback) (apiv1.SandboxOperation, error) {
	return s.cfg.Checkpoints.Rollback(ctx, p, id, req)
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	q, limit, token, err := pageParams(r)
	if err != nil {
		return err
	}
	l, err := s.cfg.Checkpoints.List(r.Context(), p, q.Get("sandbox_id"), token, limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *Server) getCheckpoint(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	c, err := s.cfg.Checkpoints.Get(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.cfg.Checkpoints.Delete(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
