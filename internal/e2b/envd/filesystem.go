package envd

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
)

// Bounds on following symlinks: hops for one link, and links followed in
// one listing (past it, a link is described as a symlink).
const (
	maxLinkHops    = 8
	maxLinkFollows = 256
)

// resolver describes entries for one request, following symlinks to
// their targets as envd does (a link to a file is a FILE entry), within a
// budget of agent calls.
type resolver struct {
	s      *Server
	ctx    context.Context
	req    Request
	budget int
}

func (s *Server) resolver(ctx context.Context, req Request) *resolver {
	return &resolver{s: s, ctx: ctx, req: req, budget: maxLinkFollows}
}

// follow returns the final target of the symlink e and what is there; ok
// is false for a dangling or too long chain, or past the budget.
func (rs *resolver) follow(e service.Entry) (string, service.Entry, bool) {
	cur := e
	for hop := 0; hop < maxLinkHops && cur.Type == "symlink"; hop++ {
		if rs.budget <= 0 {
			return "", cur, false
		}
		rs.budget--
		target := cur.Target
		if !strings.HasPrefix(target, "/") {
			target = path.Join(path.Dir(cur.Path), target)
		}
		next, err := rs.s.svc.StatEntry(rs.ctx, rs.req.Principal, rs.req.SandboxID, path.Clean(target))
		if err != nil {
			return "", cur, false
		}
		cur = next
	}
	if cur.Type == "symlink" {
		return "", cur, false
	}
	return cur.Path, cur, true
}

// entry turns a service entry into an EntryInfo.
func (rs *resolver) entry(e service.Entry) entryInfo {
	perm := parseMode(e.Mode)
	info := entryInfo{
		Name:         path.Base(e.Path),
		Path:         e.Path,
		Mode:         uint32(perm.Perm()),
		Permissions:  (typeBits(e.Type) | perm).String(),
		Owner:        "root",
		Group:        "root",
		ModifiedTime: timestamp(e.ModifiedAt),
		Metadata:     e.Metadata,
	}
	if e.SizeBytes != 0 {
		size := int64String(e.SizeBytes)
		info.Size = &size
	}
	info.Type = fileType(e.Type)
	if e.Type == "symlink" {
		if target, te, ok := rs.follow(e); ok {
			// What envd reads through the link: the target's.
			info.Type, info.Mode, info.SymlinkTarget = fileType(te.Type), uint32(parseMode(te.Mode).Perm()), &target
			info.Metadata = te.Metadata
		} else {
			t := e.Target
			info.SymlinkTarget = &t
		}
	}
	return info
}

func fileType(t string) string {
	switch t {
	case "file":
		return fileTypeFile
	case "dir":
		return fileTypeDirectory
	case "symlink":
		return fileTypeSymlink
	}
	return "" // FILE_TYPE_UNSPECIFIED, omitted
}

func typeBits(t string) fs.FileMode {
	switch t {
	case "file":
		return 0
	case "dir":
		return fs.ModeDir
	case "symlink":
		return fs.ModeSymlink
	}
	return fs.ModeIrregular
}

// parseMode reads the service's octal mode ("0644", "4755") into
// permission and setuid, setgid and sticky bits.
func parseMode(s string) fs.FileMode {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0
	}
	fm := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// pathField reads a path field and resolves it for the request's user.
func pathField(r *http.Request, m message, name string) (string, error) {
	p, err := m.str(name)
	if err != nil {
		return "", err
	}
	user, err := basicUser(r)
	if err != nil {
		return "", err
	}
	return resolve(p, user)
}

// stat is Filesystem.Stat.
func (s *Server) stat(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	p, err := pathField(r, m, "path")
	if err != nil {
		return nil, err
	}
	e, err := s.svc.StatEntry(ctx, req.Principal, req.SandboxID, p)
	if err != nil {
		return nil, err
	}
	info := s.resolver(ctx, req).entry(e)
	return entryResponse{Entry: &info}, nil
}

// listDir is Filesystem.ListDir: entries depth levels deep (0 is 1, more
// than the service's bound is that bound).
func (s *Server) listDir(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	p, err := pathField(r, m, "path")
	if err != nil {
		return nil, err
	}
	depth, err := m.uint32("depth")
	if err != nil {
		return nil, err
	}
	d := min(max(int(depth), 1), service.MaxListDepth)
	rs := s.resolver(ctx, req)
	dir := p
	root, err := s.svc.StatEntry(ctx, req.Principal, req.SandboxID, p)
	if err != nil {
		return nil, err
	}
	if root.Type == "symlink" {
		target, te, ok := rs.follow(root)
		if !ok {
			return nil, errorf(codeNotFound, "path not found: %s is a dangling symlink", p)
		}
		dir, root = target, te
	}
	if root.Type != "dir" {
		return nil, errorf(codeInvalidArgument, "path is not a directory: %s", p)
	}
	items, err := s.svc.ListEntries(ctx, req.Principal, req.SandboxID, dir, d)
	if err != nil {
		return nil, err
	}
	res := listDirResponse{Entries: make([]entryInfo, 0, len(items))}
	for _, it := range items {
		info := rs.entry(it)
		if dir != p { // paths under the path as asked, not the link's target
			info.Path = path.Join(p, strings.TrimPrefix(it.Path, dir))
		}
		res.Entries = append(res.Entries, info)
	}
	return res, nil
}

// makeDir is Filesystem.MakeDir: already_exists when the directory is
// there.
func (s *Server) makeDir(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	p, err := pathField(r, m, "path")
	if err != nil {
		return nil, err
	}
	e, err := s.svc.StatEntry(ctx, req.Principal, req.SandboxID, p)
	switch {
	case err == nil && e.Type == "dir":
		return nil, errorf(codeAlreadyExists, "directory already exists: %s", p)
	case err == nil:
		return nil, errorf(codeInvalidArgument, "path already exists but it is not a directory: %s", p)
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}
	if err := s.svc.Mkdir(ctx, req.Principal, req.SandboxID, p); err != nil {
		return nil, err
	}
	return s.entryAt(ctx, req, p)
}

func (s *Server) entryAt(ctx context.Context, req Request, p string) (any, error) {
	e, err := s.svc.StatEntry(ctx, req.Principal, req.SandboxID, p)
	if err != nil {
		return nil, err
	}
	info := s.resolver(ctx, req).entry(e)
	return entryResponse{Entry: &info}, nil
}

// move is Filesystem.Move.
func (s *Server) move(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	from, err := pathField(r, m, "source")
	if err != nil {
		return nil, err
	}
	to, err := pathField(r, m, "destination")
	if err != nil {
		return nil, err
	}
	if err := s.svc.Move(ctx, req.Principal, req.SandboxID, from, to); err != nil {
		return nil, err
	}
	return s.entryAt(ctx, req, to)
}

// remove is Filesystem.Remove: recursive, and a missing path is no error,
// as envd removes with os.RemoveAll.
func (s *Server) remove(ctx context.Context, req Request, r *http.Request, m message) (any, error) {
	p, err := pathField(r, m, "path")
	if err != nil {
		return nil, err
	}
	if err := s.svc.Remove(ctx, req.Principal, req.SandboxID, p, true); err != nil {
		// A missing sandbox is not found too; tell the two apart.
		if errors.Is(err, errdefs.ErrNotFound) {
			if _, serr := s.svc.StatEntry(ctx, req.Principal, req.SandboxID, "/"); serr == nil {
				return empty{}, nil
			}
		}
		return nil, err
	}
	return empty{}, nil
}
