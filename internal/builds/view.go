package builds

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

// TemplateView is a template as the API shows it.
func TemplateView(t template.Template) apiv1.Template {
	v := apiv1.Template{Name: t.Name, Tag: t.Tag, Digest: t.Digest, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB,
		DiskMiB: t.DiskMiB, SizeBytes: t.SizeBytes, CreatedAt: t.CreatedAt.UTC(), Status: apiv1.TemplateReady,
		StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd}
	if t.Source != nil {
		v.Source = &apiv1.TemplateSource{From: t.Source.From, Steps: t.Source.Steps}
	}
	if t.Config != nil {
		v.Env, v.WorkingDir, v.User = t.Config.Env, t.Config.WorkingDir, t.Config.User
	}
	return v
}

// BuildView is a template as its build in progress, or its failed build,
// shows it.
func BuildView(b store.Build, from string, steps int) apiv1.Template {
	v := apiv1.Template{Name: b.Name, Tag: b.Tag, Digest: b.Digest, CreatedAt: b.CreatedAt.UTC(), Status: b.Status, BuildID: b.ID}
	if from != "" {
		v.Source = &apiv1.TemplateSource{From: from, Steps: steps}
	}
	if b.Error != nil {
		v.Error = &apiv1.Status{Code: b.Error.Code, Message: b.Error.Message}
	}
	return v
}

// SortTemplates sorts templates by name:tag.
func SortTemplates(ts []apiv1.Template) {
	slices.SortFunc(ts, func(a, b apiv1.Template) int { return strings.Compare(a.Name+":"+a.Tag, b.Name+":"+b.Tag) })
}

// opView is the API's view of an operation row, as the sandbox side's.
func opView(op store.Operation) apiv1.Operation {
	v := apiv1.Operation{ID: op.ID, Kind: op.Kind, TargetID: op.TargetID, Status: op.Status,
		CreatedAt: op.CreatedAt, FinishedAt: op.FinishedAt, Timings: op.Timings}
	if op.Error != nil {
		v.Error = &apiv1.Status{Code: op.Error.Code, Message: op.Error.Message}
	}
	return v
}

// errorStatus is how err is recorded on a build and its operation.
func errorStatus(err error) store.Error {
	return store.Error{Code: errdefs.ClassOf(err).Code, Message: err.Error()}
}

// Page sizes of ListTemplates, as of the sandbox side's lists.
const (
	defaultLimit = 100
	maxLimit     = 1000
)

// page cuts a page out of a whole list held in memory, after the item
// whose key is the token's.
func page[T any](items []T, key func(T) string, limit int, token string) ([]T, string, error) {
	n := limit
	switch {
	case n == 0:
		n = defaultLimit
	case n < 0 || n > maxLimit:
		return nil, "", fmt.Errorf("limit %d is out of bounds: use 1 to %d: %w", n, maxLimit, errdefs.ErrInvalid)
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
