// Package apiv1 holds the JSON shapes of airlock's HTTP API, version 1, as
// the server writes them and clients read them. The contract they follow is
// docs/api.md; a change to a field name is a breaking change.
package apiv1

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/airlockhq/airlock/internal/timings"
)

// Error codes, each with one HTTP status.
const (
	CodeInvalidArgument   = "invalid_argument"   // 400
	CodeUnauthenticated   = "unauthenticated"    // 401
	CodePermissionDenied  = "permission_denied"  // 403
	CodeNotFound          = "not_found"          // 404
	CodeConflict          = "conflict"           // 409
	CodePayloadTooLarge   = "payload_too_large"  // 413
	CodeResourceExhausted = "resource_exhausted" // 429
	CodeInternal          = "internal"           // 500
	CodeUnavailable       = "unavailable"        // 503
)

// Error is the body of every failed call: {"error": {...}}.
type Error struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// ErrorBody wraps Error as the response body.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Status is a short error attached to an operation or a sandbox.
type Status struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// List is a page of items; NextPageToken is "" on the last page.
type List[T any] struct {
	Items         []T    `json:"items"`
	NextPageToken string `json:"next_page_token"`
}

// Operation kinds and statuses.
const (
	OpCreate  = "create"
	OpPause   = "pause"
	OpSuspend = "suspend"
	OpWake    = "wake"
	OpDelete  = "delete"
	OpBuild   = "build"
	// OpCheckpoint makes a checkpoint of a sandbox, OpFork a checkpoint
	// and sandboxes from it, OpRollback returns a sandbox to one of its
	// checkpoints.
	OpCheckpoint = "checkpoint"
	OpFork       = "fork"
	OpRollback   = "rollback"

	OpPending   = "pending"
	OpRunning   = "running"
	OpSucceeded = "succeeded"
	OpFailed    = "failed"
)

// Operation is an asynchronous lifecycle change.
type Operation struct {
	ID         string     `json:"id"`
	Kind       string     `json:"kind"`
	TargetID   string     `json:"target_id"`
	Status     string     `json:"status"`
	Error      *Status    `json:"error"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at"`
	// Timings break a create or a wake down into its steps, in the order
	// they ran, in milliseconds; together they add up to about the time
	// from CreatedAt to FinishedAt. Absent for other kinds, and while the
	// operation runs.
	Timings timings.Timings `json:"timings,omitempty"`
}

// Done reports whether the operation has finished.
func (o Operation) Done() bool { return o.Status == OpSucceeded || o.Status == OpFailed }

// Failure is the error of a failed operation, nil for any other: its
// kind, its target and the server's reason.
func (o Operation) Failure() error {
	if o.Status != OpFailed {
		return nil
	}
	msg := "no reason given"
	if o.Error != nil && o.Error.Message != "" {
		msg = o.Error.Message
	}
	return fmt.Errorf("%s %s failed: %s", o.Kind, o.TargetID, msg)
}

// Sandbox states.
const (
	StateCreating   = "creating"
	StateRunning    = "running"
	StatePaused     = "paused"
	StateSuspending = "suspending"
	StateSuspended  = "suspended"
	StateWaking     = "waking"
	StateDeleting   = "deleting"
	StateDeleted    = "deleted"
	StateFailed     = "failed"
)

// States lists every sandbox state.
var States = []string{StateCreating, StateRunning, StatePaused, StateSuspending, StateSuspended,
	StateWaking, StateDeleting, StateDeleted, StateFailed}

// CreateSandbox is the body of POST /v1/sandboxes.
type CreateSandbox struct {
	Template  string            `json:"template"`
	VCPUs     int               `json:"vcpus,omitempty"`
	MemoryMiB int               `json:"memory_mib,omitempty"`
	DiskMiB   int               `json:"disk_mib,omitempty"`
	TimeoutS  *int              `json:"timeout_s,omitempty"`
	OnTimeout string            `json:"on_timeout,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Network   json.RawMessage   `json:"network,omitempty"`
	// IdleS > 0 has the server suspend (or pause, see OnIdle) the sandbox
	// once nothing has used it for that many seconds; a call that needs
	// it running then wakes it (docs/api.md, "Idle sandboxes").
	IdleS *int `json:"idle_s,omitempty"`
	// OnIdle is "suspend" (the default) or "pause".
	OnIdle string `json:"on_idle,omitempty"`
	// WakeOnRequest, set by the E2B layer for lifecycle.autoResume, has
	// calls that need the sandbox running wake it, without idle_s. It
	// is no field of the native API.
	WakeOnRequest bool `json:"-"`
	// Checkpoint makes the sandbox from a checkpoint of another: its
	// memory, processes and disk, with an identity of its own. Template,
	// vCPUs and memory are then the checkpoint's.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// Checkpoint states.
const (
	CheckpointCreating = "creating"
	CheckpointReady    = "ready"
	CheckpointFailed   = "failed"
)

// Checkpoint is a sandbox's memory, devices and disk at one instant, kept
// apart from the sandbox (POST /v1/sandboxes/{id}/checkpoints).
type Checkpoint struct {
	ID        string      `json:"id"`
	SandboxID string      `json:"sandbox_id"`
	Name      string      `json:"name"`
	State     string      `json:"state"`
	Template  TemplateRef `json:"template"`
	VCPUs     int         `json:"vcpus"`
	MemoryMiB int         `json:"memory_mib"`
	DiskMiB   int         `json:"disk_mib"`
	SizeBytes int64       `json:"size_bytes"`
	CreatedAt time.Time   `json:"created_at"`
	LastError *Status     `json:"last_error"`
}

// CreateCheckpoint is the body of POST /v1/sandboxes/{id}/checkpoints.
type CreateCheckpoint struct {
	Name string `json:"name,omitempty"`
}

// CheckpointOperation answers a checkpoint's creation.
type CheckpointOperation struct {
	Checkpoint Checkpoint `json:"checkpoint"`
	Operation  Operation  `json:"operation"`
}

// Fork is the body of POST /v1/sandboxes/{id}/fork.
type Fork struct {
	Count    int               `json:"count"`
	TimeoutS *int              `json:"timeout_s,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// MaxForks bounds Fork.Count.
const MaxForks = 100

// Forked answers a fork: the sandboxes being made, and the fork's
// operation, which ends when the checkpoint they are made from does.
type Forked struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	Checkpoint string    `json:"checkpoint"`
	Operation  Operation `json:"operation"`
}

// Rollback is the body of POST /v1/sandboxes/{id}/rollback.
type Rollback struct {
	Checkpoint string `json:"checkpoint"`
}

// TemplateRef names the template a sandbox was made from.
type TemplateRef struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID        string      `json:"id"`
	State     string      `json:"state"`
	Template  TemplateRef `json:"template"`
	VCPUs     int         `json:"vcpus"`
	MemoryMiB int         `json:"memory_mib"`
	DiskMiB   int         `json:"disk_mib"`
	CreatedAt time.Time   `json:"created_at"`
	ExpiresAt *time.Time  `json:"expires_at"`
	OnTimeout string      `json:"on_timeout"`
	// IdleS and OnIdle are the create's idle_s (0: never idle) and
	// on_idle.
	IdleS  int    `json:"idle_s"`
	OnIdle string `json:"on_idle"`
	// WakeOnRequest says that a call that needs the sandbox running wakes
	// it from paused or suspended: set by idle_s > 0, or by E2B's
	// lifecycle.autoResume.
	WakeOnRequest bool              `json:"wake_on_request"`
	Metadata      map[string]string `json:"metadata"`
	Network       json.RawMessage   `json:"network"`
	LastError     *Status           `json:"last_error"`
	// Unavailable, in cluster mode, says why the sandbox cannot be reached
	// now: the node that runs it is down. Absent otherwise.
	Unavailable *Status `json:"unavailable,omitempty"`
	// Limits bound what the sandbox's VMM may use on the host, from its
	// cgroup; absent when the server runs with the jail off.
	Limits *SandboxLimits `json:"limits,omitempty"`
}

// SandboxLimits are the host-side limits of a sandbox's VMM.
type SandboxLimits struct {
	// CPUPct is its CPU quota in percent of one host CPU (250: two and a
	// half CPUs).
	CPUPct    int `json:"cpu_pct"`
	MemoryMiB int `json:"memory_mib"`
	Pids      int `json:"pids"`
	IOWeight  int `json:"io_weight,omitempty"`
}

// SandboxOperation is the answer to a lifecycle call on a sandbox.
type SandboxOperation struct {
	Sandbox   Sandbox   `json:"sandbox"`
	Operation Operation `json:"operation"`
}

// Keep is the body of POST /v1/sandboxes/{id}/keep.
type Keep struct {
	TimeoutS *int `json:"timeout_s"`
}

// PTY asks for a terminal of the given size.
type PTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// CommandRequest is the body of POST /v1/sandboxes/{id}/commands and
// /exec. Exactly one of Argv and Cmd is set.
type CommandRequest struct {
	Argv     []string          `json:"argv,omitempty"`
	Cmd      string            `json:"cmd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	User     string            `json:"user,omitempty"`
	Stdin    bool              `json:"stdin,omitempty"`
	PTY      *PTY              `json:"pty,omitempty"`
	TimeoutS int               `json:"timeout_s,omitempty"`
}

// Attach says where and with what to attach to a command.
type Attach struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Command states.
const (
	CommandCreated = "created"
	CommandRunning = "running"
	CommandExited  = "exited"
)

// CommandSession is the answer to POST /v1/sandboxes/{id}/commands.
type CommandSession struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	Attach    Attach `json:"attach"`
}

// Command is a command's state.
type Command struct {
	ID         string     `json:"id"`
	SandboxID  string     `json:"sandbox_id"`
	State      string     `json:"state"`
	PID        *int       `json:"pid"`
	ExitCode   *int       `json:"exit_code"`
	Signal     *string    `json:"signal"`
	TimedOut   bool       `json:"timed_out"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// Event names on a command's attach stream.
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventGap    = "gap"
)

// StartEvent is the data of an attach stream's "start" event.
type StartEvent struct {
	PID int `json:"pid"`
}

// DataEvent is the data of a "stdout" or "stderr" event: Data is base64 in
// JSON ([]byte marshals that way).
type DataEvent struct {
	Data []byte `json:"data"`
}

// ExitEvent is the data of the "exit" event, the last of a stream.
type ExitEvent struct {
	ExitCode   int     `json:"exit_code"`
	Signal     *string `json:"signal"`
	TimedOut   bool    `json:"timed_out"`
	DurationMS int64   `json:"duration_ms"`
	// RolledBack says the command's sandbox was rolled back to a
	// checkpoint under it: it has no exit status, and exit_code is null
	// on the wire (ExitCode is -1 here).
	RolledBack bool `json:"rolled_back,omitempty"`
}

// exitWire is ExitEvent as JSON has it.
type exitWire struct {
	ExitCode   *int    `json:"exit_code"`
	Signal     *string `json:"signal"`
	TimedOut   bool    `json:"timed_out"`
	DurationMS int64   `json:"duration_ms"`
	RolledBack bool    `json:"rolled_back,omitempty"`
}

// MarshalJSON writes exit_code null for a rolled back command.
func (e ExitEvent) MarshalJSON() ([]byte, error) {
	w := exitWire{ExitCode: &e.ExitCode, Signal: e.Signal, TimedOut: e.TimedOut, DurationMS: e.DurationMS, RolledBack: e.RolledBack}
	if e.RolledBack {
		w.ExitCode = nil
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads what MarshalJSON writes: a null exit_code is -1.
func (e *ExitEvent) UnmarshalJSON(b []byte) error {
	var w exitWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = ExitEvent{ExitCode: -1, Signal: w.Signal, TimedOut: w.TimedOut, DurationMS: w.DurationMS, RolledBack: w.RolledBack}
	if w.ExitCode != nil {
		e.ExitCode = *w.ExitCode
	}
	return nil
}

// GapEvent says output before this point was dropped: the server keeps
// only the last part of a command's output.
type GapEvent struct {
	DroppedEvents int64 `json:"dropped_events"`
}

// Signal is the body of POST /v1/commands/{id}/signal.
type Signal struct {
	Signal string `json:"signal"`
}

// ExecResult is the answer to POST /v1/sandboxes/{id}/exec.
type ExecResult struct {
	ExitCode  int     `json:"exit_code"`
	Signal    *string `json:"signal"`
	TimedOut  bool    `json:"timed_out"`
	Stdout    string  `json:"stdout"`
	Stderr    string  `json:"stderr"`
	Truncated bool    `json:"truncated"`
}

// Stat describes a path in a sandbox.
type Stat struct {
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	SizeBytes  int64     `json:"size_bytes"`
	Mode       string    `json:"mode"`
	ModifiedAt time.Time `json:"modified_at"`
}

// Path is the body of POST .../fs/mkdir.
type Path struct {
	Path string `json:"path"`
}

// Move is the body of POST .../fs/move.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Template statuses.
const (
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
)

// Template is a template as the API shows it. A template being built, or
// whose last build failed, shows that build's status and error; its
// digest is empty until it is ready.
type Template struct {
	Name      string          `json:"name"`
	Tag       string          `json:"tag"`
	Digest    string          `json:"digest"`
	VCPUs     int             `json:"vcpus"`
	MemoryMiB int             `json:"memory_mib"`
	DiskMiB   int             `json:"disk_mib"`
	SizeBytes int64           `json:"size_bytes"`
	CreatedAt time.Time       `json:"created_at"`
	Status    string          `json:"status"`
	Error     *Status         `json:"error"`
	Source    *TemplateSource `json:"source,omitempty"`
	// BuildID names the template's last build, if it was built.
	BuildID    string   `json:"build_id,omitempty"`
	StartCmd   string   `json:"start_cmd,omitempty"`
	ReadyCmd   string   `json:"ready_cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	// Unavailable is set, in cluster mode, while the template is being
	// built on a node that cannot be reached: why. The build goes on if
	// the node was only cut off, and fails when its agent starts again.
	Unavailable *Status `json:"unavailable,omitempty"`
}

// TemplateSource says what a built template was made from.
type TemplateSource struct {
	From  string `json:"from"`
	Steps int    `json:"steps"`
}

// BuildStep is one step of a template build: exactly one field is set.
type BuildStep struct {
	Run     string            `json:"run,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	User    string            `json:"user,omitempty"`
	Copy    *BuildCopy        `json:"copy,omitempty"`
}

// BuildCopy copies Src from the build context to Dest in the image.
type BuildCopy struct {
	Src   string `json:"src"`
	Dest  string `json:"dest"`
	Chown string `json:"chown,omitempty"`
}

// RegistryAuth is the account a docker:// pull logs in with.
type RegistryAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// CreateTemplate is the body of POST /v1/templates.
type CreateTemplate struct {
	Name       string            `json:"name"`
	Tag        string            `json:"tag"`
	From       string            `json:"from"`
	Steps      []BuildStep       `json:"steps"`
	Dockerfile string            `json:"dockerfile"`
	BuildArgs  map[string]string `json:"build_args"`
	Context    string            `json:"context"`
	StartCmd   string            `json:"start_cmd"`
	ReadyCmd   string            `json:"ready_cmd"`
	VCPUs      int               `json:"vcpus"`
	MemoryMiB  int               `json:"memory_mib"`
	DiskMiB    int               `json:"disk_mib"`
	// Network is the egress policy of the build's RUN steps, in the form
	// of a sandbox's; absent means all egress allowed.
	Network      json.RawMessage `json:"network"`
	RegistryAuth *RegistryAuth   `json:"registry_auth"`
}

// SaveTemplate is the body of POST /v1/sandboxes/{id}/template.
type SaveTemplate struct {
	Name string `json:"name"`
	Tag  string `json:"tag"`
}

// TemplateOperation is the answer to a build: the template as it is now
// (building) and the operation that builds it.
type TemplateOperation struct {
	Template  Template  `json:"template"`
	Operation Operation `json:"operation"`
}

// BuildContext is the answer to PUT /v1/build-contexts.
type BuildContext struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
	Size   int64  `json:"size_bytes"`
}

// BuildLogLine is the data of a build log's "log" event.
type BuildLogLine struct {
	Step   int    `json:"step"`
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// BuildEnd is the data of a build log's "end" event.
type BuildEnd struct {
	Status string  `json:"status"`
	Digest string  `json:"digest,omitempty"`
	Error  *Status `json:"error"`
}

// Key roles.
const (
	RoleAdmin = "admin"
	RoleUser  = "user"
)

// Key formats: how the secret of an API key reads. Both kinds work on the
// native API and the E2B-compatible one, with the same tenancy.
const (
	// KeyFormatAirlock reads "alk_<key ID without its prefix>_<secret>".
	KeyFormatAirlock = "airlock"
	// KeyFormatE2B reads "e2b_" and 40 lowercase hex digits, the shape
	// E2B's SDKs check a key against before they send it.
	KeyFormatE2B = "e2b"
)

// CreateKey is the body of POST /v1/keys. An empty Role means RoleUser, an
// empty Format KeyFormatAirlock.
type CreateKey struct {
	Name   string  `json:"name"`
	Role   string  `json:"role"`
	Format string  `json:"format,omitempty"`
	Limits *Limits `json:"limits,omitempty"`
}

// Limits bound what one API key may hold. A nil field is no limit of the
// key's own: a user key then takes the server's default (airlock serve
// --default-limits), an admin key has none.
type Limits struct {
	// Sandboxes counts every sandbox not deleted.
	Sandboxes *int64 `json:"sandboxes,omitempty"`
	// VCPUs and MemoryMiB count the sandboxes whose VM holds memory
	// (creating, running, paused, suspending, waking).
	VCPUs     *int64 `json:"vcpus,omitempty"`
	MemoryMiB *int64 `json:"memory_mib,omitempty"`
	// DiskMiB counts the disks of every sandbox not deleted.
	DiskMiB *int64 `json:"disk_mib,omitempty"`
	// SuspendedMiB counts the memory images of suspended sandboxes.
	SuspendedMiB *int64 `json:"suspended_mib,omitempty"`
	// Checkpoints counts the key's checkpoints.
	Checkpoints *int64 `json:"checkpoints,omitempty"`
	// Builds counts the key's template builds queued or running.
	Builds *int64 `json:"builds,omitempty"`
	// BuildContextMiB bounds each build context upload of the key (under
	// the server's own bound, airlock serve --max-build-context). It is a
	// size per upload, not a running total, so Usage has no such field.
	BuildContextMiB *int64 `json:"build_context_mib,omitempty"`
}

// Usage is what a key holds now, in the units of Limits.
type Usage struct {
	Sandboxes    int64 `json:"sandboxes"`
	VCPUs        int64 `json:"vcpus"`
	MemoryMiB    int64 `json:"memory_mib"`
	DiskMiB      int64 `json:"disk_mib"`
	SuspendedMiB int64 `json:"suspended_mib"`
	Checkpoints  int64 `json:"checkpoints"`
	Builds       int64 `json:"builds"`
}

// SetLimits is the body of PATCH /v1/keys/{id}.
type SetLimits struct {
	Limits *Limits `json:"limits"`
}

// Key is an API key as listed; the secret is never shown again. GET
// /v1/keys/{id} and /v1/keys/self add the limits in force (the key's own,
// the server's defaults filling the rest for a user key) and the usage.
type Key struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	Format    string    `json:"format"`
	Limits    Limits    `json:"limits"`
	Usage     *Usage    `json:"usage,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// KeyCreated is the answer to POST /v1/keys: the only time Key is shown.
type KeyCreated struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Role      string    `json:"role"`
	Format    string    `json:"format"`
	Key       string    `json:"key"`
	Limits    Limits    `json:"limits"`
	CreatedAt time.Time `json:"created_at"`
}

// PutSecret is the body of POST /v1/secrets: it stores Value under Name
// for the calling key, replacing the value a secret of that name had.
type PutSecret struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Secret is a stored secret as the API shows it: never its value.
type Secret struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Health is the answer to GET /healthz.
type Health struct {
	Status string `json:"status"`
}

// EgressEvent is one entry of a sandbox's egress log: a flow or a DNS
// query its gateway judged.
type EgressEvent struct {
	Time     time.Time `json:"time"`
	Proto    string    `json:"proto"`           // "tcp", "udp" or "dns"; "log" for the log's own counts of what it dropped
	Phase    string    `json:"phase,omitempty"` // "open" or "end" for an allowed TCP flow
	Count    int64     `json:"count,omitempty"` // the events this entry sums, when more than one (or, for "log", dropped)
	Host     string    `json:"host"`            // the name (SNI, Host or query), "" if none
	IP       string    `json:"ip"`
	Port     uint16    `json:"port"`
	Verdict  string    `json:"verdict"` // "allow" or "deny"
	Reason   string    `json:"reason"`
	BytesOut int64     `json:"bytes_out"`
	BytesIn  int64     `json:"bytes_in"`
}

// SandboxMetrics is the answer to GET /v1/sandboxes/{id}/metrics: what the
// sandbox uses, measured in its guest when asked, and what its VMM uses
// on the host when that can be measured.
type SandboxMetrics struct {
	CPUUsedPct   float64 `json:"cpu_used_pct"`
	CPUCount     int     `json:"cpu_count"`
	MemUsedMiB   int64   `json:"mem_used_mib"`
	MemTotalMiB  int64   `json:"mem_total_mib"`
	MemCacheMiB  int64   `json:"mem_cache_mib"`
	DiskUsedMiB  int64   `json:"disk_used_mib"`
	DiskTotalMiB int64   `json:"disk_total_mib"`
	// VMMCPUPct is the CPU the sandbox's VMM uses on the host, in
	// percent, and VMMMemMiB the host memory it holds. Both are
	// host-side, from the sandbox's cgroup when the jail is on; absent
	// otherwise.
	VMMCPUPct float64   `json:"vmm_cpu_pct,omitempty"`
	VMMMemMiB int64     `json:"vmm_mem_mib,omitempty"`
	Time      time.Time `json:"time"`
}
