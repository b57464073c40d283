package service

import (
	"fmt"
	"io"

	"github.com/airlockhq/airlock/internal/diskspace"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// checkFreeDisk refuses an operation that writes large files under dir (a
// sandbox's disk and saved memory, a template image) when the filesystem
// holding dir has less than Config.MinFreeDiskBytes free for unprivileged
// use. It runs before the operation records anything, so a filling disk
// fails requests up front instead of leaving half-written images and
// snapshots behind.
func (s *Service) checkFreeDisk(dir string) error {
	return s.checkFreeDiskFor(dir, 0)
}

// checkFreeDiskFor is checkFreeDisk for an operation that writes about
// need bytes: they must fit and leave Config.MinFreeDiskBytes free.
func (s *Service) checkFreeDiskFor(dir string, need int64) error {
	keep := s.cfg.MinFreeDiskBytes
	if keep <= 0 {
		return nil
	}
	free, err := diskspace.Free(dir)
	if err != nil {
		return fmt.Errorf("measure the free disk space: %w", err)
	}
	if free-need < keep {
		what := ""
		if need > 0 {
			what = fmt.Sprintf(" once the %s it writes are taken", diskspace.Size(need))
		}
		return fmt.Errorf("the host's data directory has %s free%s, less than the %s `airlock serve --min-free-disk` asks for: "+
			"free some space (or lower --min-free-disk) and retry: %w", diskspace.Size(free-need), what, diskspace.Size(keep), errdefs.ErrExhausted)
	}
	return nil
}

// spaceGuard reads r and stops with ErrExhausted as soon as the
// filesystem of dir would have less than Config.MinFreeDiskBytes free: an
// upload is cut off as it passes the free space, not after. The space is
// measured again every guardEvery bytes.
type spaceGuard struct {
	r     io.Reader
	s     *Service
	dir   string
	since int64 // bytes since the last measure
	err   error
}

const guardEvery = 8 << 20

func (g *spaceGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.since == 0 || g.since >= guardEvery {
		if err := g.s.checkFreeDiskFor(g.dir, guardEvery); err != nil {
			g.err = err
			return 0, err
		}
		g.since = 0
	}
	n, err := g.r.Read(p[:min(len(p), guardEvery)])
	g.since += int64(n)
	if g.since == 0 {
		g.since = 1 // measured once already
	}
	return n, err
}

// maxFlattenBytes bounds the unpacked size of an image pulled or uploaded
// as a template base.
const maxFlattenBytes = 64 << 30

// flattenLimit bounds what an image may unpack to in dir: maxFlattenBytes,
// or less when the disk has less room. The tree and then the filesystem
// image made of it take about twice what the layers unpack to, and
// --min-free-disk must stay free; room says the disk set the bound. A
// layer that inflates past it (a gzip bomb) is stopped as it passes.
func (s *Service) flattenLimit(dir string) (limit int64, room bool, err error) {
	limit = maxFlattenBytes
	keep := s.cfg.MinFreeDiskBytes
	if keep <= 0 {
		return limit, false, nil
	}
	free, err := diskspace.Free(dir)
	if err != nil {
		return 0, false, fmt.Errorf("measure the free disk space: %w", err)
	}
	fits := (free - keep) / 2
	if fits >= limit {
		return limit, false, nil
	}
	if fits <= 0 {
		return 0, true, s.checkFreeDiskFor(dir, 1<<20)
	}
	return fits, true, nil
}
