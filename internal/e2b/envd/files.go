package envd

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Operations a file URL is signed for.
const (
	opRead  = "read"
	opWrite = "write"
)

// Signature is how envd signs a file URL: "v1_" and the unpadded base64
// of SHA-256 over "<path>:<read|write>:<username>:<token>", with
// ":<expiration unix seconds>" appended when the URL expires.
func Signature(path, op, username, token string, expiration *int64) string {
	s := path + ":" + op + ":" + username + ":" + token
	if expiration != nil {
		s += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// fileAuth lets a /files request through with the access token, or with a
// valid signature for op when the request carries no token.
func (s *Server) fileAuth(w http.ResponseWriter, r *http.Request, req Request, op string) bool {
	if req.Authorized {
		return true
	}
	deny := func(msg string) bool {
		restError(w, http.StatusUnauthorized, msg)
		return false
	}
	if r.Header.Get("X-Access-Token") != "" {
		return deny("access token present in header but does not match")
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return deny("missing signature query parameter")
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			restError(w, http.StatusBadRequest, fmt.Sprintf("signature_expiration %q is not a unix time in seconds", truncate(v, 30)))
			return false
		}
		exp = &n
	}
	want := Signature(q.Get("path"), op, q.Get("username"), s.token(req.SandboxID), exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return deny("invalid signature")
	}
	if exp != nil && *exp < s.now().Unix() {
		return deny("signature is already expired")
	}
	return true
}

// fileStatus is the HTTP status of a service error on /files.
func fileStatus(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrPermission):
		return http.StatusForbidden
	case errors.Is(err, errdefs.ErrExhausted):
		return http.StatusInsufficientStorage // the sandbox's disk is full
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusBadGateway // the sandbox is not running, as E2B's proxy answers
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func fileError(w http.ResponseWriter, err error) {
	var re *rpcError
	if errors.As(err, &re) {
		status := http.StatusBadRequest
		if re.Code == codeUnauthenticated {
			status = http.StatusUnauthorized
		}
		restError(w, status, re.Message)
		return
	}
	restError(w, fileStatus(err), errdefs.Message(err))
}

// fileUser is the user a /files request names (query username), "" for
// the default user.
func fileUser(r *http.Request) (string, error) {
	u := r.URL.Query().Get("username")
	if u == "" {
		return "", nil
	}
	return checkUser(u)
}

func (s *Server) files(w http.ResponseWriter, r *http.Request, req Request) {
	switch r.Method {
	case http.MethodGet:
		if s.fileAuth(w, r, req, opRead) {
			s.download(w, r, req)
		}
	case http.MethodPost:
		if s.fileAuth(w, r, req, opWrite) {
			s.upload(w, r, req)
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		restError(w, http.StatusMethodNotAllowed, "/files takes GET and POST")
	}
}

// download is GET /files: the file's bytes, streamed.
func (s *Server) download(w http.ResponseWriter, r *http.Request, req Request) {
	user, err := fileUser(r)
	if err != nil {
		fileError(w, err)
		return
	}
	p, err := resolve(r.URL.Query().Get("path"), user)
	if err != nil {
		fileError(w, err)
		return
	}
	gz, ok := acceptEncoding(r.Header.Get("Accept-Encoding"))
	if !ok {
		restError(w, http.StatusNotAcceptable, "no acceptable encoding: this server sends identity or gzip")
		return
	}
	st, copyTo, err := s.svc.OpenFile(r.Context(), req.Principal, req.SandboxID, p)
	if errors.Is(err, errdefs.ErrInvalid) && st.Type == "" {
		// OpenFile refuses a directory as invalid: say it as envd does.
		if e, serr := s.svc.StatEntry(r.Context(), req.Principal, req.SandboxID, p); serr == nil && e.Type == "dir" {
			restError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", p))
			return
		}
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		restError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", p))
		return
	}
	if err != nil {
		fileError(w, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	h.Set("Vary", "Accept-Encoding")
	var out io.Writer = w
	if gz {
		h.Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		out = zw
	} else if st.Type == "file" {
		h.Set("Content-Length", strconv.FormatInt(st.SizeBytes, 10))
	}
	w.WriteHeader(http.StatusOK)
	if err := copyTo(out); err != nil {
		// The status is out: the client sees a short body.
		s.log.Warn("envd: download ended early", "sandbox", req.SandboxID, "path", p, "err", err)
	}
}

// acceptEncoding decides the encoding of a download: identity unless the
// client refuses it (identity;q=0, or *;q=0 without naming identity), in
// which case gzip if it takes that; ok is false when it takes neither.
func acceptEncoding(h string) (gz, ok bool) {
	if strings.TrimSpace(h) == "" {
		return false, true
	}
	identity, gzipOK, star := -1.0, -1.0, -1.0
	for _, part := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		q := 1.0
		if v, found := strings.CutPrefix(strings.TrimSpace(params), "q="); found {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				q = f
			}
		}
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "identity":
			identity = q
		case "gzip":
			gzipOK = q
		case "*":
			star = q
		}
	}
	if identity < 0 {
		identity = 1
		if star == 0 {
			identity = 0
		}
	}
	if gzipOK < 0 && star > 0 {
		gzipOK = star
	}
	switch {
	case identity > 0:
		return false, true
	case gzipOK > 0:
		return true, true
	}
	return false, false
}

// writtenFile is one entry of POST /files' answer.
type writtenFile struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeaderPrefix starts the name of each header of an upload that
// gives the written files metadata: "X-Metadata-<key>: <value>".
const metadataHeaderPrefix = "X-Metadata-"

// uploadMetadata reads the file metadata an upload's headers give. Keys
// are lowercased, as E2B's envd keeps them: header names are
// case-insensitive, and the SDKs' fetch and HTTP/2 send them lowercase
// anyway. A key given twice, and anything agentproto.CheckMetadata
// refuses, is an invalid_argument naming the key.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	for name, vals := range h {
		if len(name) < len(metadataHeaderPrefix) || !strings.EqualFold(name[:len(metadataHeaderPrefix)], metadataHeaderPrefix) {
			continue
		}
		raw := name[len(metadataHeaderPrefix):]
		if err := agentproto.CheckMetadataKey(raw); err != nil {
			return nil, errorf(codeInvalidArgument, "header %s: %v", truncate(name, 80), err)
		}
		k := strings.ToLower(raw)
		if _, dup := md[k]; dup || len(vals) != 1 {
			return nil, errorf(codeInvalidArgument, "metadata key %q is given more than once", k)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = vals[0]
	}
	if err := agentproto.CheckMetadata(md); err != nil {
		return nil, errorf(codeInvalidArgument, "%v", err)
	}
	return md, nil
}

// upload is POST /files: a multipart form (parts named "file", each
// written as it arrives, to the path query or else the part's file name)
// or a raw body to the path query. Parents are created; files are
// replaced. X-Metadata-* headers give every written file their metadata;
// bad ones are refused before anything is written.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, req Request) {
	user, err := fileUser(r)
	if err != nil {
		fileError(w, err)
		return
	}
	md, err := uploadMetadata(r.Header)
	if err != nil {
		fileError(w, err)
		return
	}
	q := r.URL.Query()
	body := r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			restError(w, http.StatusBadRequest, "error decompressing request body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		restError(w, http.StatusBadRequest, fmt.Sprintf("unsupported Content-Encoding %q: send gzip or none", truncate(enc, 30)))
		return
	}
	ctype := r.Header.Get("Content-Type")
	mt, params, _ := mime.ParseMediaType(ctype)
	written := []writtenFile{}
	write := func(dest string, data io.Reader) error {
		p, err := resolve(dest, user)
		if err != nil {
			return err
		}
		for _, f := range written {
			if f.Path == p {
				return errorf(codeInvalidArgument, "you cannot upload multiple files to the same path '%s' in one upload request", p)
			}
		}
		e, err := s.svc.WriteEntry(r.Context(), req.Principal, req.SandboxID, p, 0o644, md, data)
		if err != nil {
			return err
		}
		written = append(written, writtenFile{Path: p, Name: path.Base(p), Type: "file", Metadata: e.Metadata})
		return nil
	}
	switch {
	case mt == "application/octet-stream":
		if !q.Has("path") {
			restError(w, http.StatusBadRequest, "path query parameter is required for raw body upload")
			return
		}
		err = write(q.Get("path"), body)
	case strings.HasPrefix(mt, "multipart/"):
		if params["boundary"] == "" {
			restError(w, http.StatusBadRequest, "the multipart body has no boundary parameter in its Content-Type")
			return
		}
		err = uploadParts(multipart.NewReader(body, params["boundary"]), q, write)
	default:
		restError(w, http.StatusBadRequest, fmt.Sprintf("unsupported content type: %s, expected multipart/form-data or application/octet-stream", truncate(ctype, 80)))
		return
	}
	if err != nil {
		fileError(w, err)
		return
	}
	b, _ := json.Marshal(written)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// uploadParts writes each part named "file" as it arrives.
func uploadParts(mr *multipart.Reader, q url.Values, write func(string, io.Reader) error) error {
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errorf(codeInvalidArgument, "error reading form: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		dest := ""
		if v, ok := q["path"]; ok && len(v) > 0 {
			dest = v[0]
		} else {
			// The raw file name: Part.FileName keeps only its last element.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			dest = dp["filename"]
			if dest == "" {
				part.Close()
				return errorf(codeInvalidArgument, "part %d has no file name and there is no path query parameter", n+1)
			}
		}
		err = write(dest, part)
		part.Close()
		if err != nil {
			return err
		}
	}
}

// health is GET /health: 204 while the sandbox runs, 502 otherwise (the
// SDK reads 502 as "not running").
func (s *Server) health(w http.ResponseWriter, r *http.Request, req Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		restError(w, http.StatusMethodNotAllowed, "/health takes GET")
		return
	}
	sb, err := s.svc.GetSandbox(r.Context(), req.Principal, req.SandboxID)
	if err != nil || sb.State != apiv1.StateRunning {
		msg := "the sandbox is not running"
		if err == nil {
			msg = "the sandbox is " + sb.State
		}
		restError(w, http.StatusBadGateway, msg)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// envs is GET /envs: the sandbox's default environment.
func (s *Server) envs(w http.ResponseWriter, r *http.Request, req Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		restError(w, http.StatusMethodNotAllowed, "/envs takes GET")
		return
	}
	env, err := s.svc.SandboxEnv(r.Context(), req.Principal, req.SandboxID)
	if err != nil {
		fileError(w, err)
		return
	}
	b, _ := json.Marshal(env)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}
