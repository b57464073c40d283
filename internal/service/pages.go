package service

import "github.com/airlockhq/airlock/internal/fields"

// Page sizes of list calls.
const (
	DefaultLimit = fields.DefaultLimit
	MaxLimit     = fields.MaxLimit
)

func checkLimit(n int) (int, error) { return fields.Limit(n) }

func encodePageToken(lastID string) string { return fields.PageToken(lastID) }

func decodePageToken(tok, prefix string) (string, error) { return fields.After(tok, prefix) }

// page cuts a page out of a whole list held in memory (fields.Page).
func page[T any](items []T, key func(T) string, limit int, token string) ([]T, string, error) {
	return fields.Page(items, key, limit, token)
}
