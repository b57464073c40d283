package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/airlockhq/airlock/internal/agentproto"
)

func (a *Agent) handleFile(st net.Conn, req *agentproto.Request) {
	if err := agentproto.CheckPath(req.Path); err != nil {
		if req.Op == agentproto.OpWrite || req.Op == agentproto.OpTarIn {
			io.Copy(io.Discard, newDataReader(st)) // the host sends to EOF regardless
		}
		replyErr(st, agentproto.CodeInvalid, err.Error())
		return
	}
	var err error
	switch req.Op {
	case agentproto.OpRead:
		err = readFile(st, req.Path)
	case agentproto.OpWrite:
		err = writeFile(st, req.Path, req.Mode, req.Metadata)
	case agentproto.OpStat:
		var s agentproto.Stat
		if s, err = statPath(req.Path); err == nil {
			reply(st, agentproto.Result{Stat: &s})
		}
	case agentproto.OpList:
		var items []agentproto.Stat
		if items, err = list(req.Path, req.Depth); err == nil && reply(st, agentproto.Result{Items: items}) != nil {
			// Too large for one message (or the host went away, and
			// this answer fails too).
			err = &agentproto.Error{Code: agentproto.CodeInvalid,
				Message: fmt.Sprintf("the %d entries under %s, with their metadata, are too large for one answer: list less deep", len(items), req.Path)}
		}
	case agentproto.OpMkdir:
		if err = os.MkdirAll(req.Path, 0o755); err == nil {
			reply(st, agentproto.Result{})
		}
	case agentproto.OpMove:
		if err = agentproto.CheckPath(req.To); err != nil {
			err = &agentproto.Error{Code: agentproto.CodeInvalid, Message: "destination: " + err.Error()}
		} else if err = move(req.Path, req.To); err == nil {
			reply(st, agentproto.Result{})
		}
	case agentproto.OpRemove:
		if err = remove(req.Path, req.Recursive); err == nil {
			reply(st, agentproto.Result{})
		}
	case agentproto.OpTarOut:
		err = tarOut(st, req.Path)
	case agentproto.OpTarIn:
		err = tarIn(st, req.Path)
	}
	if err != nil {
		reply(st, agentproto.Result{Error: toProtoError(err)})
	}
}

// toProtoError classifies a filesystem error for the host.
func toProtoError(err error) *agentproto.Error {
	var pe *agentproto.Error
	if errors.As(err, &pe) {
		return pe
	}
	code := agentproto.CodeInternal
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOSPC, syscall.EDQUOT:
			code = agentproto.CodeNoSpace
		case syscall.EISDIR:
			code = agentproto.CodeIsDir
		case syscall.ENOTDIR:
			code = agentproto.CodeNotDir
		case syscall.ENOTEMPTY:
			code = agentproto.CodeNotEmpty
		case syscall.EINVAL, syscall.ENAMETOOLONG:
			code = agentproto.CodeInvalid
		}
	}
	if code == agentproto.CodeInternal {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			code = agentproto.CodeNotFound
		case errors.Is(err, fs.ErrExist):
			code = agentproto.CodeExists
		case errors.Is(err, fs.ErrPermission):
			code = agentproto.CodePermission
		}
	}
	return &agentproto.Error{Code: code, Message: err.Error()}
}

// smallRead is the size up to which a regular file is read whole before
// its stat is sent, so the size the host is told is the size of what it
// gets even if the file is rewritten meanwhile.
const smallRead = 1 << 20

// readFile sends the stat of the opened file, then its content. A regular
// file's content is exactly the size in that stat: one of up to smallRead
// bytes is read first and its stat says what was read; a larger one is
// cut at the size it had when opened, and one that shrinks while it is
// read ends the transfer with an error, never with a short success.
func readFile(st net.Conn, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return &agentproto.Error{Code: agentproto.CodeIsDir, Message: fmt.Sprintf("%s is a directory", path)}
	}
	s := toStat(path, fi, "")
	var src io.Reader = f // what follows head
	var head []byte
	if fi.Mode().IsRegular() {
		small := fi.Size() <= smallRead
		if small {
			if head, err = io.ReadAll(io.LimitReader(f, smallRead+1)); err != nil {
				return err
			}
			small = len(head) <= smallRead // else it grew meanwhile
		}
		if small {
			s.SizeBytes, src = int64(len(head)), eofReader{}
		} else {
			if fi, err = f.Stat(); err != nil { // the size it has now
				return err
			}
			s.SizeBytes = fi.Size()
			head = head[:min(int64(len(head)), s.SizeBytes)]
			src = &exactReader{r: f, left: s.SizeBytes - int64(len(head)), path: path}
		}
	}
	if err := reply(st, agentproto.Result{Stat: &s}); err != nil {
		return nil // the host went away
	}
	for len(head) > 0 {
		n := min(len(head), agentproto.ChunkSize)
		if err := agentproto.WriteMsg(st, agentproto.MsgData, head[:n]); err != nil {
			return nil
		}
		head = head[n:]
	}
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if err := agentproto.WriteMsg(st, agentproto.MsgData, buf[:n]); err != nil {
				return nil
			}
		}
		if rerr == io.EOF {
			agentproto.WriteMsg(st, agentproto.MsgEOF, nil)
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// exactReader reads left bytes from r, no more, and fails if r ends
// first.
type exactReader struct {
	r    io.Reader
	left int64
	path string
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return 0, io.EOF
	}
	n, err := e.r.Read(p[:min(int64(len(p)), e.left)])
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, fmt.Errorf("%s shrank while it was read: %d bytes short", e.path, e.left)
	}
	if e.left == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

// dataReader reads the MsgData payloads of a stream until MsgEOF.
type dataReader struct {
	r    io.Reader
	buf  []byte
	rest []byte
	done bool
}

func newDataReader(r io.Reader) *dataReader {
	return &dataReader{r: r, buf: make([]byte, agentproto.ChunkSize+64)}
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.done {
			return 0, io.EOF
		}
		t, b, err := agentproto.ReadMsg(d.r, d.buf)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("transfer interrupted: %w", err)
		}
		switch t {
		case agentproto.MsgData:
			d.rest = b
		case agentproto.MsgEOF:
			d.done = true
		default:
			return 0, fmt.Errorf("unexpected message type %d in a transfer", t)
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

// writeFile writes the streamed data into a temporary file beside path,
// gives it its mode and metadata, and renames it into place only once all
// of that is done, so a failed transfer leaves the old file untouched. It
// answers the new file's stat with the metadata set.
func writeFile(st net.Conn, path string, mode uint32, md map[string]string) error {
	if mode == 0 {
		mode = 0o644
	}
	in := newDataReader(st)
	fail := func(err error) error {
		io.Copy(io.Discard, in) // keep the stream in step until the host's EOF
		return err
	}
	if mode > 0o7777 {
		return fail(&agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("mode %o is not a permission mode", mode)})
	}
	if err := agentproto.CheckMetadata(md); err != nil {
		return fail(&agentproto.Error{Code: agentproto.CodeInvalid, Message: err.Error()})
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fail(&agentproto.Error{Code: agentproto.CodeIsDir, Message: fmt.Sprintf("%s is a directory", path)})
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	tmp, err := os.CreateTemp(dir, ".airlock-write-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fail(err)
	}
	if err := tmp.Chmod(unixMode(mode)); err != nil {
		tmp.Close()
		return err
	}
	if err := setMetadata(tmp, md); err != nil {
		tmp.Close()
		return err
	}
	fi, err := tmp.Stat()
	if err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	s := toStat(path, fi, "")
	if len(md) > 0 {
		s.Metadata = md
	}
	return reply(st, agentproto.Result{Stat: &s})
}

// unixMode turns permission bits including setuid, setgid and sticky into
// an fs.FileMode.
func unixMode(m uint32) fs.FileMode {
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

func toStat(path string, fi fs.FileInfo, target string) agentproto.Stat {
	t := "other"
	switch {
	case fi.Mode().IsRegular():
		t = "file"
	case fi.IsDir():
		t = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		t = "symlink"
	}
	perm := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		perm |= 0o1000
	}
	return agentproto.Stat{
		Path: path, Type: t, SizeBytes: fi.Size(), Mode: fmt.Sprintf("%04o", perm),
		ModifiedAt: fi.ModTime().UTC(), Target: target,
	}
}

func statPath(path string) (agentproto.Stat, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return agentproto.Stat{}, err
	}
	target := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = os.Readlink(path)
	}
	s := toStat(path, fi, target)
	s.Metadata = readMetadata(path)
	return s, nil
}

// maxListItems bounds one listing, so a huge tree cannot exhaust memory.
const maxListItems = 100000

func list(root string, depth int) ([]agentproto.Stat, error) {
	if depth <= 0 {
		depth = 1
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, &agentproto.Error{Code: agentproto.CodeNotDir, Message: fmt.Sprintf("%s is not a directory", root)}
	}
	items := []agentproto.Stat{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // unreadable below the root: list what can be read
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		level := strings.Count(rel, "/") + 1
		s, serr := statPath(p)
		if serr == nil {
			items = append(items, s)
		}
		if len(items) >= maxListItems {
			return fs.SkipAll
		}
		if d.IsDir() && level >= depth {
			return fs.SkipDir
		}
		return nil
	})
	return items, err
}

func move(from, to string) error {
	if _, err := os.Lstat(from); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.Rename(from, to)
}

func remove(path string, recursive bool) error {
	if path == "/" {
		return &agentproto.Error{Code: agentproto.CodeInvalid, Message: "refusing to remove /"}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() && recursive {
		return os.RemoveAll(path)
	}
	return os.Remove(path)
}

func tarOut(st net.Conn, root string) error {
	fi, err := os.Lstat(root)
	if err != nil {
		return err
	}
	if err := reply(st, agentproto.Result{}); err != nil {
		return nil
	}
	out := agentproto.DataWriter{W: st, Type: agentproto.MsgData}
	tw := tar.NewWriter(out)
	base := root
	if !fi.IsDir() {
		base = filepath.Dir(root)
	}
	werr := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil // sockets and the like have no tar form
		}
		rel, _ := filepath.Rel(base, p)
		if rel == "." {
			return nil
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, info.Size())
			f.Close()
			return err
		}
		return nil
	})
	if werr == nil {
		werr = tw.Close()
	}
	if werr != nil {
		// The host sees an error result in place of the end of the data.
		return werr
	}
	return agentproto.WriteMsg(st, agentproto.MsgEOF, nil)
}

// tarIn extracts a tar stream under root. Entries that would land outside
// root are refused.
func tarIn(st net.Conn, root string) error {
	in := newDataReader(st)
	fail := func(err error) error {
		io.Copy(io.Discard, in)
		return err
	}
	tr := tar.NewReader(in)
	for first := true; ; first = false {
		hdr, err := tr.Next()
		if err != nil && err != io.EOF {
			return fail(&agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("read tar: %v", err)})
		}
		// The target is made once the stream has shown it is a tar, so
		// a body that is not one changes nothing.
		if first {
			if err := os.MkdirAll(root, 0o755); err != nil {
				return fail(err)
			}
		}
		if err == io.EOF {
			break
		}
		name := filepath.Clean("/" + hdr.Name)
		if hdr.Name == "" || strings.Contains(hdr.Name, "\x00") || hasDotDot(hdr.Name) {
			return fail(&agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("tar entry %q leaves the target directory", hdr.Name)})
		}
		dst := filepath.Join(root, name)
		mode := fs.FileMode(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return fail(err)
			}
			os.Chmod(dst, mode.Perm())
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return fail(err)
			}
			os.Remove(dst) // never write through a symlink that stands there
			f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, mode.Perm())
			if err != nil {
				return fail(err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fail(err)
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return fail(err)
			}
			os.Remove(dst)
			if err := os.Symlink(hdr.Linkname, dst); err != nil {
				return fail(err)
			}
		case tar.TypeLink:
			target := filepath.Join(root, filepath.Clean("/"+hdr.Linkname))
			if hasDotDot(hdr.Linkname) {
				return fail(&agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("tar link %q leaves the target directory", hdr.Linkname)})
			}
			os.Remove(dst)
			if err := os.Link(target, dst); err != nil {
				return fail(err)
			}
		default:
			// Devices, fifos: skipped, as an unprivileged extract would.
		}
		if hdr.Typeflag != tar.TypeSymlink {
			os.Chtimes(dst, hdr.ModTime, hdr.ModTime)
		}
	}
	return reply(st, agentproto.Result{})
}

func hasDotDot(name string) bool {
	for _, el := range strings.Split(filepath.ToSlash(name), "/") {
		if el == ".." {
			return true
		}
	}
	return false
}
