package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// MaxIdempotencyKey bounds the Idempotency-Key header.
const MaxIdempotencyKey = 255

// streamedBody reports routes whose request body is streamed through, not
// held: their fingerprint is the method and URL only.
func streamedBody(rt route) bool {
	switch rt.path {
	case "/v1/sandboxes/{id}/files", "/v1/sandboxes/{id}/archive", "/v1/commands/{id}/stdin":
		return true
	}
	return false
}

// idempotent runs a mutating request once per (API key, Idempotency-Key):
// a retry gets the first answer back, and a different request under the
// same key is refused.
func (s *Server) idempotent(w *statusWriter, r *http.Request, rt route, p service.Principal, key string) error {
	if len(key) > MaxIdempotencyKey {
		return fmt.Errorf("Idempotency-Key is longer than %d bytes: %w", MaxIdempotencyKey, errdefs.ErrInvalid)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", r.Method, r.URL.RequestURI())
	if !streamedBody(rt) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
		if err != nil {
			return fmt.Errorf("the body is over %d bytes: %w", MaxJSONBody, errdefs.ErrTooLarge)
		}
		h.Write(body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	sum := h.Sum(nil)

	// One request per key at a time, so a quick retry waits for the first.
	lockKey := p.KeyID + "\x00" + key
	s.idemMu.Lock()
	mu, ok := s.idem[lockKey]
	if !ok {
		mu = new(sync.Mutex)
		s.idem[lockKey] = mu
	}
	s.idemMu.Unlock()
	mu.Lock()
	defer mu.Unlock()

	prev, err := s.cfg.Store.GetIdempotent(r.Context(), p.KeyID, key)
	switch {
	case err == nil:
		if !bytes.Equal(prev.RequestHash, sum) {
			return fmt.Errorf("Idempotency-Key %q was used for a different request: use a new key: %w", truncate(key, 40), errdefs.ErrConflict)
		}
		w.Header().Set("Idempotent-Replayed", "true")
		if len(prev.Body) > 0 {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(prev.Status)
		w.Write(prev.Body)
		return nil
	case !errors.Is(err, errdefs.ErrNotFound):
		return err
	}

	rec := &recorder{statusWriter: w}
	if err := rt.handle(rec, r, p); err != nil {
		if rec.wrote {
			return err
		}
		// Errors are answered (and remembered) like any other answer,
		// except failures that a retry may not meet again.
		writeError(rec, err)
	}
	if rec.status >= 500 || rec.overflow {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Store.PutIdempotent(ctx, store.Idempotent{
		KeyID: p.KeyID, Key: key, RequestHash: sum, Status: rec.status, Body: rec.body.Bytes(), CreatedAt: time.Now().UTC(),
	}); err != nil {
		s.log.Warn("remember idempotent answer", "err", err)
	}
	return nil
}

// maxRecorded bounds the answer kept for a replay.
const maxRecorded = 1 << 20

// recorder passes an answer through and keeps a copy.
type recorder struct {
	*statusWriter
	body     bytes.Buffer
	overflow bool
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.body.Len()+len(b) <= maxRecorded {
		r.body.Write(b)
	} else {
		r.overflow = true
	}
	return r.statusWriter.Write(b)
}
