package service

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/fields"
)

// Files are reached through the sandbox's agent; paths are absolute inside
// the sandbox and checked here before anything is sent.

func checkPath(what, p string) error {
	if err := agentproto.CheckPath(p); err != nil {
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrInvalid)
	}
	return nil
}

// ParseMode reads an octal permission such as "0644"; "" is 0644.
func ParseMode(s string) (uint32, error) {
	if s == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("mode %q is not an octal permission such as 0644: %w", fields.Truncate(s, 20), errdefs.ErrInvalid)
	}
	return uint32(m), nil
}

// filesOf checks path and returns the agent of the running sandbox sbx,
// which it wakes if it must (use); the call uses the sandbox until
// release.
func (s *Service) filesOf(ctx context.Context, p Principal, sbx, path string) (agent *agentclient.Client, release func(), err error) {
	if err := checkPath("path", path); err != nil {
		// An unknown sandbox still answers 404 first.
		if _, gerr := s.getOwned(ctx, p, sbx); gerr != nil {
			return nil, nil, gerr
		}
		return nil, nil, err
	}
	if _, err := s.getOwned(ctx, p, sbx); err != nil {
		return nil, nil, err
	}
	held, err := s.use(ctx, sbx)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			held()
		}
	}()
	lv, _, err := s.runningSandbox(ctx, p, sbx)
	if err != nil {
		return nil, nil, err
	}
	box, _, err := lv.vm()
	if err != nil {
		return nil, nil, err
	}
	agent = box.Agent()
	if agent == nil {
		return nil, nil, fmt.Errorf("sandbox %s is not running: %w", sbx, errdefs.ErrConflict)
	}
	return agent, held, nil
}

// WriteFile streams r into path, creating parent directories.
func (s *Service) WriteFile(ctx context.Context, p Principal, sbx, path string, mode uint32, r io.Reader) error {
	_, err := s.writeFile(ctx, p, sbx, path, mode, nil, r)
	return err
}

// writeFile streams r into path with the file metadata md, which the
// caller checked.
func (s *Service) writeFile(ctx context.Context, p Principal, sbx, path string, mode uint32, md map[string]string, r io.Reader) (agentproto.Stat, error) {
	agent, release, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return agentproto.Stat{}, err
	}
	defer release()
	cr := &countReader{r: &spaceGuard{r: r, s: s, dir: s.sandboxDir(sbx)}}
	st, err := agent.WriteFileMetadata(ctx, path, mode, md, cr)
	s.m.streamed(int(cr.n))
	return st, err
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// OpenFile checks that path is a regular file and returns its stat and a
// function that streams it to w: the caller can answer an error before it
// writes anything.
func (s *Service) OpenFile(ctx context.Context, p Principal, sbx, path string) (apiv1.Stat, func(w io.Writer) error, error) {
	agent, release, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return apiv1.Stat{}, nil, err
	}
	defer release()
	// The stat comes from the read itself, so a response's length is
	// the length of what follows even when the file is being rewritten.
	st, copyTo, err := agent.OpenRead(ctx, path)
	if agentclient.HasCode(err, agentproto.CodeIsDir) {
		return apiv1.Stat{}, nil, fmt.Errorf("%s is a directory: use fs/list, or archive to download it: %w", path, errdefs.ErrInvalid)
	}
	if err != nil {
		return apiv1.Stat{}, nil, err
	}
	return statView(st), func(w io.Writer) error {
		defer s.idle.Hold(sbx)() // the transfer uses the sandbox
		err := copyTo(w)
		s.m.streamed(int(st.SizeBytes))
		return err
	}, nil
}

func statView(st agentproto.Stat) apiv1.Stat {
	return apiv1.Stat{Path: st.Path, Type: st.Type, SizeBytes: st.SizeBytes, Mode: st.Mode, ModifiedAt: st.ModifiedAt.UTC()}
}

// Stat describes path.
func (s *Service) Stat(ctx context.Context, p Principal, sbx, path string) (apiv1.Stat, error) {
	agent, release, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return apiv1.Stat{}, err
	}
	defer release()
	st, err := agent.Stat(ctx, path)
	return statView(st), err
}

// MaxListDepth bounds fs/list's depth.
const MaxListDepth = 16

// List describes the entries under dir, depth levels deep.
func (s *Service) List(ctx context.Context, p Principal, sbx, dir string, depth int) ([]apiv1.Stat, error) {
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
	out := make([]apiv1.Stat, 0, len(sts))
	for _, st := range sts {
		out = append(out, statView(st))
	}
	return out, nil
}

// Mkdir creates dir and its parents.
func (s *Service) Mkdir(ctx context.Context, p Principal, sbx, dir string) error {
	agent, release, err := s.filesOf(ctx, p, sbx, dir)
	if err != nil {
		return err
	}
	defer release()
	return agent.Mkdir(ctx, dir)
}

// Move renames from to to.
func (s *Service) Move(ctx context.Context, p Principal, sbx, from, to string) error {
	if err := checkPath("to", to); err != nil {
		return err
	}
	agent, release, err := s.filesOf(ctx, p, sbx, from)
	if err != nil {
		return err
	}
	defer release()
	return agent.Move(ctx, from, to)
}

// Remove deletes path; a non-empty directory only when recursive.
func (s *Service) Remove(ctx context.Context, p Principal, sbx, path string, recursive bool) error {
	if path == "/" {
		return fmt.Errorf("refusing to remove / : %w", errdefs.ErrInvalid)
	}
	agent, release, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return err
	}
	defer release()
	return agent.Remove(ctx, path, recursive)
}

// OpenArchive checks that path exists and returns a function that streams
// it as a tar archive.
func (s *Service) OpenArchive(ctx context.Context, p Principal, sbx, path string) (func(w io.Writer) error, error) {
	agent, release, err := s.filesOf(ctx, p, sbx, path)
	if err != nil {
		return nil, err
	}
	defer release()
	if _, err := agent.Stat(ctx, path); err != nil {
		return nil, err
	}
	return func(w io.Writer) error {
		defer s.idle.Hold(sbx)() // the transfer uses the sandbox
		cw := &countWriter{w: w}
		err := agent.TarOut(ctx, path, cw)
		s.m.streamed(int(cw.n))
		return err
	}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ExtractArchive extracts the tar stream r into dir.
func (s *Service) ExtractArchive(ctx context.Context, p Principal, sbx, dir string, r io.Reader) error {
	agent, release, err := s.filesOf(ctx, p, sbx, dir)
	if err != nil {
		return err
	}
	defer release()
	cr := &countReader{r: &spaceGuard{r: r, s: s, dir: s.sandboxDir(sbx)}}
	err = agent.TarIn(ctx, dir, cr)
	s.m.streamed(int(cr.n))
	return err
}
