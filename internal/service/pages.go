package service

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Page sizes of list calls.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

func checkLimit(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultLimit, nil
	case n < 0 || n > MaxLimit:
		return 0, fmt.Errorf("limit %d is out of bounds: use 1 to %d: %w", n, MaxLimit, errdefs.ErrInvalid)
	}
	return n, nil
}

// A page token is the last ID of the previous page, encoded so clients
// treat it as opaque.
func encodePageToken(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("after:" + lastID))
}

func decodePageToken(tok, prefix string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	id, ok := strings.CutPrefix(string(b), "after:")
	if err != nil || !ok || !strings.HasPrefix(id, prefix) || !idPattern.MatchString(id) {
		return "", fmt.Errorf("page_token is not one this server gave: start again without it: %w", errdefs.ErrInvalid)
	}
	return id, nil
}
