package service

// What E2B's envd layer (internal/e2b/envd) needs beyond the native API
// of sandboxes: a sandbox's default environment, stats that keep a
// symlink's target and a file's metadata, and writes that set metadata.
// What it needs of commands is sessions.Commands'.

import (
	"context"
	"fmt"
	"io"
	"maps"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// SandboxEnv returns the default environment of a sandbox's commands, as
// it was given at create.
func (s *Service) SandboxEnv(ctx context.Context, p Principal, id string) (map[string]string, error) {
	sb, err := s.getOwned(ctx, p, id)
	if err != nil {
		return nil, err
	}
	env := maps.Clone(sb.Env)
	if env == nil {
		env = map[string]string{}
	}
	return env, nil
}

// Entry describes a path in a sandbox without following a final symlink;
// Target is a symlink's destination as the link reads, "" for the rest.
// Metadata is the file metadata on the entry (agentproto.MetadataXattrPrefix),
// nil when it has none.
type Entry struct {
	apiv1.Stat
	Target   string
	Metadata map[string]string
}

// entryView is the guest's stat as an Entry. The metadata, which anything
// in the guest may have set, is bounded here again.
func entryView(st agentproto.Stat) Entry {
	return Entry{Stat: statView(st), Target: st.Target, Metadata: agentproto.BoundMetadata(st.Metadata)}
}

// WriteEntry streams r into path, creating parent directories, and gives
// the new file the metadata md (agentproto.CheckMetadata says which is
// accepted; nil is none). Bad metadata is refused before anything is
// written. It returns the file's entry as written, with its metadata.
func (s *Service) WriteEntry(ctx context.Context, p Principal, sbx, path string, mode uint32, md map[string]string, r io.Reader) (Entry, error) {
	if err := agentproto.CheckMetadata(md); err != nil {
		return Entry{}, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	st, err := s.writeFile(ctx, p, sbx, path, mode, md, r)
	if err != nil {
		return Entry{}, err
	}
	return entryView(st), nil
}

// StatEntry describes path, keeping a symlink's target.
func (s *Service) StatEntry(ctx context.Context, p Principal, sbx, path string) (Entry, error) {
	agent, release, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return Entry{}, err
	}
	defer release()
	st, err := agent.Stat(ctx, path)
	if err != nil {
		return Entry{}, err
	}
	return entryView(st), nil
}

// ListEntries describes the entries under dir, depth levels deep (1 to
// MaxListDepth), keeping symlinks' targets.
func (s *Service) ListEntries(ctx context.Context, p Principal, sbx, dir string, depth int) ([]Entry, error) {
	if depth < 1 || depth > MaxListDepth {
		return nil, fmt.Errorf("depth %d is out of bounds: use 1 to %d: %w", depth, MaxListDepth, errdefs.ErrInvalid)
	}
	agent, release, err := s.filesOf(ctx, p, sbx, dir)
	if err != nil {
		return nil, err
	}
	defer release()
	sts, err := agent.List(ctx, dir, depth)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(sts))
	for _, st := range sts {
		out = append(out, entryView(st))
	}
	return out, nil
}
