// Package vm runs sandbox VMs: QEMU's microvm machine with a virtio disk, a
// virtio-serial port for the guest agent and a virtio RNG, controlled over
// QMP. It knows nothing of sandboxes or agents; it starts, watches and stops
// one QEMU process and cleans up after it.
//
// A machine's files live in its directory (see the *Name constants), and
// QEMU's process ID is recorded there, so a QEMU started with Config.Detach
// can be adopted by a later process (Adopt) after the one that started it
// has gone.
//
// A machine can be paused and resumed, and its state saved to a file
// (SaveState) and restored into a new QEMU started with Config.Incoming
// (RestoreState), through QEMU's migration to and from a file.
package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlockhq/airlock/internal/cgroup"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/jail"
)

// Accel is a QEMU accelerator.
type Accel string

// Accelerators.
const (
	AccelKVM Accel = "kvm"
	AccelTCG Accel = "tcg"
)

// Files a machine keeps in its directory.
const (
	AgentSocketName = "agent.sock"
	QMPSocketName   = "qmp.sock"
	// NetSocketName is the network device's stream socket, which QEMU
	// serves and the sandbox's gateway connects to.
	NetSocketName = "net.sock"
	// AuxSocketName is the auxiliary port's socket (Config.AuxPort).
	AuxSocketName  = "aux.sock"
	ConsoleLogName = "console.log"
	QEMULogName    = "qemu.log"
	// PIDFileName holds QEMU's process ID, in decimal.
	PIDFileName = "qemu.pid"
)

// AuxPortName is the name of the auxiliary virtio-serial port
// (Config.AuxPort), by which the guest finds it in
// /sys/class/virtio-ports/*/name.
const AuxPortName = "airlock.aux"

// rootDrive is the QEMU drive ID of the root disk.
const rootDrive = "root"

// netDev is the QEMU netdev ID of the network device.
const netDev = "net0"

// maxSocketPath is the longest unix socket path the kernel accepts.
const maxSocketPath = 107

// Config describes one VM. It is stored as JSON (a sandbox keeps it to
// start its VM again with the same command line), hence the tags.
type Config struct {
	// QEMU is the qemu-system-x86_64 binary; empty means look it up in PATH.
	QEMU string `json:"qemu,omitempty"`
	// Kernel is the uncompressed ELF kernel (booted through PVH).
	Kernel string `json:"kernel"`
	// Initramfs is the initramfs holding the guest agent.
	Initramfs string `json:"initramfs"`
	// Accel is the accelerator: AccelKVM or AccelTCG.
	Accel Accel `json:"accel"`
	// VCPUs is the number of virtual CPUs, at least 1.
	VCPUs int `json:"vcpus"`
	// MemoryMiB is the guest's memory in MiB, at least 64.
	MemoryMiB int `json:"memory_mib"`
	// Disk is the root disk, a qcow2 image; empty means no disk.
	Disk string `json:"disk,omitempty"`
	// Backing is the chain of images under Disk, nearest first, as the
	// server made it (a warm snapshot's layer, the template image). A
	// jailed QEMU sees these and no other image: the chain is never read
	// back from the qcow2 headers, which the VM's user can rewrite.
	// Required for a jailed VM with a disk.
	Backing []string `json:"backing,omitempty"`
	// Dir holds the VM's sockets and logs. It must exist.
	Dir string `json:"dir"`
	// KernelArgs are appended to the kernel command line.
	KernelArgs string `json:"kernel_args,omitempty"`
	// Detach lets QEMU outlive the process that started it. Otherwise QEMU
	// is killed when its parent dies.
	Detach bool `json:"detach,omitempty"`
	// CPU is the -cpu model under KVM; empty means "host". TCG always uses
	// "max".
	CPU string `json:"cpu,omitempty"`
	// TSCKHz is the TSC rate in kHz that a TCG guest's kernel is told
	// (tsc_early_khz); 0 means HostTSCKHz() at start. Recording it keeps
	// the command line of a restarted VM identical. Unused under KVM.
	TSCKHz int `json:"tsc_khz,omitempty"`
	// Incoming starts QEMU without running the guest: it waits, paused,
	// for RestoreState (-incoming defer). The device set must then be the
	// one the state was saved with.
	Incoming bool `json:"incoming,omitempty"`
	// MemoryFile, when set, backs the guest's RAM with this file
	// (memory-backend-file) instead of anonymous memory. It must be an
	// absolute path; QEMU creates the file if it is missing.
	MemoryFile string `json:"memory_file,omitempty"`
	// MemoryShared maps MemoryFile shared (share=on): the guest's writes
	// reach the file, as for a template VM whose RAM is to be saved in
	// place. Otherwise the mapping is private (share=off): pages are
	// copied on write and the file never changes, as for a clone of a
	// template. It requires MemoryFile.
	MemoryShared bool `json:"memory_shared,omitempty"`
	// NetMAC, when set, gives the VM a virtio-net NIC with this hardware
	// address whose frames go over the stream socket NetSocketName in Dir
	// (QEMU serves it; one peer at a time, and a new one may connect when
	// the last has gone). Empty means no NIC.
	NetMAC string `json:"net_mac,omitempty"`
	// AuxPort gives the VM a second virtio-serial port, AuxPortName, on
	// the agent's bus, whose other end is the stream socket AuxSocketName
	// in Dir (QEMU serves it, one peer at a time): a byte stream from the
	// guest to the host with nothing of airlock on it, for the bench to
	// measure the transport by. It changes the device set, so a VM
	// restored from a state saved without it must not have it.
	AuxPort bool `json:"aux_port,omitempty"`
	// Jail, when set, runs QEMU confined (see Jail); nil runs it as this
	// process's user with nothing taken away.
	Jail *Jail `json:"jail,omitempty"`
	// Cgroup, when set, receives a jailed QEMU's process before QEMU
	// runs (the jail stage waits for it); it is not used without Jail.
	Cgroup Placer `json:"-"`
}

// Placer puts a process into a group that limits it, such as a cgroup.
type Placer interface {
	Add(pid int) error
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	var errs []error
	if c.Kernel == "" || c.Initramfs == "" {
		errs = append(errs, errors.New("kernel and initramfs are required"))
	}
	if c.Accel != AccelKVM && c.Accel != AccelTCG {
		errs = append(errs, fmt.Errorf("accelerator %q is not kvm or tcg", c.Accel))
	}
	if c.VCPUs < 1 {
		errs = append(errs, fmt.Errorf("vcpus %d must be at least 1", c.VCPUs))
	}
	if c.MemoryMiB < 64 {
		errs = append(errs, fmt.Errorf("memory %d MiB must be at least 64", c.MemoryMiB))
	}
	if c.TSCKHz < 0 {
		errs = append(errs, fmt.Errorf("tsc rate %d kHz must not be negative", c.TSCKHz))
	}
	if c.MemoryFile != "" && !filepath.IsAbs(c.MemoryFile) {
		errs = append(errs, fmt.Errorf("memory file %q is not an absolute path", c.MemoryFile))
	}
	if c.MemoryShared && c.MemoryFile == "" {
		errs = append(errs, errors.New("shared memory needs a memory file"))
	}
	if c.NetMAC != "" {
		if _, err := net.ParseMAC(c.NetMAC); err != nil || strings.ContainsRune(c.NetMAC, ',') {
			errs = append(errs, fmt.Errorf("network MAC %q is not a hardware address", c.NetMAC))
		}
	}
	if c.Jail != nil && (c.Jail.UID <= 0 || c.Jail.GID <= 0) {
		errs = append(errs, fmt.Errorf("jail user %d and group %d must not be root", c.Jail.UID, c.Jail.GID))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("dir is required"))
	} else if p := filepath.Join(c.Dir, AgentSocketName); len(p) > maxSocketPath {
		errs = append(errs, fmt.Errorf("socket path %s is longer than %d bytes: use a shorter AIRLOCK_HOME", p, maxSocketPath))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vm config: %w: %w", err, errdefs.ErrInvalid)
	}
	return nil
}

// Machine is a running QEMU process: one this process started (Start) or
// one it adopted (Adopt).
type Machine struct {
	cfg  Config // of an adopted machine, only Dir is known
	log  *slog.Logger
	proc *os.Process
	qmp  *QMP // nil when an adopted QEMU's QMP socket could not be reached

	done    chan struct{} // closed when QEMU has exited (and, for a child, been reaped)
	exitErr error         // how QEMU exited; read after done

	stopOnce    sync.Once
	releaseOnce sync.Once
	released    chan struct{} // closed by Release; ends the watch on an adopted QEMU
	pidfd       *os.File      // watched for an adopted QEMU's exit; nil when polling /proc

	pid         int           // QEMU's process ID, kept: releasing proc clears its own
	adopted     bool          // started by another process: proc is os.FindProcess's handle
	releaseProc func()        // lets go of an adopted proc's handle, once
	console     net.Conn      // the console socket, copied into the console log; nil if unreachable
	consoleDone chan struct{} // closed when the copy has ended
	life        *os.File      // the write end of a jailed QEMU's life pipe (fdLife); closed once it has exited
}

// kernelArgs boot quietly to the agent: the console only shows warnings,
// and a panic resets the VM, which -no-reboot turns into QEMU exiting.
const kernelArgs = "console=ttyS0 quiet loglevel=4 panic=-1 reboot=t random.trust_cpu=on"

// The descriptors QEMU is started with, after stdin, stdout and stderr:
// its sockets, made by Start (so that a jailed QEMU need not write its
// directory), and the sealed memory of a jailed clone.
const (
	fdQMP = 3 + iota
	fdAgent
	fdConsole
	fdNet
	fdMemory
	fdSync // the jail stage's go-ahead; closed before QEMU runs
	// fdAux is the auxiliary port's socket (Config.AuxPort); after the
	// others, so that their numbers, and the recorded VMs' command
	// lines, stay as they were.
	fdAux
	// fdLife is the read end of the pipe by which a jailed QEMU that
	// must die with this process sees it alive (jail.Spec.LifeFD).
	fdLife
	fdCount
)

// Args returns QEMU's command line for cfg.
func Args(cfg Config) []string {
	// The translation cache is capped (QEMU 7.2 gives it up to 1 GiB,
	// which a busy guest fills), so that a VM's memory is bounded
	// (cgroup.ForVM).
	accel := []string{"-accel", fmt.Sprintf("tcg,thread=multi,tb-size=%d", cgroup.TCGCacheMiB), "-cpu", "max"}
	cmdline := kernelArgs
	if cfg.Accel == AccelKVM {
		cpu := cfg.CPU
		if cpu == "" {
			cpu = "host"
		}
		accel = []string{"-accel", "kvm", "-cpu", cpu}
	} else {
		// Under TCG on a busy host the guest's PIT-based TSC calibration
		// fails, the TSC is marked unusable, and boot hangs waiting for
		// jiffies that never advance. The TSC runs at the host's rate, so
		// tell the guest that rate instead of letting it measure.
		khz := cfg.TSCKHz
		if khz == 0 {
			khz = HostTSCKHz()
		}
		if khz > 0 {
			cmdline += fmt.Sprintf(" tsc_early_khz=%d tsc=reliable", khz)
		}
	}
	args := []string{
		// The name ties the process to its directory (isQEMUOf).
		"-name", "guest=" + optValue(cfg.Dir),
		"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=off",
	}
	args = append(args, accel...)
	if cfg.MemoryFile != "" {
		share, path := "off", cfg.MemoryFile
		if cfg.MemoryShared {
			share = "on"
		} else if cfg.Jail != nil {
			path = fmt.Sprintf("/proc/self/fd/%d", fdMemory)
		}
		args = append(args,
			"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", cfg.MemoryMiB, optValue(path), share),
			"-machine", "memory-backend=mem",
		)
	}
	args = append(args,
		"-m", strconv.Itoa(cfg.MemoryMiB),
		"-smp", strconv.Itoa(cfg.VCPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", cfg.Kernel,
		"-initrd", cfg.Initramfs,
		"-append", strings.TrimSpace(cmdline+" "+cfg.KernelArgs),
		"-chardev", fmt.Sprintf("socket,id=console,fd=%d,server=on,wait=off", fdConsole),
		"-serial", "chardev:console",
	)
	if cfg.Disk != "" {
		args = append(args,
			"-drive", "id="+rootDrive+",file="+optValue(cfg.Disk)+",format=qcow2"+BackingOpts(cfg.Backing)+
				",if=none,discard=unmap,detect-zeroes=unmap",
			"-device", "virtio-blk-device,drive="+rootDrive,
		)
	}
	// Port 0 of the bus is kept for a console, so the agent's port is 1
	// and the auxiliary port 2.
	ports := 2
	if cfg.AuxPort {
		ports = 3
	}
	args = append(args,
		"-device", fmt.Sprintf("virtio-serial-device,max_ports=%d", ports),
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", fdAgent),
		"-device", "virtserialport,chardev=agent,name=airlock.agent",
	)
	if cfg.AuxPort {
		args = append(args,
			"-chardev", fmt.Sprintf("socket,id=aux,fd=%d,server=on,wait=off", fdAux),
			"-device", "virtserialport,chardev=aux,name="+AuxPortName,
		)
	}
	if cfg.NetMAC != "" {
		args = append(args,
			"-netdev", fmt.Sprintf("stream,id=%s,server=on,addr.type=fd,addr.str=%d", netDev, fdNet),
			"-device", "virtio-net-device,netdev="+netDev+",mac="+cfg.NetMAC,
		)
	}
	args = append(args,
		"-object", "rng-random,id=rng,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng",
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", fdQMP),
		"-mon", "chardev=qmp,mode=control",
	)
	if cfg.Jail != nil {
		args = append(args, seccompArgs...)
	}
	if cfg.Incoming {
		// -S keeps the guest paused after the restore whatever state it
		// was saved in, for the caller to Resume.
		args = append(args, "-S", "-incoming", "defer")
	}
	return args
}

// optValue escapes a value for QEMU's option syntax, where a comma ends
// the value unless doubled.
func optValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// backingOpts names the images under the root disk to QEMU, nearest first
// (qcow2 layers, the raw template image last), as QEMU's block options
// after the disk's own (",backing.driver=…"), so that QEMU and qemu-img
// open the chain the server recorded and never the one the disk's qcow2
// header names; "" when none is recorded.
func BackingOpts(chain []string) string {
	var b strings.Builder
	prefix := ""
	for i, f := range chain {
		prefix += "backing."
		driver := "qcow2"
		if i == len(chain)-1 {
			driver = "raw"
		}
		fmt.Fprintf(&b, ",%sdriver=%s,%sfile.driver=file,%sfile.filename=%s", prefix, driver, prefix, prefix, optValue(f))
	}
	return b.String()
}

// Start launches QEMU and connects to its QMP socket. The VM's lifetime is
// not tied to ctx, which bounds only the start itself.
func Start(ctx context.Context, cfg Config, log *slog.Logger) (*Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin := cfg.QEMU
	if bin == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return nil, fmt.Errorf("qemu-system-x86_64 is not installed: run `airlock setup` as root: %w", errdefs.ErrPrecondition)
		}
		bin = p
	}
	for _, f := range []string{cfg.Kernel, cfg.Initramfs} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("boot artifact %s is missing: run `airlock setup`: %w", f, errdefs.ErrPrecondition)
		}
	}
	// Stale sockets of an earlier machine in the same directory would be
	// mistaken for ours.
	removeFiles(cfg.Dir, socketNames...)

	logFile, err := os.OpenFile(filepath.Join(cfg.Dir, QEMULogName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create qemu log: %w", err)
	}
	defer logFile.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devNull.Close()
	files := make([]*os.File, fdCount)
	files[0], files[1], files[2] = devNull, logFile, logFile
	defer func() {
		for _, f := range files[fdQMP:] {
			if f != nil && f != files[fdMemory] {
				f.Close()
			}
		}
	}()
	socks := map[int]string{fdQMP: QMPSocketName, fdAgent: AgentSocketName, fdConsole: ConsoleSocketName}
	if cfg.NetMAC != "" {
		socks[fdNet] = NetSocketName
	}
	if cfg.AuxPort {
		socks[fdAux] = AuxSocketName
	}
	for fd, name := range socks {
		if files[fd], err = listenFile(filepath.Join(cfg.Dir, name)); err != nil {
			removeFiles(cfg.Dir, socketNames...)
			return nil, err
		}
	}
	// Connected before QEMU runs, the console loses none of the boot.
	console, consoleDone := dialConsole(cfg.Dir)
	if console == nil {
		removeFiles(cfg.Dir, socketNames...)
		return nil, errors.New("connect to the console socket")
	}
	fail := func(err error) (*Machine, error) {
		console.Close()
		removeFiles(cfg.Dir, socketNames...)
		return nil, err
	}

	sys := &syscall.SysProcAttr{Setpgid: true} // a terminal's ^C must not reach QEMU
	if !cfg.Detach {
		sys.Pdeathsig = syscall.SIGKILL
	}
	exe, argv, env := bin, append([]string{bin}, Args(cfg)...), []string(nil)
	var goAhead *os.File // the jail stage waits on it
	var life *os.File    // held until QEMU ends, when it must die with this process
	if cfg.Jail != nil {
		if cfg.MemoryFile != "" && !cfg.MemoryShared {
			if files[fdMemory], err = sealedMemory(cfg.MemoryFile); err != nil {
				return fail(err)
			}
		}
		spec, err := prepareJail(cfg, bin, argv)
		if err != nil {
			return fail(err)
		}
		if files[fdSync], goAhead, err = os.Pipe(); err != nil {
			return fail(err)
		}
		defer goAhead.Close()
		spec.SyncFD = fdSync
		if !cfg.Detach {
			if files[fdLife], life, err = os.Pipe(); err != nil {
				return fail(err)
			}
			spec.LifeFD = fdLife
		}
		js, err := json.Marshal(spec)
		if err != nil {
			return fail(err)
		}
		// This binary, whichever file it was started from.
		exe, argv, env = "/proc/self/exe", []string{"airlock-vm-jail"}, []string{jail.Env + "=" + string(js)}
		sys.Cloneflags = jail.Namespaces
	}
	proc, err := os.StartProcess(exe, argv, &os.ProcAttr{Dir: cfg.Dir, Env: env, Files: files, Sys: sys})
	if err != nil {
		if life != nil {
			life.Close()
		}
		return fail(fmt.Errorf("start qemu: %w", err))
	}
	m := &Machine{cfg: cfg, log: log, proc: proc, pid: proc.Pid, done: make(chan struct{}), released: make(chan struct{}),
		console: console, consoleDone: consoleDone, life: life}
	go m.wait()
	abort := func(err error) (*Machine, error) {
		m.Kill()
		<-m.done
		console.Close()
		removeFiles(cfg.Dir, socketNames...)
		return nil, err
	}
	if cfg.Jail != nil {
		if cfg.Cgroup != nil {
			if err := cfg.Cgroup.Add(proc.Pid); err != nil {
				return abort(fmt.Errorf("place qemu in its cgroup: %w", err))
			}
		}
		if _, err := goAhead.Write([]byte{1}); err != nil {
			return abort(fmt.Errorf("start the jailed qemu%s", m.qemuLogTail()))
		}
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, PIDFileName), []byte(strconv.Itoa(proc.Pid)+"\n"), 0o600); err != nil {
		return abort(fmt.Errorf("record qemu pid: %w", err))
	}

	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		select {
		case <-m.done:
			cancel() // QEMU died: stop waiting for its socket
		case <-qctx.Done():
		}
	}()
	q, err := DialQMP(qctx, filepath.Join(cfg.Dir, QMPSocketName))
	if err != nil {
		// QEMU failing at start usually says why in its log as it exits.
		select {
		case <-m.done:
		case <-time.After(2 * time.Second):
		}
		m.Kill()
		<-m.done
		if tail := m.qemuLogTail(); tail != "" {
			return nil, fmt.Errorf("qemu failed to start%s", tail)
		}
		return nil, err
	}
	m.qmp = q
	log.Debug("vm started", "pid", proc.Pid, "accel", cfg.Accel, "jailed", cfg.Jail != nil)
	return m, nil
}

// socketNames are the sockets Start makes in a VM's directory.
var socketNames = []string{AgentSocketName, QMPSocketName, NetSocketName, ConsoleSocketName, AuxSocketName}

// listenFile makes a listening unix socket at path, private to this
// process's user, and returns it as a file to pass to QEMU. The socket
// stays at path after this process lets go of it.
func listenFile(path string) (*os.File, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("make socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, err
	}
	return l.File()
}

// prepareJail readies cfg's files for its jail and returns the jail
// stage's spec.
func prepareJail(cfg Config, bin string, argv []string) (jail.Spec, error) {
	if cfg.MemoryShared {
		// The jail binds the file in: it must exist, and QEMU sizes it.
		f, err := os.OpenFile(cfg.MemoryFile, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return jail.Spec{}, err
		}
		f.Close()
	}
	if err := ownByJail(cfg); err != nil {
		return jail.Spec{}, err
	}
	if err := os.Mkdir(filepath.Join(cfg.Dir, jailRootName), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return jail.Spec{}, err
	}
	return jailSpecFor(cfg, bin, argv)
}

// wait reaps QEMU, this process's child. It returns when QEMU has exited.
func (m *Machine) wait() {
	st, err := m.proc.Wait()
	switch {
	case err != nil:
		m.exitErr = err
	case !st.Success():
		m.exitErr = fmt.Errorf("qemu %s%s", st, m.qemuLogTail())
	}
	if m.life != nil {
		m.life.Close()
	}
	close(m.done)
}

func (m *Machine) qemuLogTail() string {
	b, err := os.ReadFile(filepath.Join(m.cfg.Dir, QEMULogName))
	if err != nil || len(b) == 0 {
		return ""
	}
	return ": " + strings.TrimSpace(tail(string(b), 2000))
}

// PID is QEMU's process ID.
func (m *Machine) PID() int { return m.pid }

// AgentSocket is the unix socket connected to the guest agent's port.
func (m *Machine) AgentSocket() string { return filepath.Join(m.cfg.Dir, AgentSocketName) }

// NetSocket is the unix socket of the VM's network device (when its
// configuration has NetMAC).
func (m *Machine) NetSocket() string { return filepath.Join(m.cfg.Dir, NetSocketName) }

// AuxSocket is the unix socket of the VM's auxiliary port (when its
// configuration has AuxPort): what the guest writes to that port can be
// read from it.
func (m *Machine) AuxSocket() string { return filepath.Join(m.cfg.Dir, AuxSocketName) }

// Done is closed once QEMU has exited.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Exited reports whether QEMU has exited.
func (m *Machine) Exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// ExitError describes how QEMU exited (nil for a clean exit, which is also
// how a guest panic or poweroff ends). Only QEMU's parent learns its exit
// status, so for an adopted machine it can only say that QEMU exited. It
// blocks until Done is closed.
func (m *Machine) ExitError() error {
	<-m.done
	return m.exitErr
}

// ConsoleTail returns up to max bytes of the end of the guest's console.
func (m *Machine) ConsoleTail(max int) string { return consoleTail(m.cfg.Dir, max) }

// GuestPanicked reports whether the console shows a kernel panic.
func (m *Machine) GuestPanicked() bool {
	return hasPanic(m.ConsoleTail(64 << 10))
}

func tail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[len(s)-max:]
	if i := strings.IndexByte(s, '\n'); i >= 0 && i < len(s)-1 {
		s = s[i+1:]
	}
	return s
}

// Kill ends QEMU at once with SIGKILL. It does nothing once QEMU has
// exited, so a recycled process ID is never signalled.
func (m *Machine) Kill() {
	if m.Exited() {
		return
	}
	m.proc.Signal(syscall.SIGKILL)
}

// Stop ends the VM: QEMU is asked to quit, and killed if it has not exited
// when ctx ends or after two seconds. Its sockets and pid file are removed;
// its logs stay for the caller to read or remove with the directory.
func (m *Machine) Stop(ctx context.Context) error {
	m.stopOnce.Do(func() {
		if m.qmp != nil && !m.Exited() {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			m.qmp.Execute(qctx, "quit", nil, nil)
			cancel()
		}
		select {
		case <-m.done:
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
		m.Kill()
		<-m.done
		if m.qmp != nil {
			m.qmp.Close()
		}
		m.endConsole(time.Second)
		removeFiles(m.cfg.Dir, append(socketNames, PIDFileName, jailRootName)...)
	})
	return nil
}

// endConsole waits up to grace for the console copy to take the last of
// what QEMU wrote, then ends it.
func (m *Machine) endConsole(grace time.Duration) {
	if m.console == nil {
		return
	}
	select {
	case <-m.consoleDone:
	case <-time.After(grace):
	}
	m.console.Close()
	<-m.consoleDone
}

// Release lets go of the machine without stopping it, as a process does
// that leaves a detached VM to a later one: the QMP connection is closed
// (QEMU serves one QMP client at a time) and the watch on an adopted QEMU
// ends, after which its Done never closes. The Machine must not be used
// after Release.
func (m *Machine) Release() {
	m.releaseOnce.Do(func() {
		close(m.released)
		if m.qmp != nil {
			m.qmp.Close()
		}
		if m.console != nil {
			m.console.Close() // QEMU takes the next process's connection
			<-m.consoleDone
		}
		if m.pidfd != nil {
			m.pidfd.Close() // wakes the watcher
		}
		if m.adopted && !m.Exited() {
			// The watcher returns without exited: the handle
			// os.FindProcess opened goes here.
			m.releaseProc()
		}
	})
}

func removeFiles(dir string, names ...string) {
	for _, n := range names {
		os.Remove(filepath.Join(dir, n))
	}
}

// HostTSCKHz returns the host's TSC frequency in kHz as the kernel reports
// it in /proc/cpuinfo ("cpu MHz"), or 0 when it cannot be read.
func HostTSCKHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0
		}
		return int(mhz*1000 + 0.5)
	}
	return 0
}
