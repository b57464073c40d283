package api

import (
	"net/http"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/service"
)

// Secrets. A request body here holds a value: it is decoded like every
// JSON body, and no error or log line quotes it.

// putSecret stores a secret: 201 when the name is new, 200 when its value
// was replaced.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	var req apiv1.PutSecret
	if err := decode(w, r, &req); err != nil {
		return err
	}
	sec, created, err := s.svc.PutSecret(r.Context(), p, req)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, sec)
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	_, limit, token, err := pageParams(r)
	if err != nil {
		return err
	}
	list, err := s.svc.ListSecrets(r.Context(), p, limit, token)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	if err := s.svc.DeleteSecret(r.Context(), p, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
