package cli

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func runBench(ctx context.Context, env *Env, args []string) error {
	return fmt.Errorf("bench: not built yet: %w", errdefs.ErrUnavailable)
}
