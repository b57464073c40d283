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

// page cuts a page out of a whole list held in memory, after the item
// whose key is the token's.
func page[T any](items []T, key func(T) string, limit int, token string) ([]T, string, error) {
	n, err := checkLimit(limit)
	if err != nil {
		return nil, "", err
	}
	start := 0
	if token != "" {
		b, err := base64.RawURLEncoding.DecodeString(token)
		after, ok := strings.CutPrefix(string(b), "after:")
		if err != nil || !ok {
			return nil, "", fmt.Errorf("page_token is not one this server gave: start again without it: %w", errdefs.ErrInvalid)
		}
		start = len(items)
		for i, it := range items {
			if key(it) == after {
				start = i + 1
				break
			}
		}
	}
	items = items[start:]
	if len(items) <= n {
		return items, "", nil
	}
	return items[:n], base64.RawURLEncoding.EncodeToString([]byte("after:" + key(items[n-1]))), nil
}
