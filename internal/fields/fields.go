// Package fields checks the fields that requests of every kind share:
// resource IDs, list limits and page tokens, and maps of strings (labels,
// environment). Each refusal wraps an errdefs class, and an ID that cannot
// be one of ours gets the answer an unknown one gets, so that neither
// tells a caller more than the other.
package fields

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// idPattern is an ID's shape: a letter, then letters and digits, 63 bytes
// at most (a DNS label's bound; a sandbox ID names its directory).
var idPattern = regexp.MustCompile(`^[a-z][a-z0-9]{1,62}$`)

// ValidID reports whether s has the shape of an ID (internal/ids).
func ValidID(s string) bool { return idPattern.MatchString(s) }

// ID refuses an ID that cannot be one of ours, of a kind (such as
// "sandbox") whose IDs start with prefix, with the same answer as an
// unknown one: an error wrapping errdefs.ErrNotFound.
func ID(kind, prefix, id string) error {
	if !strings.HasPrefix(id, prefix) || !ValidID(id) {
		return fmt.Errorf("%s %q not found: %w", kind, Truncate(id, 80), errdefs.ErrNotFound)
	}
	return nil
}

// Truncate cuts s to n bytes, marking the cut, for an error message.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Page sizes of list calls.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Limit is the page size a list call asked for: DefaultLimit for 0,
// refused outside 1 to MaxLimit.
func Limit(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultLimit, nil
	case n < 0 || n > MaxLimit:
		return 0, fmt.Errorf("limit %d is out of bounds: use 1 to %d: %w", n, MaxLimit, errdefs.ErrInvalid)
	}
	return n, nil
}

// PageToken is the token of the page after the item lastID: the ID,
// encoded so that clients treat it as opaque.
func PageToken(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("after:" + lastID))
}

// After is the last ID of the previous page, read from a token PageToken
// made for an ID starting with prefix.
func After(tok, prefix string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	id, ok := strings.CutPrefix(string(b), "after:")
	if err != nil || !ok || !strings.HasPrefix(id, prefix) || !ValidID(id) {
		return "", fmt.Errorf("page_token is not one this server gave: start again without it: %w", errdefs.ErrInvalid)
	}
	return id, nil
}

// Page cuts a page out of a whole list held in memory, after the item
// whose key is the token's.
func Page[T any](items []T, key func(T) string, limit int, token string) ([]T, string, error) {
	n, err := Limit(limit)
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
	return items[:n], PageToken(key(items[n-1])), nil
}

// Bounds on labels and environment, to keep rows small.
const (
	maxMapEntries = 64
	maxKeyLen     = 128
	maxValueLen   = 4096
)

// Map refuses a map of strings (what names it in the error) with too many
// entries, a key keyOK refuses or too long, or a value too long or holding
// a NUL.
func Map(what string, m map[string]string, keyOK func(string) bool) error {
	if len(m) > maxMapEntries {
		return fmt.Errorf("%s has %d entries; at most %d are allowed: %w", what, len(m), maxMapEntries, errdefs.ErrInvalid)
	}
	for k, v := range m {
		if k == "" || len(k) > maxKeyLen || !keyOK(k) {
			return fmt.Errorf("%s key %q is not allowed: %w", what, Truncate(k, 40), errdefs.ErrInvalid)
		}
		if len(v) > maxValueLen || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%s value of %q is longer than %d bytes or holds a NUL: %w", what, k, maxValueLen, errdefs.ErrInvalid)
		}
	}
	return nil
}

// EnvKey reports whether k may name an environment variable.
func EnvKey(k string) bool { return !strings.ContainsAny(k, "=\x00") }
