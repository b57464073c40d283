package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/timings"
)

// newRoot is where the sandbox's disk is mounted before the agent switches
// into it.
const newRoot = "/mnt/root"

func (a *Agent) handleInit(st net.Conn, req *agentproto.InitRequest) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "init request without parameters")
		return
	}
	if a.initialized.Load() {
		replyErr(st, agentproto.CodeState, "the sandbox is already initialised")
		return
	}
	res := &agentproto.InitResult{}
	if a.cfg.System {
		if err := systemInit(req, res); err != nil {
			a.log.Error("init", "err", err)
			replyErr(st, agentproto.CodeInternal, err.Error())
			return
		}
		// Without the group commands still run, with no room kept for
		// the agent: a warning says so.
		if fd, limits, err := setupCommandsCgroup(); err != nil {
			res.Warnings = append(res.Warnings, "commands run without pids and memory limits: "+err.Error())
		} else {
			a.commands.Store(int64(fd))
			a.log.Info("commands' cgroup", "pids.max", limits.pids, "memory.max", limits.memory)
		}
	}
	var image agentproto.ImageConfig
	if a.cfg.System {
		var warn string
		if image, warn = readImageConfig(agentproto.ImageConfigFile); warn != "" {
			res.Warnings = append(res.Warnings, warn)
		}
	}
	id := identity{hostname: req.Hostname, rootDevice: rootDevice(req.RootDevice), placeholder: req.Placeholder}
	if req.Network != nil {
		id.caCert = req.Network.CACert
	}
	a.mu.Lock()
	a.defaultEnv = req.Env
	a.image = image
	a.identity = id
	a.mu.Unlock()
	a.initialized.Store(true)
	reply(st, agentproto.Result{Init: res})
}

// rootDevice is the root disk an init request names, or the default.
func rootDevice(dev string) string {
	if dev == "" {
		return "/dev/vda"
	}
	return dev
}

// systemInit sets the clock, entropy and hostname, mounts the root disk,
// grows its filesystem to the disk's size, and switches into it.
func systemInit(req *agentproto.InitRequest, res *agentproto.InitResult) error {
	clock := timings.Start()
	defer func() { res.Timings = clock.T }()
	if req.TimeUnixNano > 0 {
		ts := unix.NsecToTimespec(req.TimeUnixNano)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set clock: %w", err)
		}
	}
	if err := mixEntropy(req.Entropy); err != nil {
		return err
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		res.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	clock.Lap("clock, entropy, hostname")
	dev := rootDevice(req.RootDevice)
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, newRoot, "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount root disk %s: %w", dev, err)
	}
	clock.Lap("mount root disk")
	size, err := growFS(dev, newRoot)
	if err != nil {
		return fmt.Errorf("grow root filesystem: %w", err)
	}
	res.DiskBytes = size
	clock.Lap("grow root filesystem")
	// Switch root: the initramfs cannot be pivoted away, so move the new
	// root over / and chroot into it.
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	// Mounted from inside the root, so that a symlink in the image where
	// a mount point should be resolves within it. The image may lack any
	// of these directories (a tree of one static binary has none): they
	// are made. /proc, /sys, /dev and /dev/pts are needed to run anything;
	// the others are worth a warning only.
	mounts := []struct {
		src, dir, fstype, data string
		flags                  uintptr
		optional               bool
	}{
		{"proc", "/proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, false},
		{"sysfs", "/sys", "sysfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, false},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755", unix.MS_NOSUID, false},
		{"devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5", unix.MS_NOSUID | unix.MS_NOEXEC, false},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV, true},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV, true},
		{"tmpfs", "/run", "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV, true},
	}
	for _, m := range mounts {
		if err := mountAt(m.dir, m.src, m.fstype, m.flags, m.data); err != nil {
			if !m.optional {
				return err
			}
			res.Warnings = append(res.Warnings, err.Error())
		}
	}
	// /dev/ptmx must be the new devpts instance's, so ptys work inside.
	os.Remove("/dev/ptmx")
	if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
		return fmt.Errorf("link /dev/ptmx: %w", err)
	}
	clock.Lap("switch root, mounts")
	// The sandbox's own files are conveniences: an image that cannot take
	// one (its /etc is not a directory, say) still runs commands.
	if err := writeHostname("/", req.Hostname); err != nil {
		res.Warnings = append(res.Warnings, err.Error())
	}
	clock.Lap("hostname files")
	warnings, err := setupNetwork(req.Network)
	res.Warnings = append(res.Warnings, warnings...)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	clock.Lap("network")
	return nil
}

// mountAt mounts a filesystem on dir, making the directory first. A
// symlink there that leads nowhere (an image's /run -> /var/run without
// /var/run, say) gets its target made.
func mountAt(dir, src, fstype string, flags uintptr, data string) error {
	p := dir
	if fi, err := os.Lstat(dir); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if _, err := os.Stat(dir); err != nil {
			if target, err := os.Readlink(dir); err == nil {
				if !filepath.IsAbs(target) {
					target = filepath.Join(filepath.Dir(dir), target)
				}
				p = target
			}
		}
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return fmt.Errorf("create mount point %s: %w", dir, err)
	}
	if err := unix.Mount(src, dir, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	return nil
}

// growFS resizes the ext4 filesystem mounted at dir to fill dev, whose size
// is the sandbox's disk limit, and returns that size.
func growFS(dev, dir string) (int64, error) {
	size, err := blockSize(dev)
	if err != nil {
		return 0, err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return 0, err
	}
	blocks := size / uint64(sfs.Bsize)
	if blocks <= sfs.Blocks {
		return int64(size), nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	const ext4IocResizeFS = 0x40086610 // _IOW('f', 16, __u64)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&blocks))); e != 0 {
		return 0, fmt.Errorf("resize to %d blocks: %w", blocks, e)
	}
	return int64(size), nil
}

// blockSize is the size of block device dev in bytes, as the kernel sees
// it now.
func blockSize(dev string) (uint64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		return 0, fmt.Errorf("size of %s: %w", dev, e)
	}
	return size, nil
}

// mixEntropy mixes b, when there is any, into the kernel's random pool,
// credits it, and reseeds the CRNG from the pool at once, so that clones
// of one snapshot diverge: the kernel would otherwise reseed only about a
// minute later, and until then two restores of one state read the same
// random bytes.
func mixEntropy(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("add entropy: %w", err)
	}
	defer f.Close()
	buf := randPoolInfo(b)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("add entropy: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("reseed the kernel's random generator: %w", e)
	}
	return nil
}

// randPoolInfo lays out RNDADDENTROPY's argument for b, credited in full:
// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
// in the machine's byte order.
func randPoolInfo(b []byte) []byte {
	n := (len(b) + 3) / 4 * 4
	buf := make([]byte, 8+n)
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(b) * 8)
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(b))
	copy(buf[8:], b)
	return buf
}

func (a *Agent) handleRefresh(st net.Conn, req *agentproto.RefreshRequest) {
	if req == nil {
		replyErr(st, agentproto.CodeInvalid, "refresh request without parameters")
		return
	}
	if !a.initialized.Load() {
		replyErr(st, agentproto.CodeState, "the sandbox is not initialised yet")
		return
	}
	if a.cfg.System {
		if err := refresh(req); err != nil {
			a.log.Error("refresh", "err", err)
			replyErr(st, agentproto.CodeInternal, err.Error())
			return
		}
	}
	reply(st, agentproto.Result{})
}

// refresh sets the clock and reseeds the kernel's random generator of a
// guest that was paused or restored.
func refresh(req *agentproto.RefreshRequest) error {
	if req.TimeUnixNano > 0 {
		ts := unix.NsecToTimespec(req.TimeUnixNano)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set clock: %w", err)
		}
	}
	return mixEntropy(req.Entropy)
}

// writeHostname writes the hostname to /etc/hostname and makes /etc/hosts
// resolve it, as tools expect, under root (the sandbox's "/"). An image
// without /etc gets one.
func writeHostname(root, name string) error {
	if name == "" {
		return nil
	}
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("write the hostname: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, agentproto.HostnameFile), []byte(name+"\n"), 0o644); err != nil {
		return fmt.Errorf("write the hostname: %w", err)
	}
	hosts := filepath.Join(root, agentproto.HostsFile)
	b, err := os.ReadFile(hosts)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("add the hostname to %s: %w", agentproto.HostsFile, err)
	}
	add := addHostsLine(b, name)
	if add == "" {
		return nil
	}
	f, err := os.OpenFile(hosts, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("add the hostname to %s: %w", agentproto.HostsFile, err)
	}
	if _, err := f.WriteString(add); err != nil {
		f.Close()
		return fmt.Errorf("add the hostname to %s: %w", agentproto.HostsFile, err)
	}
	return f.Close()
}

// addHostsLine returns what a hosts file holding hosts must gain to
// resolve name: nothing when a line resolves it already; the localhost
// entries too when it is empty; a newline first when its last line has
// none.
func addHostsLine(hosts []byte, name string) string {
	for _, line := range strings.Split(string(hosts), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && !strings.HasPrefix(f[0], "#") && slices.Contains(f[1:], name) {
			return ""
		}
	}
	var add string
	switch {
	case len(bytes.TrimSpace(hosts)) == 0:
		add = agentproto.HostsHeader
	case !bytes.HasSuffix(hosts, []byte("\n")):
		add = "\n"
	}
	return add + agentproto.HostsLine(name)
}

// Boot prepares PID 1: the mounts the initramfs needs, the console as
// stdio, and the kernel modules listed in /etc/airlock/modules.
func Boot() error {
	for _, m := range []struct{ src, dir, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.src, m.dir, m.fstype, 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s: %w", m.dir, err)
		}
	}
	if con, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup2(int(con.Fd()), fd)
		}
	}
	f, err := os.Open("/etc/airlock/modules")
	if err != nil {
		return fmt.Errorf("read module list: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" {
			continue
		}
		if err := loadModule(p); err != nil {
			return err
		}
	}
	return sc.Err()
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && err != unix.EEXIST {
		return fmt.Errorf("load module %s: %w", filepath.Base(path), err)
	}
	return nil
}

// OpenPort waits for the agent's virtio-serial port to appear and opens it.
func OpenPort(timeout time.Duration) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	for {
		ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range ports {
			b, err := os.ReadFile(p)
			if err != nil || strings.TrimSpace(string(b)) != agentproto.PortName {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(p))
			f, err := os.OpenFile(dev, os.O_RDWR, 0)
			if err == nil {
				return f, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("open %s: %w", dev, err)
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("virtio-serial port %q did not appear within %s", agentproto.PortName, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readImageConfig reads the template's command defaults. A template
// without the file has none; a file that cannot be read or parsed is
// ignored with a warning, never fatal: commands still run.
func readImageConfig(path string) (agentproto.ImageConfig, string) {
	var c agentproto.ImageConfig
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, ""
	}
	if err != nil {
		return c, fmt.Sprintf("read %s: %v", path, err)
	}
	defer f.Close()
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&c); err != nil {
		return agentproto.ImageConfig{}, fmt.Sprintf("read %s: %v", path, err)
	}
	return c, ""
}
