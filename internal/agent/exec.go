package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// drainIdle is how long output pipes may stay silent after the process
// exited before the agent stops reading them. Output the process wrote is
// already in the pipe and drains at once; only a background child that
// inherited the pipe and keeps it open hits this.
const drainIdle = 250 * time.Millisecond

// reaper waits for every child of PID 1, including orphans it adopts, and
// hands exit statuses to the processes the agent started.
type reaper struct {
	mu      sync.Mutex // guards waiters, users and stop; held across fork so a fast exit is never missed
	waiters map[int]chan unix.WaitStatus
	users   int           // agents serving
	stop    chan struct{} // closed when the last one stops
}

// processReaper is the process's one reaper: Wait4(-1) takes any child's
// exit, so two reapers in one process (agents of tests side by side)
// would each take exits the other waits for. It reaps while an agent
// serves (acquire and release), and leaves the process's children alone
// otherwise, for os/exec to wait for.
var processReaper = sync.OnceValue(func() *reaper {
	return &reaper{waiters: map[int]chan unix.WaitStatus{}}
})

// acquire starts reaping, if no agent had: children started after it
// returns have their exits seen.
func (r *reaper) acquire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users++
	if r.users == 1 {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, unix.SIGCHLD)
		r.stop = make(chan struct{})
		go r.run(sigs, r.stop)
	}
}

// release stops reaping once no agent serves.
func (r *reaper) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.users--; r.users == 0 {
		close(r.stop)
	}
}

// run reaps children on every SIGCHLD until stop closes. reap drains
// every exited child, and a SIGCHLD that arrives meanwhile waits in the
// channel, so no exit is missed.
func (r *reaper) run(sigs chan os.Signal, stop <-chan struct{}) {
	defer signal.Stop(sigs)
	for {
		select {
		case <-stop:
			return
		case <-sigs:
		}
		r.reap()
	}
}

func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws
		}
	}
}

// start runs fork, which returns the new child's PID, and registers a
// waiter for it.
func (r *reaper) start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (a *Agent) handleExec(st net.Conn, req *agentproto.ExecRequest) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "exec request without exec parameters")
		return
	}
	if !a.initialized.Load() {
		replyErr(st, agentproto.CodeState, "the sandbox is not initialised yet")
		return
	}
	if err := req.Validate(); err != nil {
		replyErr(st, agentproto.CodeInvalid, err.Error())
		return
	}
	spec, err := a.prepare(req)
	if err != nil {
		var pe *agentproto.Error
		if errors.As(err, &pe) {
			reply(st, agentproto.Result{Error: pe})
		} else {
			replyErr(st, agentproto.CodeInternal, err.Error())
		}
		return
	}
	a.run(st, req, spec)
}

// execSpec is an exec request resolved against the sandbox's filesystem.
type execSpec struct {
	path string
	argv []string
	env  []string
	dir  string
	cred *syscall.Credential
}

func (a *Agent) prepare(req *agentproto.ExecRequest) (*execSpec, error) {
	argv := req.Argv
	if req.Cmd != "" {
		if !executable(shell) {
			return nil, &agentproto.Error{Code: agentproto.CodeNotFound, Message: "this template has no " + shell + "; pass argv instead"}
		}
		argv = []string{shell, "-c", req.Cmd}
	}
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG": "C.UTF-8",
	}
	a.mu.Lock()
	image := a.image
	for _, kv := range image.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	for k, v := range a.defaultEnv {
		env[k] = v
	}
	a.mu.Unlock()

	spec := &execSpec{argv: argv}
	home := "/"
	userName := req.User
	if userName == "" {
		userName = image.User
	}
	if a.cfg.System || userName != "" {
		u, err := lookupUser(userName, passwdFile, groupFile)
		if err != nil {
			return nil, err
		}
		spec.cred, home = u.cred, u.home
		env["HOME"], env["USER"], env["LOGNAME"] = u.home, u.name, u.name
	}
	if req.PTY != nil {
		env["TERM"] = "xterm-256color"
	}
	for k, v := range req.Env {
		env[k] = v
	}
	for k, v := range env {
		spec.env = append(spec.env, k+"="+v)
	}
	sort.Strings(spec.env)

	spec.dir = req.Cwd
	if spec.dir == "" && image.WorkingDir != "" {
		if fi, err := os.Stat(image.WorkingDir); err == nil && fi.IsDir() {
			spec.dir = image.WorkingDir
		}
	}
	if spec.dir == "" {
		spec.dir = home
		if fi, err := os.Stat(home); err != nil || !fi.IsDir() {
			spec.dir = "/"
		}
	}
	if fi, err := os.Stat(spec.dir); err != nil || !fi.IsDir() {
		return nil, &agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("working directory %s does not exist", spec.dir)}
	}
	p, err := lookPath(argv[0], env["PATH"], spec.dir)
	if err != nil {
		return nil, err
	}
	spec.path = p
	return spec, nil
}

// shell runs the commands given as a string (ExecRequest.Cmd).
const shell = "/bin/sh"

// The sandbox's user and group databases, which an image may lack.
const (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// account is the identity a process runs as.
type account struct {
	cred *syscall.Credential
	home string
	name string // USER and LOGNAME: the user's name, or the uid without one
}

// lookupUser resolves who a process runs as: name is a user of the
// passwd file, or a numeric "uid[:gid]", which needs no passwd file (a
// uid it lists gets that user's home, name, group and supplementary
// groups unless a gid is given); empty means root, who needs no passwd
// file either. The files are read here rather than through os/user, which
// with cgo asks the host's NSS instead: the agent is built without cgo,
// and its tests, run with it, must read what it reads.
func lookupUser(name, passwd, group string) (account, error) {
	users, perr := readPasswd(passwd)
	if name == "" {
		if u, ok := users.byName("root"); ok {
			return u.account(group, -1), nil
		}
		return account{cred: &syscall.Credential{}, home: rootHome(), name: "root"}, nil
	}
	uidStr, gidStr, hasGID := strings.Cut(name, ":")
	if hasGID || isDigits(name) {
		uid, err1 := strconv.ParseUint(uidStr, 10, 32)
		gid := uid
		var err2 error
		if hasGID {
			gid, err2 = strconv.ParseUint(gidStr, 10, 32)
		}
		if err1 != nil || err2 != nil {
			return account{}, &agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("user %q is not a name or uid[:gid]", name)}
		}
		if u, ok := users.byUID(uint32(uid)); ok {
			g := int64(-1)
			if hasGID {
				g = int64(gid)
			}
			return u.account(group, g), nil
		}
		return account{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, home: "/", name: uidStr}, nil
	}
	if errors.Is(perr, fs.ErrNotExist) {
		return account{}, &agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("user %q: this template has no %s; give a numeric uid[:gid]", name, passwd)}
	}
	u, ok := users.byName(name)
	if !ok {
		return account{}, &agentproto.Error{Code: agentproto.CodeInvalid, Message: fmt.Sprintf("user %q does not exist in the sandbox", name)}
	}
	return u.account(group, -1), nil
}

// rootHome is root's home without a passwd file: /root if the image has
// it.
func rootHome() string {
	if fi, err := os.Stat("/root"); err == nil && fi.IsDir() {
		return "/root"
	}
	return "/"
}

// passwdEntry is one line of a passwd file.
type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

type passwdEntries []passwdEntry

func (p passwdEntries) byName(name string) (passwdEntry, bool) {
	for _, e := range p {
		if e.name == name {
			return e, true
		}
	}
	return passwdEntry{}, false
}

func (p passwdEntries) byUID(uid uint32) (passwdEntry, bool) {
	for _, e := range p {
		if e.uid == uid {
			return e, true
		}
	}
	return passwdEntry{}, false
}

// account is the identity of the user, with gid as its group when it is
// not negative, and the supplementary groups the group file gives it.
func (e passwdEntry) account(group string, gid int64) account {
	cred := &syscall.Credential{Uid: e.uid, Gid: e.gid}
	if gid >= 0 {
		cred.Gid = uint32(gid)
	}
	cred.Groups = supplementaryGroups(group, e.name, cred.Gid)
	home := e.home
	if home == "" {
		home = "/"
	}
	return account{cred: cred, home: home, name: e.name}
}

// readPasswd reads a passwd file: name:password:uid:gid:gecos:home:shell.
// Malformed lines are skipped.
func readPasswd(path string) (passwdEntries, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out passwdEntries
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 7 || f[0] == "" || strings.HasPrefix(f[0], "#") {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, passwdEntry{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]})
	}
	return out, nil
}

// supplementaryGroups lists the groups of a group file
// (name:password:gid:members) that name is a member of, besides primary.
// Without a group file there are none.
func supplementaryGroups(path, name string, primary uint32) []uint32 {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []uint32
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 4 {
			continue
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == primary || !slices.Contains(strings.Split(f[3], ","), name) {
			continue
		}
		out = append(out, uint32(gid))
	}
	return out
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// executable reports whether p is a file that can be run.
func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// lookPath finds an executable the way a shell would, with the process's
// own PATH.
func lookPath(name, pathEnv, dir string) (string, error) {
	notFound := &agentproto.Error{Code: agentproto.CodeNotFound, Message: fmt.Sprintf("%s: command not found", name)}
	check := executable
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if !check(p) {
			return "", notFound
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if p := filepath.Join(d, name); check(p) {
			return p, nil
		}
	}
	return "", notFound
}

// run starts the process and attaches st to it: st gets MsgStarted, the
// output and the exit, and its MsgStdin and MsgEOF go to the process.
func (a *Agent) run(st net.Conn, req *agentproto.ExecRequest, spec *execSpec) {
	var (
		childFiles []*os.File // the child's ends, closed once it started
		stdin      *os.File   // our end of stdin, nil without one
		outputs    []*os.File // our ends of stdout, stderr (or the pty)
		types      []agentproto.MsgType
		ptmx       *os.File
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	fail := func(err error) {
		closeAll(childFiles)
		closeAll(outputs)
		if stdin != nil {
			stdin.Close()
		}
		replyErr(st, agentproto.CodeInternal, err.Error())
	}
	sys := &syscall.SysProcAttr{Credential: spec.cred}
	if spec.cred != nil && spec.cred.Uid == uint32(os.Geteuid()) && spec.cred.Gid == uint32(os.Getegid()) && len(spec.cred.Groups) == 0 {
		sys.Credential = nil // nothing to change; also lets tests run unprivileged
	}
	if req.PTY != nil {
		m, tty, err := openPTY()
		if err != nil {
			fail(fmt.Errorf("open pty: %w", err))
			return
		}
		setWinsize(m, req.PTY.Rows, req.PTY.Cols)
		ptmx = m
		childFiles = []*os.File{tty, tty, tty}
		outputs, types = []*os.File{m}, []agentproto.MsgType{agentproto.MsgStdout}
		if req.Stdin {
			stdin = m
		}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		var in *os.File
		if req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				fail(err)
				return
			}
			in, stdin = r, w
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				fail(err)
				return
			}
			in = f
		}
		or, ow, err := os.Pipe()
		if err != nil {
			in.Close()
			fail(err)
			return
		}
		er, ew, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{in, or, ow})
			fail(err)
			return
		}
		childFiles = []*os.File{in, ow, ew}
		outputs = []*os.File{or, er}
		types = []agentproto.MsgType{agentproto.MsgStdout, agentproto.MsgStderr}
		sys.Setpgid = true
	}

	if fd := a.commands.Load(); fd >= 0 {
		sys.UseCgroupFD, sys.CgroupFD = true, int(fd)
	}
	start := time.Now()
	pid, waitCh, err := a.reaper.start(func() (int, error) {
		p, err := os.StartProcess(spec.path, spec.argv, &os.ProcAttr{Dir: spec.dir, Env: spec.env, Files: childFiles, Sys: sys})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		p.Release()
		return pid, nil
	})
	if req.PTY != nil {
		childFiles = childFiles[:1] // one tty, listed three times
	}
	closeAll(childFiles)
	childFiles = nil
	if err != nil {
		closeAll(outputs)
		if stdin != nil && stdin != ptmx {
			stdin.Close()
		}
		code := agentproto.CodeInternal
		if errors.Is(err, os.ErrPermission) {
			code = agentproto.CodePermission
		}
		replyErr(st, code, fmt.Sprintf("start %s: %v", spec.argv[0], err))
		return
	}

	id := fmt.Sprintf("p%d", a.nextID.Add(1))
	p := newProcess(id, pid, ptmx, stdin)
	a.mu.Lock()
	a.procs[id] = p
	a.mu.Unlock()
	att, _, _ := p.attach(st, 0)
	go a.supervise(p, waitCh, outputs, types, time.Duration(req.TimeoutMS)*time.Millisecond, start)
	a.evict(time.Now())
	a.serve(st, p, att, 0)
}

func (a *Agent) lookupProc(id string) *process {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.procs[id]
}

func (a *Agent) handleSignal(st net.Conn, req *agentproto.SignalReq) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "signal request without parameters")
		return
	}
	sig, err := ParseSignal(req.Signal)
	if err != nil {
		replyErr(st, agentproto.CodeInvalid, err.Error())
		return
	}
	if p := a.lookupProc(req.ID); p == nil || !p.signal(sig) {
		replyErr(st, agentproto.CodeNotFound, fmt.Sprintf("no running process %q", req.ID))
		return
	}
	reply(st, agentproto.Result{})
}

func (a *Agent) handleResize(st net.Conn, req *agentproto.ResizeReq) {
	if req == nil || req.Rows == 0 || req.Cols == 0 {
		replyErr(st, agentproto.CodeInvalid, "resize needs positive rows and cols")
		return
	}
	p := a.lookupProc(req.ID)
	if p == nil {
		replyErr(st, agentproto.CodeNotFound, fmt.Sprintf("no running process %q", req.ID))
		return
	}
	if p.pty == nil {
		replyErr(st, agentproto.CodeInvalid, "the process has no terminal to resize")
		return
	}
	running, err := p.resize(req.Rows, req.Cols)
	switch {
	case !running:
		replyErr(st, agentproto.CodeNotFound, fmt.Sprintf("no running process %q", req.ID))
		return
	case err != nil:
		replyErr(st, agentproto.CodeInternal, fmt.Sprintf("resize: %v", err))
		return
	}
	reply(st, agentproto.Result{})
}

// ParseSignal accepts "TERM", "SIGTERM" or a number.
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, fmt.Errorf("signal %d is out of range", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, fmt.Errorf("unknown signal %q", s)
	}
	return sig, nil
}

// openPTY opens a pseudo-terminal whose master reads through Go's poller,
// so that its read deadlines work.
func openPTY() (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	fd, err := unix.Dup(int(m.Fd()))
	if err != nil {
		tty.Close()
		return nil, nil, err
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		tty.Close()
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), m.Name()), tty, nil
}

// setWinsize sets a terminal's size through f's descriptor without
// taking it out of the poller (as pty.Setsize, through Fd, would).
func setWinsize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}
