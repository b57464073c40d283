// Package envd serves the API of E2B's in-sandbox daemon (envd, port
// 49983 in an E2B sandbox) from the airlock server itself: the Connect
// RPCs of its process and filesystem services, and its plain HTTP routes
// (/files, /health, /envs). Nothing runs in the guest for it: every call
// becomes a call of internal/service, or of its command sessions
// (internal/sessions), as the native API's do, so tenancy, limits and
// state rules hold on both paths.
//
// The router in internal/e2b authenticates sandbox traffic and hands each
// request to Server.Serve with the sandbox it is for.
//
// Decisions, where E2B's envd and airlock differ:
//   - A process's pid is the guest pid of its command. Every lookup by pid
//     or tag reads the sandbox's running commands from the service, so a
//     restarted server finds them again; a process's tag and its
//     ProcessConfig as given are kept in the command's note
//     (sessions.Commands.StartCommand), on disk with the sandbox.
//   - A process's events are the command's typed events
//     (internal/command), each translated into one Connect message.
//   - Connect re-attaches from the present, as envd does: output from
//     before is not replayed. A process that exited in the last 30 s while
//     this server streamed it answers Connect with its start and end.
//   - Directory watches poll the directory through the service (a listing
//     every 200 ms or slower, compared with the last), so events are
//     CREATE, WRITE, CHMOD and REMOVE; a rename is a REMOVE and a CREATE.
//   - Files are written by the guest agent, as root; owner and group read
//     "root". Relative paths resolve against the user's home (/root for
//     root and when no user is given, /home/<user> otherwise).
//   - File metadata (X-Metadata-<key> headers on POST /files) is kept by
//     the guest agent as extended attributes user.e2b.<key> on the new
//     file, set before it takes its path; keys are lowercased, as envd
//     does, and bounded as agentproto.CheckMetadata says.
package envd

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/sessions"
)

// EnvdVersion is the envd version this implementation is faithful to, for
// the control plane's envdVersion field. The SDKs gate features on it,
// and every gate up to this version is served: octet-stream uploads
// (0.5.7), file metadata (0.6.2: X-Metadata-* headers kept as user.e2b.*
// extended attributes, shown in EntryInfo.metadata), entries in watch
// events (0.6.3), and allowNetworkMounts on watches (0.6.4: accepted; a
// sandbox has no network mounts). See docs/e2b.md, "The envd version".
const EnvdVersion = "0.6.4"

// Request is what the router knows of a request for a sandbox's envd.
type Request struct {
	// Principal is the caller, as the service checks ownership.
	Principal service.Principal
	// SandboxID is the sandbox the request is for.
	SandboxID string
	// Authorized tells that the X-Access-Token header was right.
	Authorized bool
}

// Server serves envd's routes. Its background work (sync watchers) ends
// with Close or when idle.
type Server struct {
	svc  *service.Service
	cmds *sessions.Commands
	log  *slog.Logger

	// token returns a sandbox's envd access token, for signed file URLs.
	token func(sandboxID string) string
	// now is the clock for signature expiry and retention.
	now func() time.Time
	// poll is the least interval between two listings of a watched
	// directory.
	poll time.Duration

	procs map[string]rpc // the Connect procedures by path

	ctx    context.Context // ends with Close: the watchers' lifetime
	cancel context.CancelFunc

	mu       sync.Mutex               // guards the fields below
	watchers map[string]*watcher      // sync watchers by ID
	exits    map[exitKey]retainedExit // processes seen to end, for a late Connect
}

// New returns a Server over svc and its command sessions, cmds.
func New(svc *service.Service, cmds *sessions.Commands, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		svc: svc, cmds: cmds, log: log, now: time.Now, poll: 200 * time.Millisecond,
		ctx: ctx, cancel: cancel,
		watchers: map[string]*watcher{},
		exits:    map[exitKey]retainedExit{},
	}
	s.token = svc.SandboxAccessToken
	s.procs = s.rpcs()
	return s
}

// Close ends the sync watchers.
func (s *Server) Close() {
	s.cancel()
	s.mu.Lock()
	clear(s.watchers)
	s.mu.Unlock()
}

// rpc is one Connect procedure: a unary call, a server stream (stream
// and serve), or a client stream, which reads and answers its request
// itself.
type rpc struct {
	stream bool
	unary  func(ctx context.Context, req Request, r *http.Request, m message) (any, error)
	serve  func(ctx context.Context, req Request, r *http.Request, m message, c call, out *streamWriter) error
	client func(w http.ResponseWriter, r *http.Request, req Request)
}

func (s *Server) rpcs() map[string]rpc {
	return map[string]rpc{
		"/process.Process/Start":                  {stream: true, serve: s.start},
		"/process.Process/Connect":                {stream: true, serve: s.connect},
		"/process.Process/List":                   {unary: s.list},
		"/process.Process/SendInput":              {unary: s.sendInput},
		"/process.Process/StreamInput":            {client: s.streamInput},
		"/process.Process/SendSignal":             {unary: s.sendSignal},
		"/process.Process/CloseStdin":             {unary: s.closeStdin},
		"/process.Process/Update":                 {unary: s.update},
		"/filesystem.Filesystem/Stat":             {unary: s.stat},
		"/filesystem.Filesystem/ListDir":          {unary: s.listDir},
		"/filesystem.Filesystem/MakeDir":          {unary: s.makeDir},
		"/filesystem.Filesystem/Move":             {unary: s.move},
		"/filesystem.Filesystem/Remove":           {unary: s.remove},
		"/filesystem.Filesystem/WatchDir":         {stream: true, serve: s.watchDir},
		"/filesystem.Filesystem/CreateWatcher":    {unary: s.createWatcher},
		"/filesystem.Filesystem/GetWatcherEvents": {unary: s.getWatcherEvents},
		"/filesystem.Filesystem/RemoveWatcher":    {unary: s.removeWatcher},
	}
}

// Serve answers one envd request for req.SandboxID. r.URL.Path is the
// path as the SDK sent it to envd ("/process.Process/Start", "/files").
func (s *Server) Serve(w http.ResponseWriter, r *http.Request, req Request) {
	path := r.URL.Path
	isRPC := strings.HasPrefix(path, "/process.Process/") || strings.HasPrefix(path, "/filesystem.Filesystem/")
	cors(w)
	switch {
	case r.Method == http.MethodOptions:
		w.WriteHeader(http.StatusNoContent)
		return
	case path == "/health":
		s.health(w, r, req)
		return
	case path == "/files":
		s.files(w, r, req)
		return
	case !req.Authorized:
		msg := "unauthorized access, please provide a valid access token or method signing if supported"
		if isRPC {
			writeUnaryError(w, errorf(codeUnauthenticated, "%s", msg))
		} else {
			restError(w, http.StatusUnauthorized, msg)
		}
		return
	case path == "/envs":
		s.envs(w, r, req)
		return
	case !isRPC:
		restError(w, http.StatusNotFound, "no route "+truncate(path, 100)+" on envd")
		return
	}
	proc, ok := s.procs[path]
	if !ok {
		writeUnaryError(w, errorf(codeUnimplemented, "%s is not a procedure of envd", truncate(path, 100)))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		restError(w, http.StatusMethodNotAllowed, "envd procedures are called with POST")
		return
	}
	if proc.client != nil {
		proc.client(w, r, req)
		return
	}
	c, err := readCall(w, r, proc.stream)
	if wt, ok := err.(*errWrongType); ok {
		w.Header().Set("Accept-Post", wt.want)
		restError(w, http.StatusUnsupportedMediaType, wt.Error())
		return
	}
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
	}
	defer cancel()
	if !proc.stream {
		if err != nil {
			writeUnaryError(w, err)
			return
		}
		m, err := parseMessage("", c.msg)
		if err != nil {
			writeUnaryError(w, err)
			return
		}
		res, err := proc.unary(ctx, req, r, m)
		if err != nil {
			writeUnaryError(w, err)
			return
		}
		writeUnary(w, res)
		return
	}
	out := newStreamWriter(w)
	if err == nil {
		var m message
		if m, err = parseMessage("", c.msg); err == nil {
			err = proc.serve(ctx, req, r, m, c, out)
		}
	}
	if out.err != nil {
		return // the client went away
	}
	if err != nil && ctx.Err() == context.DeadlineExceeded && r.Context().Err() == nil {
		err = errorf(codeDeadlineExceeded, "the call's deadline (Connect-Timeout-Ms) passed")
	}
	if err != nil && r.Context().Err() != nil {
		return // the client went away
	}
	out.end(err)
}

// cors allows every origin, as envd does, so that browsers can call it.
func cors(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "*")
	h.Set("Access-Control-Expose-Headers", "*")
}

// restError answers a plain HTTP route as envd does: {"message","code"}.
func restError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	}{msg, status})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// userPattern is what a user name may look like (the usual useradd rule,
// and digits for a uid).
var userPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$`)

// basicUser returns the user named by an Authorization: Basic header, ""
// for the default user when there is none.
func basicUser(r *http.Request) (string, error) {
	u, _, ok := r.BasicAuth()
	if !ok || u == "" {
		return "", nil
	}
	return checkUser(u)
}

func checkUser(u string) (string, error) {
	if !userPattern.MatchString(u) {
		return "", errorf(codeUnauthenticated, "invalid username: %q", truncate(u, 40))
	}
	return u, nil
}

// home is the home directory of a user: /root for root and the default
// user, /home/<user> for the rest.
func home(user string) string {
	if user == "" || user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolve makes p absolute as envd does: "" is the home directory, ~ and
// relative paths start there, and the result is cleaned (the agent takes
// no "..").
func resolve(p, user string) (string, error) {
	h := home(user)
	switch {
	case p == "" || p == "~":
		return h, nil
	case strings.HasPrefix(p, "~/"):
		p = h + p[1:]
	case strings.HasPrefix(p, "~"):
		return "", errorf(codeInvalidArgument, "path %q: cannot expand another user's home directory", truncate(p, 100))
	case !strings.HasPrefix(p, "/"):
		p = h + "/" + p
	}
	return path.Clean(p), nil
}
