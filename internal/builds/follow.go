package builds

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// buildLogPath is where the log of build id is kept.
func (b *Service) buildLogPath(id string) string {
	return filepath.Join(b.cfg.Dir.Root, "builds", id+".log")
}

// FollowBuildLog calls line for every line of the log of the build that
// made (or is making) the template ref names, from the first, following a
// build in progress until it ends, and with nil after each idle period
// without a line (a keepalive); then it returns how the build ended. It
// returns early with ctx's error when ctx ends, or with line's.
func (b *Service) FollowBuildLog(ctx context.Context, ref string, idle time.Duration, line func(*apiv1.BuildLogLine) error) (apiv1.BuildEnd, error) {
	bld, err := b.buildOf(ctx, ref)
	if err != nil {
		return apiv1.BuildEnd{}, err
	}
	run := b.builds.Get(bld.ID)
	f, err := os.Open(b.buildLogPath(bld.ID))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && run == nil {
			return BuildEnd(bld), nil // its log is gone: the end is all there is
		}
		return apiv1.BuildEnd{}, fmt.Errorf("open the build log of %s: %w", bld.ID, err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	var partial []byte
	lastLine := time.Now()
	for {
		var changed <-chan struct{}
		open := false
		if run != nil {
			changed, open = run.Log.Wait()
		}
		for {
			chunk, err := r.ReadBytes('\n')
			partial = append(partial, chunk...)
			if err != nil {
				break // EOF: what is there is read
			}
			var ln apiv1.BuildLogLine
			if json.Unmarshal(partial, &ln) == nil {
				if err := line(&ln); err != nil {
					return apiv1.BuildEnd{}, err
				}
				lastLine = time.Now()
			}
			partial = partial[:0]
		}
		if !open {
			break
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return apiv1.BuildEnd{}, ctx.Err()
		}
		if idle > 0 && time.Since(lastLine) >= idle {
			if err := line(nil); err != nil {
				return apiv1.BuildEnd{}, err
			}
			lastLine = time.Now()
		}
	}
	if run != nil {
		<-run.Done // the log is closed just before the build's end is stored
	}
	if bld, err = b.st.GetBuild(ctx, bld.ID); err != nil {
		return apiv1.BuildEnd{}, err
	}
	return BuildEnd(bld), nil
}

// ContextLimit is the largest build context p may upload: the server's
// bound, or the key's build_context_mib when lower. keyMiB is then that
// limit (else -1), for the refusal of an upload that passes it.
func (b *Service) ContextLimit(ctx context.Context, p Principal) (limit, keyMiB int64, err error) {
	l, err := b.sandboxes.KeyLimits(ctx, p.KeyID)
	if err != nil {
		return 0, 0, err
	}
	if l.BuildContextMiB != nil && *l.BuildContextMiB<<20 < b.cfg.MaxContextBytes {
		return *l.BuildContextMiB << 20, *l.BuildContextMiB, nil
	}
	return b.cfg.MaxContextBytes, -1, nil
}
