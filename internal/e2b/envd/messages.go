package envd

// The messages of envd's process and filesystem services
// (e2b-dev/E2B spec/envd/process/process.proto and
// spec/envd/filesystem/filesystem.proto) as Go values: requests are read
// from a message, responses are written by encoding/json with the proto3
// JSON names, and default values omitted as protojson omits them.

// processConfig is process.ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd,omitempty"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

func readProcessConfig(m message) (processConfig, error) {
	var c processConfig
	var err error
	if c.Cmd, err = m.str("cmd"); err != nil {
		return c, err
	}
	if c.Args, err = m.strings("args"); err != nil {
		return c, err
	}
	if c.Envs, err = m.stringMap("envs"); err != nil {
		return c, err
	}
	c.Cwd, err = m.optStr("cwd")
	return c, err
}

// ptySize is process.PTY.Size; nil when the request has no pty.
type ptySize struct {
	Cols, Rows uint32
}

// readPTY reads an optional process.PTY field.
func readPTY(m message, name string) (*ptySize, error) {
	pm, ok, err := m.sub(name)
	if err != nil || !ok {
		return nil, err
	}
	sm, _, err := pm.sub("size")
	if err != nil {
		return nil, err
	}
	var s ptySize
	if s.Cols, err = sm.uint32("cols"); err != nil {
		return nil, err
	}
	if s.Rows, err = sm.uint32("rows"); err != nil {
		return nil, err
	}
	return &s, nil
}

// startRequest is process.StartRequest.
type startRequest struct {
	Process processConfig
	PTY     *ptySize
	Tag     *string
	Stdin   *bool // nil: true, for clients older than the field
}

func readStartRequest(m message) (startRequest, error) {
	var r startRequest
	pm, ok, err := m.sub("process")
	if err != nil {
		return r, err
	}
	if !ok {
		return r, m.errf("process", "is required")
	}
	if r.Process, err = readProcessConfig(pm); err != nil {
		return r, err
	}
	if r.PTY, err = readPTY(m, "pty"); err != nil {
		return r, err
	}
	if r.Tag, err = m.optStr("tag"); err != nil {
		return r, err
	}
	r.Stdin, err = m.optBool("stdin")
	return r, err
}

// selector is process.ProcessSelector: a pid or a tag.
type selector struct {
	PID    uint32
	Tag    string
	ByTag  bool
	String string // for messages: "pid 42" or "tag \"x\""
}

// readSelector reads the required ProcessSelector field "process".
func readSelector(m message) (selector, error) {
	var s selector
	sm, ok, err := m.sub("process")
	if err != nil {
		return s, err
	}
	if !ok {
		return s, m.errf("process", "is required: give a pid or a tag")
	}
	which, err := sm.oneof("pid", "tag")
	if err != nil {
		return s, err
	}
	switch which {
	case "pid":
		if s.PID, err = sm.uint32("pid"); err != nil {
			return s, err
		}
		s.String = "pid " + itoa(int64(s.PID))
	case "tag":
		if s.Tag, err = sm.str("tag"); err != nil {
			return s, err
		}
		s.ByTag, s.String = true, "tag "+quote(s.Tag)
	default:
		return s, errorf(codeUnimplemented, "field process: give a pid or a tag")
	}
	return s, nil
}

// Signal values of process.Signal.
var signalValues = map[string]int32{"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}

// processEvent is process.ProcessEvent: exactly one field is set.
type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

// eventResponse is process.StartResponse and process.ConnectResponse.
type eventResponse struct {
	Event processEvent `json:"event"`
}

type startEvent struct {
	PID uint32 `json:"pid,omitempty"`
}

// dataEvent is ProcessEvent.DataEvent: exactly one field is set. A []byte
// encodes as standard base64, as proto3 JSON writes bytes.
type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode,omitempty"`
	Exited   bool    `json:"exited,omitempty"`
	Status   string  `json:"status,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// processInfo is process.ProcessInfo.
type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid,omitempty"`
	Tag    *string       `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

// empty is every response without fields.
type empty struct{}

// File types of filesystem.FileType; FILE_TYPE_UNSPECIFIED is written as
// no type, as protojson omits an enum's zero value.
const (
	fileTypeFile      = "FILE_TYPE_FILE"
	fileTypeDirectory = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   = "FILE_TYPE_SYMLINK"
)

// entryInfo is filesystem.EntryInfo. Type is omitted when unspecified, as
// protojson omits an enum's zero value, and Metadata when empty, as it
// omits an empty map.
type entryInfo struct {
	Name          string            `json:"name,omitempty"`
	Type          string            `json:"type,omitempty"`
	Path          string            `json:"path,omitempty"`
	Size          *int64String      `json:"size,omitempty"`
	Mode          uint32            `json:"mode,omitempty"`
	Permissions   string            `json:"permissions,omitempty"`
	Owner         string            `json:"owner,omitempty"`
	Group         string            `json:"group,omitempty"`
	ModifiedTime  string            `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

type entryResponse struct {
	Entry *entryInfo `json:"entry,omitempty"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

// Event types of filesystem.EventType.
const (
	eventCreate = "EVENT_TYPE_CREATE"
	eventWrite  = "EVENT_TYPE_WRITE"
	eventRemove = "EVENT_TYPE_REMOVE"
	eventChmod  = "EVENT_TYPE_CHMOD"
)

// fsEvent is filesystem.FilesystemEvent.
type fsEvent struct {
	Name  string     `json:"name,omitempty"`
	Type  string     `json:"type,omitempty"`
	Entry *entryInfo `json:"entry,omitempty"`
}

// watchResponse is filesystem.WatchDirResponse: exactly one field is set.
type watchResponse struct {
	Start      *struct{} `json:"start,omitempty"`
	Filesystem *fsEvent  `json:"filesystem,omitempty"`
	Keepalive  *struct{} `json:"keepalive,omitempty"`
}

// watchRequest is filesystem.WatchDirRequest and CreateWatcherRequest.
type watchRequest struct {
	Path          string
	Recursive     bool
	IncludeEntry  bool
	NetworkMounts bool // read and ignored: a sandbox has no network mounts
}

func readWatchRequest(m message) (watchRequest, error) {
	var r watchRequest
	var err error
	if r.Path, err = m.str("path"); err != nil {
		return r, err
	}
	if r.Recursive, err = m.boolean("recursive"); err != nil {
		return r, err
	}
	if r.IncludeEntry, err = m.boolean("includeEntry"); err != nil {
		return r, err
	}
	r.NetworkMounts, err = m.boolean("allowNetworkMounts")
	return r, err
}

type createWatcherResponse struct {
	WatcherID string `json:"watcherId,omitempty"`
}

type watcherEventsResponse struct {
	Events []fsEvent `json:"events"`
}
