package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/jail"
)

// Tool is a run of a host tool on bytes a tenant controls: e2fsck,
// resize2fs, debugfs, dumpe2fs and qemu-img on a guest's disk or an
// image's. Such tools parse what root in a guest wrote, so with a
// non-zero UID the run is jailed as a VM's QEMU is (jail.Spec): its own
// namespaces (jail.Namespaces), a root holding only the system's /usr and
// the files named in Read and Write, no capabilities, no_new_privs, the
// user UID, a seccomp filter (jail.ToolDenied), resource limits and a
// deadline. Its crash, its limits and its deadline are errors of Run.
type Tool struct {
	// Path is the tool's absolute path.
	Path string
	// Args follow the tool's name on its command line.
	Args []string
	// UID and GID run it jailed; 0 runs it unconfined, as this process,
	// for debugging only (the server's --jail off).
	UID, GID int
	// Read and Write are the absolute paths of the files and directories
	// it may read, and read and write; they appear at the same paths.
	// Their modes still apply: a file written must be the user's.
	Read, Write []string
	// Env is its environment; none by default.
	Env []string
	// Stdin, when set, is its standard input; else it reads nothing.
	Stdin io.Reader
	// Timeout bounds the run; default ToolTimeout.
	Timeout time.Duration
	// MemoryBytes bounds its address space; default ToolMemory.
	MemoryBytes uint64
	// ReadAnyFile keeps CAP_DAC_READ_SEARCH, and no other capability,
	// for a tool that reads a tree whose files keep their owners and
	// modes (mkfs.ext4 -d of an image's tree); what it may read is still
	// only what Read shows it. open_by_handle_at, which that capability
	// would open to it, is refused by the filter.
	ReadAnyFile bool
}

// The defaults of Tool's limits: generous for a tool on a disk of tens of
// GiB, far below what would hurt the host.
const (
	ToolTimeout = 30 * time.Minute
	ToolMemory  = 4 << 30
)

// ToolRootDir is the empty directory each jailed tool mounts its root on,
// inside its own mount namespace only.
const ToolRootDir = "/run/airlock/tool-root"

// Output runs the tool and returns its standard output; a failure
// (a non-zero exit, a signal, the deadline) is an error that quotes the
// end of its standard error, and wraps *exec.ExitError where it exited.
func (t Tool) Output(ctx context.Context) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	err := t.run(ctx, &stdout, &stderr)
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		if len(msg) > 2000 {
			msg = "..." + msg[len(msg)-2000:]
		}
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", filepath.Base(t.Path), strings.Join(t.Args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// Run runs the tool with its output going to stdout and stderr.
func (t Tool) Run(ctx context.Context, stdout, stderr io.Writer) error {
	return t.run(ctx, stdout, stderr)
}

func (t Tool) run(ctx context.Context, stdout, stderr io.Writer) error {
	if !filepath.IsAbs(t.Path) {
		return fmt.Errorf("tool %q: not an absolute path: %w", t.Path, errdefs.ErrInvalid)
	}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = ToolTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var cmd *exec.Cmd
	var life *os.File
	if t.UID == 0 {
		cmd = exec.CommandContext(ctx, t.Path, t.Args...)
		cmd.Env = t.Env
		if cmd.Env == nil {
			cmd.Env = []string{}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	} else {
		if t.UID < 0 || t.GID <= 0 {
			return fmt.Errorf("tool %s: jailed as user %d group %d: %w", t.Path, t.UID, t.GID, errdefs.ErrInvalid)
		}
		if err := os.MkdirAll(ToolRootDir, 0o700); err != nil {
			return fmt.Errorf("make the tools' jail root: %w", err)
		}
		spec, err := t.spec()
		if err != nil {
			return err
		}
		var lifeRead *os.File
		if lifeRead, life, err = os.Pipe(); err != nil {
			return err
		}
		defer life.Close()
		spec.LifeFD = 3
		js, err := json.Marshal(spec)
		if err != nil {
			lifeRead.Close()
			return err
		}
		cmd = exec.CommandContext(ctx, "/proc/self/exe")
		cmd.Args = []string{"airlock-tool-jail"}
		cmd.Env = []string{jail.Env + "=" + string(js)}
		cmd.ExtraFiles = []*os.File{lifeRead}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: jail.Namespaces}
		defer lifeRead.Close()
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = t.Stdin, stdout, stderr
	// A tool that outlives its deadline is killed; its output pipes are
	// not waited on for long after.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s ran past its %s deadline and was killed: %w", filepath.Base(t.Path), timeout, errdefs.ErrUnavailable)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 126 && t.UID != 0 {
		return fmt.Errorf("jail %s: %w", filepath.Base(t.Path), err)
	}
	return err
}

// spec is the jail of a tool run.
func (t Tool) spec() (jail.Spec, error) {
	mem := t.MemoryBytes
	if mem == 0 {
		mem = ToolMemory
	}
	spec := jail.Spec{
		UID: t.UID, GID: t.GID, Groups: []int{},
		Root: ToolRootDir, Links: map[string]string{}, Proc: true,
		Argv: append([]string{t.Path}, t.Args...), Env: t.Env, Seccomp: true,
		Rlimits: []jail.Rlimit{
			{Resource: unix.RLIMIT_AS, Max: mem},
			{Resource: unix.RLIMIT_NOFILE, Max: 256},
			{Resource: unix.RLIMIT_NPROC, Max: 64},
			{Resource: unix.RLIMIT_CORE, Max: 0},
		},
	}
	if t.ReadAnyFile {
		spec.KeepCaps = []int{unix.CAP_DAC_READ_SEARCH}
	}
	if err := addSystem(&spec, t.Path); err != nil {
		return spec, err
	}
	// e2fsprogs ask whether an image is mounted, through /etc/mtab; the
	// answer is the jail's own mount table.
	spec.Links["/etc/mtab"] = "/proc/self/mounts"
	add := func(path string, write, dev bool) { addBind(&spec, path, write, dev) }
	for _, p := range t.Read {
		if !filepath.IsAbs(p) {
			return spec, fmt.Errorf("tool %s: %q is not an absolute path: %w", t.Path, p, errdefs.ErrInvalid)
		}
		add(filepath.Clean(p), false, false)
	}
	for _, p := range t.Write {
		if !filepath.IsAbs(p) {
			return spec, fmt.Errorf("tool %s: %q is not an absolute path: %w", t.Path, p, errdefs.ErrInvalid)
		}
		add(filepath.Clean(p), true, false)
	}
	slices.SortFunc(spec.Binds, func(a, b jail.Bind) int { return strings.Compare(a.Path, b.Path) })
	return spec, nil
}

// addBind shows path in the jail at the same path: read-write if any
// caller asks for it so, with device nodes usable when dev.
func addBind(spec *jail.Spec, path string, write, dev bool) {
	for i, b := range spec.Binds {
		if b.Path == path {
			spec.Binds[i].Write = b.Write || write
			return
		}
	}
	spec.Binds = append(spec.Binds, jail.Bind{Path: path, Write: write, Dev: dev})
}

// addSystem binds what any jailed program needs: /usr, the merged-/usr
// links (or directories), the loader's cache, /dev/null and /dev/urandom,
// and the directory of bin when it is outside /usr.
func addSystem(spec *jail.Spec, bin string) error {
	addBind(spec, "/usr", false, false)
	for _, name := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(name)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(name)
			if err != nil {
				return err
			}
			spec.Links[name] = target
		case fi.IsDir():
			addBind(spec, name, false, false)
		}
	}
	if !strings.HasPrefix(bin, "/usr/") && spec.Links[filepath.Dir(bin)] == "" {
		addBind(spec, filepath.Dir(bin), false, false)
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		addBind(spec, "/etc/ld.so.cache", false, false)
	}
	addBind(spec, "/dev/null", true, true)
	addBind(spec, "/dev/urandom", false, true)
	return nil
}
