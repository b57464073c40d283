package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
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
	case "/v1/sandboxes/{id}/files", "/v1/sandboxes/{id}/archive", "/v1/commands/{id}/stdin", "/v1/build-contexts":
		return true
	}
	return false
}

// sensitive reports routes whose request or answer holds a secret: a
// secret's value, or a new API key. Their remembered answer is sealed and
// their fingerprint keyed, when the server has a secrets box, so the
// store holds neither in a form that can be read or guessed at.
func sensitive(rt route) bool {
	return rt.method == http.MethodPost && (rt.path == "/v1/keys" || rt.path == "/v1/secrets")
}

// idempotencyAD binds a sealed answer to its key and Idempotency-Key.
func idempotencyAD(keyID, key string) (string, string) { return "idempotency:" + keyID, key }

// idempotent runs a mutating request once per (API key, Idempotency-Key):
// a retry gets the first answer back, and a different request under the
// same key is refused.
func (s *Server) idempotent(w *statusWriter, r *http.Request, rt route, p service.Principal, key string) error {
	if len(key) > MaxIdempotencyKey {
		return fmt.Errorf("Idempotency-Key is longer than %d bytes: %w", MaxIdempotencyKey, errdefs.ErrInvalid)
	}
	var fp bytes.Buffer
	fmt.Fprintf(&fp, "%s\n%s\n", r.Method, r.URL.RequestURI())
	if !streamedBody(rt) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
		if err != nil {
			return fmt.Errorf("the body is over %d bytes: %w", MaxJSONBody, errdefs.ErrTooLarge)
		}
		fp.Write(body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	box := s.cfg.Secrets
	seal := box != nil && sensitive(rt)
	var sum []byte
	if seal {
		sum = box.MAC(fp.Bytes())
	} else {
		h := sha256.Sum256(fp.Bytes())
		sum = h[:]
	}

	// The store gives the key to one request, on whichever server it
	// arrives; one that arrives while that request runs waits for its
	// answer.
	prev, claimed, err := s.claimIdempotent(r.Context(), p.KeyID, key, sum)
	if err != nil {
		return err
	}
	if !claimed {
		if !bytes.Equal(prev.RequestHash, sum) {
			return fmt.Errorf("Idempotency-Key %q was used for a different request: use a new key: %w", truncate(key, 40), errdefs.ErrConflict)
		}
		body := prev.Body
		if seal && len(body) > 0 {
			owner, name := idempotencyAD(p.KeyID, key)
			if body, err = box.Open(owner, name, body); err != nil {
				return fmt.Errorf("open the remembered answer: %w", err)
			}
		}
		w.Header().Set("Idempotent-Replayed", "true")
		if len(body) > 0 {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(prev.Status)
		w.Write(body)
		return nil
	}
	// Until an answer is recorded, the claim is given up on the way out, so
	// that a retry runs the request again: after a failure a retry may not
	// meet, or a panic.
	recorded := false
	defer func() {
		if !recorded {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.cfg.Store.ReleaseIdempotent(ctx, p.KeyID, key, sum); err != nil {
				s.log.Warn("release idempotency key", "err", err)
			}
		}
	}()

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
	answer := rec.body.Bytes()
	if seal && len(answer) > 0 {
		owner, name := idempotencyAD(p.KeyID, key)
		sealed, err := box.Seal(owner, name, answer)
		if err != nil {
			s.log.Warn("remember idempotent answer", "err", err)
			return nil
		}
		answer = sealed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Store.PutIdempotent(ctx, store.Idempotent{
		KeyID: p.KeyID, Key: key, RequestHash: sum, Status: rec.status, Body: answer, CreatedAt: time.Now().UTC(),
	}); err != nil {
		s.log.Warn("remember idempotent answer", "err", err)
		return nil
	}
	recorded = true
	return nil
}

// IdempotencyWait bounds how long a request waits for another under the
// same Idempotency-Key to be answered, before it is refused with 409.
var IdempotencyWait = 30 * time.Second

// claimIdempotent claims (keyID, key) for the request whose fingerprint is
// sum, or returns the answer to replay. While another request holds the
// key it polls, up to IdempotencyWait.
func (s *Server) claimIdempotent(ctx context.Context, keyID, key string, sum []byte) (store.Idempotent, bool, error) {
	deadline := time.Now().Add(IdempotencyWait)
	for poll := 5 * time.Millisecond; ; poll = min(2*poll, 200*time.Millisecond) {
		prev, claimed, err := s.cfg.Store.ClaimIdempotent(ctx, keyID, key, sum)
		if err != nil || claimed || !prev.Pending() || !bytes.Equal(prev.RequestHash, sum) {
			return prev, claimed, err
		}
		if time.Now().After(deadline) {
			return prev, false, fmt.Errorf("a request with Idempotency-Key %q is still under way after %s: retry later: %w",
				truncate(key, 40), IdempotencyWait, errdefs.ErrConflict)
		}
		select {
		case <-ctx.Done():
			return prev, false, ctx.Err()
		case <-time.After(poll):
		}
	}
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
