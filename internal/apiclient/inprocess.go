package apiclient

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// InProcess returns an http.Client whose requests are served by h in this
// process instead of crossing a network: a server hands it to a Client of
// its own API (as /v1/mcp does), so that such calls take the same route
// through authentication, tenancy and limits as any other. Responses
// stream: the body yields what the handler writes as it writes it, and
// closing the body early makes the handler's further writes fail.
// Connection upgrades are not served.
func InProcess(h http.Handler) *http.Client {
	return &http.Client{Transport: handlerTransport{h: h}}
}

type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Upgrade") != "" {
		return nil, fmt.Errorf("in-process %s %s: connection upgrades are not served in process", req.Method, req.URL.Path)
	}
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "in-process"
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, started: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				err := errAborted
				if p != http.ErrAbortHandler {
					err = fmt.Errorf("in-process %s %s: handler panicked: %v", req.Method, req.URL.Path, p)
				}
				w.start()
				pw.CloseWithError(err)
				return
			}
			w.start()
			_ = pw.Close()
		}()
		t.h.ServeHTTP(w, in)
	}()
	select {
	case <-w.started:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          pr,
		ContentLength: -1,
		Request:       req,
	}, nil
}

// errAborted is what a response body yields when its handler broke off
// after the headers were out, as a server would break the connection.
var errAborted = errors.New("in-process handler aborted the response")

// pipeResponse is the http.ResponseWriter of an in-process request: the
// headers are handed over at the first write or flush (or when the
// handler returns), and the body goes through a pipe to the caller.
type pipeResponse struct {
	header  http.Header
	body    *io.PipeWriter
	once    sync.Once
	started chan struct{}
	status  int
	sent    http.Header
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(code int) {
	if code >= 100 && code < 200 {
		return
	}
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.started)
	})
}

func (w *pipeResponse) start() { w.WriteHeader(http.StatusOK) }

func (w *pipeResponse) Write(b []byte) (int, error) {
	w.start()
	return w.body.Write(b)
}

// Flush hands the headers over; the body needs no flushing, as each
// write waits for the caller to read it.
func (w *pipeResponse) Flush() { w.start() }
