package agent

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
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
	}
	a.mu.Lock()
	a.defaultEnv = req.Env
	a.mu.Unlock()
	a.initialized.Store(true)
	reply(st, agentproto.Result{Init: res})
}

// systemInit sets the clock, entropy and hostname, mounts the root disk,
// grows its filesystem to the disk's size, and switches into it.
func systemInit(req *agentproto.InitRequest, res *agentproto.InitResult) error {
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
	dev := req.RootDevice
	if dev == "" {
		dev = "/dev/vda"
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, newRoot, "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount root disk %s: %w", dev, err)
	}
	size, err := growFS(dev, newRoot)
	if err != nil {
		return fmt.Errorf("grow root filesystem: %w", err)
	}
	res.DiskBytes = size
	mounts := []struct {
		src, dir, fstype, data string
		flags                  uintptr
	}{
		{"proc", "proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"sysfs", "sys", "sysfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"devtmpfs", "dev", "devtmpfs", "mode=0755", unix.MS_NOSUID},
		{"devpts", "dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"tmpfs", "dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "run", "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV},
	}
	for _, m := range mounts {
		dir := filepath.Join(newRoot, m.dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create mount point /%s: %w", m.dir, err)
		}
		if err := unix.Mount(m.src, dir, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount /%s: %w", m.dir, err)
		}
	}
	// /dev/ptmx must be the new devpts instance's, so ptys work inside.
	ptmx := filepath.Join(newRoot, "dev/ptmx")
	os.Remove(ptmx)
	if err := os.Symlink("pts/ptmx", ptmx); err != nil {
		return fmt.Errorf("link /dev/ptmx: %w", err)
	}
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
	writeHostname(req.Hostname)
	if err := setupNetwork(req.Network); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// growFS resizes the ext4 filesystem mounted at dir to fill dev, whose size
// is the sandbox's disk limit, and returns that size.
func growFS(dev, dir string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		return 0, fmt.Errorf("size of %s: %w", dev, e)
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

// writeHostname makes /etc/hosts resolve the hostname, as tools expect.
func writeHostname(name string) {
	if name == "" {
		return
	}
	os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644)
	b, err := os.ReadFile("/etc/hosts")
	if err == nil && strings.Contains(string(b), " "+name+"\n") {
		return
	}
	f, err := os.OpenFile("/etc/hosts", os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	if len(b) == 0 {
		fmt.Fprintf(f, "127.0.0.1 localhost\n::1 localhost\n")
	}
	fmt.Fprintf(f, "127.0.1.1 %s\n", name)
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
