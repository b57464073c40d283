package daemon

import (
	"context"
	"log/slog"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/usage"
)

// newUsage makes the history of what the sandboxes of svc use, which
// E2B's getMetrics answers from (Run starts its sampling).
func newUsage(svc *service.Service, log *slog.Logger) (*usage.History, error) {
	return usage.New(usage.Config{Source: usageSource{svc}, Log: log})
}

// usageSource is the service as the usage history's Source: the
// sandboxes it looks after, measured in their guests as the admin.
type usageSource struct{ svc *service.Service }

func (u usageSource) Sandboxes() map[string]bool { return u.svc.LookedAfter() }

func (u usageSource) Measure(ctx context.Context, id string) (usage.Sample, error) {
	st, err := u.svc.GuestStats(ctx, service.Principal{Role: apiv1.RoleAdmin}, id)
	if err != nil {
		return usage.Sample{}, err
	}
	return usage.Sample{CPUCount: st.CPUCount, CPUUsedPct: st.CPUUsedPct, MemUsed: st.MemUsedBytes, MemTotal: st.MemTotalBytes,
		MemCache: st.MemCacheBytes, DiskUsed: st.DiskUsedBytes, DiskTotal: st.DiskTotalBytes}, nil
}
