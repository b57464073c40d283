package agentproto

import (
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/textcheck"
	"github.com/airlockhq/airlock/internal/timings"
)

// Operations a Request may name.
const (
	OpPing   = "ping"
	OpInit   = "init"
	OpExec   = "exec"
	OpSignal = "signal"
	OpResize = "resize"
	// OpAttach joins a process an exec started, possibly in an earlier
	// session: the guest answers like exec after the start (MsgStarted, the
	// output from the requested offset, MsgExit), and MsgStdin and MsgEOF
	// go to the process as on its exec stream.
	OpAttach = "attach"
	OpRead   = "read"
	OpWrite  = "write"
	OpStat   = "stat"
	OpList   = "list"
	OpMkdir  = "mkdir"
	OpMove   = "move"
	OpRemove = "remove"
	OpTarOut = "tar_out"
	OpTarIn  = "tar_in"
	// OpRefresh brings an initialised guest up to date after it was paused
	// or restored from a saved state: its clock, and fresh entropy that
	// makes its random numbers diverge from any other restore of the same
	// state.
	OpRefresh = "refresh"
	// OpFreeze freezes the guest's root filesystem (FIFREEZE): its dirty
	// data and journal are written to the disk, which then stays as it is
	// until OpThaw or the request's deadline, whichever comes first;
	// writers in the guest wait meanwhile, readers do not. A freeze while
	// frozen is CodeState.
	OpFreeze = "freeze"
	// OpThaw ends a freeze (FITHAW). Thawing a guest that is not frozen
	// does nothing; the result says whether a freeze was ended and
	// whether the last one had ended at its deadline instead.
	OpThaw = "thaw"
	// OpSync writes the guest's dirty data and journal to its disk
	// (sync(2)), so that the disk at rest holds what was written before.
	OpSync = "sync"
	// OpReinit gives an initialised guest restored from a warm template
	// snapshot (see InitRequest.Placeholder) the identity of the sandbox
	// it now is, in place of the template VM's: the host's clock, fresh
	// entropy with the kernel's random generator reseeded, the sandbox's
	// hostname and gateway CA, its default environment, and its root
	// filesystem grown to the disk's new size. The root stays mounted and
	// every process runs on. It answers an InitResult.
	OpReinit = "reinit"
	// OpStats measures the guest now: CPUs and their use over a short
	// window, memory, and its root filesystem. It answers a StatsResult.
	OpStats = "stats"
)

// StatsResult is what the guest uses now.
type StatsResult struct {
	// CPUCount is the number of online CPUs; CPUUsedPct their busy share
	// over StatsWindow, 0 to 100.
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	// MemTotalBytes is the memory the kernel manages; MemUsedBytes what is
	// not available to new work (total less MemAvailable); MemCacheBytes
	// the page cache.
	MemTotalBytes int64 `json:"mem_total_bytes"`
	MemUsedBytes  int64 `json:"mem_used_bytes"`
	MemCacheBytes int64 `json:"mem_cache_bytes"`
	// DiskTotalBytes and DiskUsedBytes are the root filesystem's size and
	// what is in use (statfs: blocks less free blocks).
	DiskTotalBytes int64 `json:"disk_total_bytes"`
	DiskUsedBytes  int64 `json:"disk_used_bytes"`
}

// StatsWindow is how long OpStats watches the CPUs.
const StatsWindow = 200 * time.Millisecond

// Request opens every stream. Op selects which of the other fields apply.
type Request struct {
	Op     string       `json:"op"`
	Init   *InitRequest `json:"init,omitempty"`
	Exec   *ExecRequest `json:"exec,omitempty"`
	Signal *SignalReq   `json:"signal,omitempty"`
	Resize *ResizeReq   `json:"resize,omitempty"`
	Attach *AttachReq   `json:"attach,omitempty"`
	// Refresh is the refresh operation's parameters.
	Refresh *RefreshRequest `json:"refresh,omitempty"`
	// Freeze is the freeze operation's parameters.
	Freeze *FreezeRequest `json:"freeze,omitempty"`
	// Reinit is the reinit operation's parameters.
	Reinit *ReinitRequest `json:"reinit,omitempty"`
	// Path is the file operations' subject, absolute inside the sandbox.
	Path string `json:"path,omitempty"`
	// To is the destination of a move.
	To string `json:"to,omitempty"`
	// Mode is the permission bits of a written file (0 means 0644).
	Mode uint32 `json:"mode,omitempty"`
	// Depth bounds a list: 1 lists the directory's entries only.
	Depth int `json:"depth,omitempty"`
	// Recursive lets remove delete a directory and what it holds.
	Recursive bool `json:"recursive,omitempty"`
	// Metadata is the file metadata a write gives the file (see
	// MetadataXattrPrefix), set on the new file before it takes the
	// path's place; the file replaced keeps its own. The write's result
	// then holds the file's Stat with the metadata set, which tells the
	// host that the agent kept it.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// InitRequest prepares a freshly booted guest to run the sandbox.
type InitRequest struct {
	// Hostname of the guest.
	Hostname string `json:"hostname"`
	// TimeUnixNano is the host's clock when the request was sent.
	TimeUnixNano int64 `json:"time_unix_nano"`
	// Entropy is mixed into the guest kernel's random pool.
	Entropy []byte `json:"entropy"`
	// Env is the default environment of every process.
	Env map[string]string `json:"env,omitempty"`
	// RootDevice is the block device holding the root filesystem.
	RootDevice string `json:"root_device"`
	// Network configures the guest's network interface; nil leaves only
	// loopback up, as for a VM without a NIC.
	Network *NetworkConfig `json:"network,omitempty"`
	// Placeholder marks the init of a template VM whose state becomes a
	// warm snapshot: Hostname and the network's CA are stand-ins, which
	// the reinit of every clone replaces by its own. Until a reinit, ping
	// answers Placeholder.
	Placeholder bool `json:"placeholder,omitempty"`
}

// ReinitRequest makes a guest restored from a warm template snapshot the
// sandbox it is a clone of (OpReinit).
type ReinitRequest struct {
	// Hostname of the guest: it replaces the one init (or the last
	// reinit) set, in the kernel, HostnameFile and HostsFile.
	Hostname string `json:"hostname"`
	// TimeUnixNano is the host's clock when the request was sent.
	TimeUnixNano int64 `json:"time_unix_nano"`
	// Entropy is mixed into the guest kernel's random pool, which is then
	// reseeded.
	Entropy []byte `json:"entropy"`
	// Env is the default environment of every process started from now
	// on; processes running already keep theirs.
	Env map[string]string `json:"env,omitempty"`
	// CACert is the PEM certificate of the sandbox's gateway CA. It
	// replaces the one init (or the last reinit) added to the trust
	// store; empty leaves the trust store alone.
	CACert []byte `json:"ca_cert,omitempty"`
	// DiskBytes is the size the host resized the root disk to. The guest
	// learns of a resize asynchronously: the agent waits until its kernel
	// sees the disk that large, then grows the root filesystem to fill
	// it. 0 grows it to whatever size the disk has.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// Placeholder keeps the identity a placeholder (as
	// InitRequest.Placeholder): a warm pool's member runs a reinit to warm
	// its VM up before any sandbox's identity is given to it.
	Placeholder bool `json:"placeholder,omitempty"`
}

// maxHostname is the longest hostname the kernel takes (HOST_NAME_MAX).
const maxHostname = 64

// Validate checks the request before anything changes.
func (r *ReinitRequest) Validate() error {
	switch {
	case len(r.Hostname) > maxHostname:
		return fmt.Errorf("hostname is longer than %d bytes", maxHostname)
	case strings.ContainsAny(r.Hostname, " \t\n\x00"):
		return fmt.Errorf("hostname %q contains a space, a newline or a NUL byte", r.Hostname)
	case r.DiskBytes < 0:
		return fmt.Errorf("disk size %d must not be negative", r.DiskBytes)
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("invalid environment variable %q", k)
		}
	}
	return nil
}

// NetworkConfig is the guest's one network interface, whose other end is
// the host's gateway: its address, route and resolver, and the
// certificate of the CA with which the gateway terminates TLS for hosts
// that carry credentials, which the guest's trust store gains.
type NetworkConfig struct {
	// MAC names the interface by its hardware address.
	MAC string `json:"mac"`
	// Address is the guest's IPv4 address with its prefix ("10.0.2.15/24").
	Address string `json:"address"`
	// Gateway is the default route's next hop and the guest's resolver.
	Gateway string `json:"gateway"`
	// MTU of the interface; 0 keeps the driver's.
	MTU int `json:"mtu,omitempty"`
	// CACert is a PEM certificate added to the guest's trust store; empty
	// adds none.
	CACert []byte `json:"ca_cert,omitempty"`
}

// RefreshRequest sets a running guest's clock and reseeds its random
// number generator.
type RefreshRequest struct {
	// TimeUnixNano is the host's clock when the request was sent; 0 leaves
	// the guest's clock alone.
	TimeUnixNano int64 `json:"time_unix_nano"`
	// Entropy is mixed into the guest kernel's random pool, which is then
	// reseeded.
	Entropy []byte `json:"entropy"`
}

// MaxFreeze bounds a freeze's deadline.
const MaxFreeze = time.Hour

// FreezeRequest freezes the guest's root filesystem.
type FreezeRequest struct {
	// TimeoutMS is how long the freeze may last, in milliseconds: the
	// guest thaws on its own then, so that a host that dies while its
	// guest is frozen does not leave it frozen for good. It counts the
	// guest's running time: a paused or suspended guest's freeze does not
	// run out meanwhile. It must be positive and at most MaxFreeze.
	TimeoutMS int64 `json:"timeout_ms"`
}

// Validate checks the request before anything is frozen.
func (f *FreezeRequest) Validate() error {
	if f.TimeoutMS <= 0 || f.TimeoutMS > MaxFreeze.Milliseconds() {
		return fmt.Errorf("freeze timeout %d ms: must be positive and at most %s", f.TimeoutMS, MaxFreeze)
	}
	return nil
}

// ThawResult answers a thaw.
type ThawResult struct {
	// Thawed is true when this thaw ended a freeze: the root filesystem
	// stayed frozen from the freeze's answer until this thaw.
	Thawed bool `json:"thawed"`
	// Expired is true when the last freeze ended at its deadline, before
	// any thaw was asked for.
	Expired bool `json:"expired,omitempty"`
}

// InitResult describes the guest after init or reinit.
type InitResult struct {
	Kernel    string `json:"kernel"`
	DiskBytes int64  `json:"disk_bytes"`
	// Warnings are what init could not do and went on without: files of
	// the sandbox it could not write, optional mounts it could not make.
	Warnings []string `json:"warnings,omitempty"`
	// Timings break down how long the guest's own part of an init or a
	// reinit took, in the order its parts ran.
	Timings timings.Timings `json:"timings,omitempty"`
}

// PTY asks for a terminal of the given size.
type PTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecRequest starts a process.
type ExecRequest struct {
	// Argv is the program and its arguments; exclusive with Cmd.
	Argv []string `json:"argv,omitempty"`
	// Cmd is a shell command run with /bin/sh -c; exclusive with Argv.
	// A template without /bin/sh runs argv only.
	Cmd string            `json:"cmd,omitempty"`
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
	// User is a name from the sandbox's /etc/passwd, or a numeric
	// "uid[:gid]", which needs no /etc/passwd. Empty means root.
	User string `json:"user,omitempty"`
	// Stdin true connects the process's stdin to the MsgStdin stream;
	// otherwise it reads /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	PTY   *PTY `json:"pty,omitempty"`
	// TimeoutMS, when positive, kills the process group with SIGKILL after
	// that many milliseconds.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// Validate checks the request before anything starts.
func (e *ExecRequest) Validate() error {
	switch {
	case len(e.Argv) > 0 && e.Cmd != "":
		return fmt.Errorf("give either argv or cmd, not both")
	case len(e.Argv) == 0 && e.Cmd == "":
		return fmt.Errorf("give a command: argv or cmd")
	case len(e.Argv) > 0 && e.Argv[0] == "":
		return fmt.Errorf("argv[0] is empty")
	case e.TimeoutMS < 0:
		return fmt.Errorf("timeout must not be negative")
	case e.PTY != nil && (e.PTY.Rows == 0 || e.PTY.Cols == 0):
		return fmt.Errorf("pty rows and cols must be positive")
	}
	for _, a := range append([]string{e.Cmd, e.Cwd, e.User}, e.Argv...) {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("arguments must not contain NUL bytes")
		}
	}
	if textcheck.Control(e.User) >= 0 {
		return fmt.Errorf("user %q holds a control character", e.User)
	}
	for k, v := range e.Env {
		if k == "" || strings.ContainsRune(k, '=') || textcheck.Control(k) >= 0 || strings.ContainsRune(v, 0) {
			return fmt.Errorf("invalid environment variable %q", k)
		}
	}
	if e.Cwd != "" {
		if err := CheckPath(e.Cwd); err != nil {
			return fmt.Errorf("cwd: %w", err)
		}
	}
	return nil
}

// Started reports a process that began running, or an attach that joined
// one.
type Started struct {
	// ID names the process for signal, resize and attach requests.
	ID  string `json:"id"`
	PID int    `json:"pid"`
	// Offset is the position in the process's output sequence of the first
	// output byte that follows on this stream. It is 0 for an exec. For an
	// attach it equals the requested offset, unless older output had already
	// been dropped: then it is larger, and the bytes in between are lost.
	Offset int64 `json:"offset,omitempty"`
}

// Exit reports how a process ended.
type Exit struct {
	// ExitCode is the process's exit status, or 128 plus the signal number
	// when a signal ended it.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the process ("KILL"), if any.
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out"`
	DurationMS int64  `json:"duration_ms"`
}

// SignalReq sends a signal to a process's group.
type SignalReq struct {
	ID     string `json:"id"`
	Signal string `json:"signal"`
}

// AttachReq joins a process's output, stdin and exit.
//
// A process's output sequence is the payloads of its MsgStdout and
// MsgStderr messages, in the order the guest sends them; an offset counts
// bytes of that sequence from 0. A host that lost its stream attaches again
// with the offset of the first byte it did not receive.
type AttachReq struct {
	// ID is the process's ID from Started.
	ID string `json:"id"`
	// Offset is where in the output sequence the stream resumes.
	Offset int64 `json:"offset"`
}

// ResizeReq changes a process's terminal size.
type ResizeReq struct {
	ID   string `json:"id"`
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Stat describes one file.
type Stat struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"` // file, dir, symlink, other
	SizeBytes  int64     `json:"size_bytes"`
	Mode       string    `json:"mode"` // octal permission bits, "0644"
	ModifiedAt time.Time `json:"modified_at"`
	// Target is a symlink's destination.
	Target string `json:"target,omitempty"`
	// Metadata is the file metadata found on the entry itself (a
	// symlink's own, which is none), bounded as BoundMetadata bounds it.
	// A read's stat leaves it out.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Result ends a request: either Error or the fields of the operation.
type Result struct {
	Error *Error       `json:"error,omitempty"`
	Init  *InitResult  `json:"init,omitempty"`
	Stat  *Stat        `json:"stat,omitempty"`
	Items []Stat       `json:"items,omitempty"`
	Pong  *PongResult  `json:"pong,omitempty"`
	Thaw  *ThawResult  `json:"thaw,omitempty"`
	Stats *StatsResult `json:"stats,omitempty"`
}

// PongResult answers a ping.
type PongResult struct {
	Initialized bool `json:"initialized"`
	// Placeholder is true while the guest has the stand-in identity of an
	// init with InitRequest.Placeholder: a template VM, or a clone of its
	// warm snapshot that no reinit has made a sandbox of yet.
	Placeholder bool `json:"placeholder,omitempty"`
}

// Error codes the agent reports.
const (
	CodeInvalid    = "invalid"
	CodeNotFound   = "not_found"
	CodeExists     = "exists"
	CodeIsDir      = "is_dir"
	CodeNotDir     = "not_dir"
	CodeNoSpace    = "no_space"
	CodePermission = "permission"
	CodeNotEmpty   = "not_empty"
	CodeState      = "state"
	CodeInternal   = "internal"
)

// Error is a failure the agent reports for a request.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// MaxPath bounds the length of a path in bytes.
const MaxPath = 4096

// CheckPath accepts an absolute, clean path without NUL bytes, other
// control characters or invalid UTF-8 (textcheck), and without ".."
// elements, which could only confuse what is meant.
func CheckPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("path is empty")
	case len(p) > MaxPath:
		return fmt.Errorf("path is longer than %d bytes", MaxPath)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path contains a NUL byte")
	case textcheck.Control(p) >= 0:
		return fmt.Errorf("path holds a control character or invalid UTF-8 at byte %d", textcheck.Control(p))
	case !path.IsAbs(p):
		return fmt.Errorf("path %q is not absolute", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return fmt.Errorf("path %q contains '..'", p)
		}
		if len(el) > 255 {
			return fmt.Errorf("a path element is longer than 255 bytes")
		}
	}
	return nil
}
