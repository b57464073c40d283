package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
)

// SandboxOwner returns the principal of the key that created sandbox id,
// for traffic that reaches a sandbox without an API key: E2B's SDKs talk
// to a sandbox's envd and ports with the sandbox's own access token, not
// the key. The principal sees what its key sees, so every call made with
// it keeps the owner's tenancy. A deleted sandbox is not found, like an
// unknown one.
func (s *Service) SandboxOwner(ctx context.Context, id string) (Principal, error) {
	if err := fields.ID("sandbox", "sbx", id); err != nil {
		return Principal{}, err
	}
	sb, err := s.st.GetSandbox(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && sb.State == apiv1.StateDeleted {
		return Principal{}, fmt.Errorf("sandbox %s not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Principal{}, err
	}
	return Principal{KeyID: sb.Owner, Role: apiv1.RoleUser}, nil
}
