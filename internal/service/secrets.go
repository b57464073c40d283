package service

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/store"
)

// Secrets belong to the API key that stored them (its tenant): every key,
// admin keys too, sees and uses only its own. A value is sealed before it
// reaches the store and is never returned, logged or put in an error; only
// the gateway reads it back, through SecretValue.

// MaxSecretValue bounds a secret's value, in bytes.
const MaxSecretValue = 64 << 10

var secretNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// checkSecretName refuses a name that is not 1 to 64 letters, digits, '_',
// '.' or '-', or that holds "..".
func checkSecretName(name string) error {
	if !secretNamePattern.MatchString(name) || strings.Contains(name, "..") || name == "." {
		return fmt.Errorf("secret name %q is not valid: use 1 to 64 letters, digits, '_', '.' or '-' (not \".\" and without \"..\"): %w",
			fields.Truncate(name, 80), errdefs.ErrInvalid)
	}
	return nil
}

// secretsReady says why secrets cannot be kept, or nil when they can.
func (s *Service) secretsReady() error {
	if s.cfg.Secrets == nil {
		return fmt.Errorf("this server keeps no secrets: it was started without a secrets key: %w", errdefs.ErrPrecondition)
	}
	return nil
}

// PutSecret stores a secret of p's key, replacing the value of one with the
// same name, and reports whether it is new.
func (s *Service) PutSecret(ctx context.Context, p Principal, req apiv1.PutSecret) (apiv1.Secret, bool, error) {
	if err := checkSecretName(req.Name); err != nil {
		return apiv1.Secret{}, false, err
	}
	// The messages below say what is wrong with the value, never what it is.
	switch {
	case req.Value == "":
		return apiv1.Secret{}, false, fmt.Errorf("secret %s: value is required: %w", req.Name, errdefs.ErrInvalid)
	case len(req.Value) > MaxSecretValue:
		return apiv1.Secret{}, false, fmt.Errorf("secret %s: value is %d bytes, over the limit of %d: %w",
			req.Name, len(req.Value), MaxSecretValue, errdefs.ErrInvalid)
	case !utf8.ValidString(req.Value):
		return apiv1.Secret{}, false, fmt.Errorf("secret %s: value is not valid UTF-8: %w", req.Name, errdefs.ErrInvalid)
	}
	if err := s.secretsReady(); err != nil {
		return apiv1.Secret{}, false, err
	}
	sealed, err := s.cfg.Secrets.Seal(p.KeyID, req.Name, []byte(req.Value))
	if err != nil {
		return apiv1.Secret{}, false, fmt.Errorf("seal secret %s: %w", req.Name, err)
	}
	now := s.now()
	created, err := s.st.PutSecret(ctx, store.Secret{Owner: p.KeyID, Name: req.Name, Sealed: sealed, CreatedAt: now, UpdatedAt: now})
	if err != nil {
		return apiv1.Secret{}, false, err
	}
	sec, err := s.st.GetSecret(ctx, p.KeyID, req.Name)
	if err != nil {
		return apiv1.Secret{}, false, err
	}
	return secretOf(sec), created, nil
}

func secretOf(sec store.Secret) apiv1.Secret {
	return apiv1.Secret{Name: sec.Name, CreatedAt: sec.CreatedAt, UpdatedAt: sec.UpdatedAt}
}

// ListSecrets lists the names of p's key's secrets in name order, a page
// at a time.
func (s *Service) ListSecrets(ctx context.Context, p Principal, limit int, pageToken string) (apiv1.List[apiv1.Secret], error) {
	if err := s.secretsReady(); err != nil {
		return apiv1.List[apiv1.Secret]{}, err
	}
	rows, err := s.st.ListSecrets(ctx, p.KeyID)
	if err != nil {
		return apiv1.List[apiv1.Secret]{}, err
	}
	all := make([]apiv1.Secret, 0, len(rows))
	for _, sec := range rows {
		all = append(all, secretOf(sec))
	}
	// Names sort, so a page starts after the token's name even if that
	// secret was deleted meanwhile.
	if pageToken != "" {
		after, err := secretPageName(pageToken)
		if err != nil {
			return apiv1.List[apiv1.Secret]{}, err
		}
		all = all[sort.Search(len(all), func(i int) bool { return all[i].Name > after }):]
	}
	items, next, err := fields.Page(all, func(sec apiv1.Secret) string { return sec.Name }, limit, "")
	return apiv1.List[apiv1.Secret]{Items: items, NextPageToken: next}, err
}

// secretPageName is the name a page token of ListSecrets ends at.
func secretPageName(tok string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	name, ok := strings.CutPrefix(string(b), "after:")
	if err != nil || !ok || checkSecretName(name) != nil {
		return "", fmt.Errorf("page_token is not one this server gave: start again without it: %w", errdefs.ErrInvalid)
	}
	return name, nil
}

// DeleteSecret removes a secret of p's key. Sandboxes whose credentials
// name it keep running; their gateway no longer finds a value.
func (s *Service) DeleteSecret(ctx context.Context, p Principal, name string) error {
	if err := checkSecretName(name); err != nil {
		return err
	}
	if err := s.secretsReady(); err != nil {
		return err
	}
	err := s.st.DeleteSecret(ctx, p.KeyID, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("secret %s is not stored for this key: `GET /v1/secrets` lists them: %w", name, errdefs.ErrNotFound)
	}
	return err
}

// SecretValue returns the value of owner's secret name, for the gateway
// to put in a request. The caller must not log it.
func (s *Service) SecretValue(ctx context.Context, owner, name string) (string, error) {
	if err := s.secretsReady(); err != nil {
		return "", err
	}
	sec, err := s.st.GetSecret(ctx, owner, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("secret %s is not stored: create it with POST /v1/secrets: %w", fields.Truncate(name, 80), errdefs.ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	v, err := s.cfg.Secrets.Open(owner, name, sec.Sealed)
	if err != nil {
		return "", err
	}
	return string(v), nil
}

// CheckSecrets checks that owner has stored every secret in names, as a
// network policy's credentials need; the error names the first missing one.
func (s *Service) CheckSecrets(ctx context.Context, owner string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	if err := s.secretsReady(); err != nil {
		return fmt.Errorf("network.credentials: %w", err)
	}
	rows, err := s.st.ListSecrets(ctx, owner)
	if err != nil {
		return err
	}
	have := make(map[string]bool, len(rows))
	for _, sec := range rows {
		have[sec.Name] = true
	}
	for _, name := range names {
		if !have[name] {
			return fmt.Errorf("network.credentials: secret %q is not stored for this key: create it first with POST /v1/secrets or airlock secret set: %w",
				fields.Truncate(name, 80), errdefs.ErrInvalid)
		}
	}
	return nil
}
