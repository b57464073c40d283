package service

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/atomicfile"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
	"github.com/airlockhq/airlock/internal/ids"
	"github.com/airlockhq/airlock/internal/store"
)

// An API key of the airlock format reads "alk_<key ID without its
// prefix>_<secret>"; only the secret's sha256 is stored.
const keyPrefix = "alk_"

func formatKey(id, secret string) string {
	return keyPrefix + strings.TrimPrefix(id, "key") + "_" + secret
}

// An API key of the e2b format reads "e2b_" and e2bKeyBytes random bytes in
// lowercase hex, as E2B's SDKs expect (they refuse keys not matching
// ^e2b_[0-9a-f]+$). It does not name its key ID: the key is found by its
// hash, the sha256 of the whole key. Each format checks that the key it
// found is of that format, so a key works only as it was made.
const (
	e2bKeyPrefix = "e2b_"
	e2bKeyBytes  = 20
)

var e2bKeyPattern = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

func newE2BKey() string {
	b := make([]byte, e2bKeyBytes)
	rand.Read(b) // crypto/rand.Read never fails: it crashes the program instead
	return e2bKeyPrefix + hex.EncodeToString(b)
}

// Authenticate returns the principal of an API key of either format.
func (s *Service) Authenticate(ctx context.Context, token string) (Principal, error) {
	bad := fmt.Errorf("the API key is not valid: send \"Authorization: Bearer <key>\" with a key from POST /v1/keys or the admin key file: %w", errdefs.ErrUnauthenticated)
	if strings.HasPrefix(token, e2bKeyPrefix) {
		return s.authenticateE2B(ctx, token, bad)
	}
	rest, ok := strings.CutPrefix(token, keyPrefix)
	idPart, secret, ok2 := strings.Cut(rest, "_")
	if !ok || !ok2 || !fields.ValidID("key"+idPart) {
		return Principal{}, bad
	}
	k, err := s.st.GetKey(ctx, "key"+idPart)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Principal{}, bad
	}
	if err != nil {
		return Principal{}, err
	}
	if subtle.ConstantTimeCompare(ids.SecretHash(secret), k.Hash) != 1 || k.Format != apiv1.KeyFormatAirlock {
		return Principal{}, bad
	}
	return Principal{KeyID: k.ID, Role: k.Role}, nil
}

// authenticateE2B looks a key of the e2b format up by its hash; bad is the
// answer to a key that is not one.
func (s *Service) authenticateE2B(ctx context.Context, token string, bad error) (Principal, error) {
	if !e2bKeyPattern.MatchString(token) {
		return Principal{}, bad
	}
	hash := ids.SecretHash(token)
	k, err := s.st.GetKeyByHash(ctx, hash)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Principal{}, bad
	}
	if err != nil {
		return Principal{}, err
	}
	if subtle.ConstantTimeCompare(hash, k.Hash) != 1 || k.Format != apiv1.KeyFormatE2B {
		return Principal{}, bad
	}
	return Principal{KeyID: k.ID, Role: k.Role}, nil
}

// CreateKey makes an API key; only an admin may. The key is returned once.
func (s *Service) CreateKey(ctx context.Context, p Principal, req apiv1.CreateKey) (apiv1.KeyCreated, error) {
	if !p.Admin() {
		return apiv1.KeyCreated{}, fmt.Errorf("only an admin key may create keys: %w", errdefs.ErrPermission)
	}
	if req.Name == "" || len(req.Name) > 128 || strings.ContainsAny(req.Name, "\x00\n\r") {
		return apiv1.KeyCreated{}, fmt.Errorf("name is required: one line of at most 128 bytes: %w", errdefs.ErrInvalid)
	}
	if req.Role == "" {
		req.Role = apiv1.RoleUser
	}
	if req.Role != apiv1.RoleUser && req.Role != apiv1.RoleAdmin {
		return apiv1.KeyCreated{}, fmt.Errorf("role %q is not \"admin\" or \"user\": %w", fields.Truncate(req.Role, 20), errdefs.ErrInvalid)
	}
	if req.Format == "" {
		req.Format = apiv1.KeyFormatAirlock
	}
	if req.Format != apiv1.KeyFormatAirlock && req.Format != apiv1.KeyFormatE2B {
		return apiv1.KeyCreated{}, fmt.Errorf("format %q is not \"airlock\" or \"e2b\": %w", fields.Truncate(req.Format, 20), errdefs.ErrInvalid)
	}
	if err := checkLimits("limits", req.Limits); err != nil {
		return apiv1.KeyCreated{}, err
	}
	return s.newKey(ctx, req.Name, req.Role, req.Format, req.Limits)
}

func (s *Service) newKey(ctx context.Context, name, role, format string, limits *apiv1.Limits) (apiv1.KeyCreated, error) {
	id := ids.New("key")
	var key string
	var hash []byte
	switch format {
	case apiv1.KeyFormatE2B:
		key = newE2BKey()
		hash = ids.SecretHash(key)
	default:
		secret := ids.Secret()
		key, hash = formatKey(id, secret), ids.SecretHash(secret)
	}
	k := store.Key{ID: id, Name: name, Role: role, Hash: hash, Format: format, CreatedAt: s.now()}
	if limits != nil {
		k.Limits, _ = json.Marshal(limits)
	}
	eff, err := s.keyLimits(k)
	if err != nil {
		return apiv1.KeyCreated{}, err
	}
	if err := s.st.InsertKey(ctx, k); err != nil {
		return apiv1.KeyCreated{}, fmt.Errorf("record key: %w", err)
	}
	return apiv1.KeyCreated{ID: id, Name: name, Role: role, Format: format, Key: key, Limits: eff, CreatedAt: k.CreatedAt}, nil
}

// GetKey returns a key with the limits in force and its usage. id "self"
// is the calling key; a user key sees only itself (another answers 404).
func (s *Service) GetKey(ctx context.Context, p Principal, id string) (apiv1.Key, error) {
	if id == "self" {
		id = p.KeyID
	}
	if err := fields.ID("key", "key", id); err != nil {
		return apiv1.Key{}, err
	}
	if !p.Owns(id) {
		return apiv1.Key{}, fmt.Errorf("key %q not found: %w", id, errdefs.ErrNotFound)
	}
	k, err := s.st.GetKey(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return apiv1.Key{}, fmt.Errorf("key %q not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return apiv1.Key{}, err
	}
	v, err := s.keyView(k)
	if err != nil {
		return apiv1.Key{}, err
	}
	u, err := s.st.KeyUsage(ctx, id)
	if err != nil {
		return apiv1.Key{}, err
	}
	v.Usage = usageView(u)
	return v, nil
}

// SetKeyLimits replaces a key's own limits; only an admin may. Fields left
// out take the server's defaults (for a user key) again. What the key
// holds already is kept: the limits apply to what it asks for next.
func (s *Service) SetKeyLimits(ctx context.Context, p Principal, id string, req apiv1.SetLimits) (apiv1.Key, error) {
	if !p.Admin() {
		return apiv1.Key{}, fmt.Errorf("only an admin key may change limits: %w", errdefs.ErrPermission)
	}
	if err := fields.ID("key", "key", id); err != nil {
		return apiv1.Key{}, err
	}
	if req.Limits == nil {
		return apiv1.Key{}, fmt.Errorf("limits is required, for example {\"limits\": {\"sandboxes\": 5}}; {} takes the defaults: %w", errdefs.ErrInvalid)
	}
	if err := checkLimits("limits", req.Limits); err != nil {
		return apiv1.Key{}, err
	}
	b, _ := json.Marshal(req.Limits)
	if err := s.st.SetKeyLimits(ctx, id, b); errors.Is(err, errdefs.ErrNotFound) {
		return apiv1.Key{}, fmt.Errorf("key %q not found: %w", id, errdefs.ErrNotFound)
	} else if err != nil {
		return apiv1.Key{}, err
	}
	return s.GetKey(ctx, p, id)
}

// keyView is k as the API shows it, with the limits in force.
func (s *Service) keyView(k store.Key) (apiv1.Key, error) {
	l, err := s.keyLimits(k)
	if err != nil {
		return apiv1.Key{}, err
	}
	return apiv1.Key{ID: k.ID, Name: k.Name, Role: k.Role, Format: k.Format, Limits: l, CreatedAt: k.CreatedAt}, nil
}

// ListKeys lists the keys, a page at a time; a user key sees only itself.
func (s *Service) ListKeys(ctx context.Context, p Principal, limit int, pageToken string) (apiv1.List[apiv1.Key], error) {
	keys, err := s.st.ListKeys(ctx)
	if err != nil {
		return apiv1.List[apiv1.Key]{}, err
	}
	all := []apiv1.Key{}
	for _, k := range keys {
		if p.Owns(k.ID) {
			v, err := s.keyView(k)
			if err != nil {
				return apiv1.List[apiv1.Key]{}, err
			}
			all = append(all, v)
		}
	}
	items, next, err := fields.Page(all, func(k apiv1.Key) string { return k.ID }, limit, pageToken)
	return apiv1.List[apiv1.Key]{Items: items, NextPageToken: next}, err
}

// DeleteKey revokes a key. Only an admin may, and not the last admin key.
func (s *Service) DeleteKey(ctx context.Context, p Principal, id string) error {
	if !p.Admin() {
		return fmt.Errorf("only an admin key may delete keys: %w", errdefs.ErrPermission)
	}
	if err := fields.ID("key", "key", id); err != nil {
		return err
	}
	k, err := s.st.GetKey(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("key %q not found: %w", id, errdefs.ErrNotFound) // as fields.ID says
	}
	if err != nil {
		return err
	}
	if k.Role == apiv1.RoleAdmin {
		n, err := s.st.CountKeys(ctx, apiv1.RoleAdmin)
		if err != nil {
			return err
		}
		if n <= 1 {
			return fmt.Errorf("key %s is the last admin key: create another admin key first: %w", id, errdefs.ErrConflict)
		}
	}
	return s.st.DeleteKey(ctx, id)
}

// EnsureAdminKey creates the first admin key when there is none, writes it
// 0600 to path and returns it; with an admin key already there it returns "".
func (s *Service) EnsureAdminKey(ctx context.Context, path string) (string, error) {
	n, err := s.st.CountKeys(ctx, apiv1.RoleAdmin)
	if err != nil {
		return "", err
	}
	if n > 0 {
		return "", nil
	}
	k, err := s.newKey(ctx, "admin", apiv1.RoleAdmin, apiv1.KeyFormatAirlock, nil)
	if err != nil {
		return "", err
	}
	if err := atomicfile.WriteBytes(path, []byte(k.Key+"\n"), 0o600); err != nil {
		err = fmt.Errorf("write admin key: %w", err)
		if derr := s.st.DeleteKey(ctx, k.ID); derr != nil {
			err = errors.Join(err, fmt.Errorf("delete the admin key not written: %w", derr))
		}
		return "", err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return "", err
	}
	return k.Key, nil
}
