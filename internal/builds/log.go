// Package builds runs template builds and saves and keeps the catalogue
// of templates, apart from the sandboxes: Service takes a build request,
// records the build and its operation, boots a build sandbox through the
// sandbox side (Sandboxes, which internal/service implements), runs the
// steps, stores and tags the result, and keeps the build's log
// (builds/<id>.log in the data directory) for FollowBuildLog. It lists,
// shows and deletes templates, resolves those a cluster's catalogue names
// (the store's template tags), and reclaims the images, cache entries and
// snapshots nothing refers to. The builds in progress, their slots and
// the images they pin are a Set under its own lock; the sandbox side's
// lock never covers them.
//
// Lifetimes: builds run under the Service's context, ended by Close,
// never under a request's. New fails the builds an earlier server left
// unfinished before the sandbox side recovers; Serve hands it the
// sandbox side once that is made.
package builds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/store"
)

// Limits of a build's log: a line longer than maxLogLine is cut, a log
// past maxLogBytes stops growing (with a note), and the error of a failed
// step quotes its last tailLines lines.
const (
	maxLogLine  = 4 << 10
	maxLogBytes = 32 << 20
	tailLines   = 20
)

// Log is a build's log: JSON lines of apiv1.BuildLogLine in a file
// under the data directory, kept after the build for replay, and a signal
// for readers following it live.
type Log struct {
	path string

	mu      sync.Mutex    // guards the fields below
	f       *os.File      // nil once closed
	size    int64         // bytes written
	full    bool          // past maxLogBytes
	err     error         // the first failed write, for close to report
	changed chan struct{} // closed and replaced on every write, and on close
	tail    map[int][]string
}

// NewLog creates (or truncates) the log file at path, making its
// directory.
func NewLog(path string) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return &Log{path: path, f: f, changed: make(chan struct{}), tail: map[int][]string{}}, nil
}

// Add appends one line.
func (l *Log) Add(step int, stream, text string) {
	if len(text) > maxLogLine {
		text = text[:maxLogLine] + " [line cut]"
	}
	b, _ := json.Marshal(apiv1.BuildLogLine{Step: step, Stream: stream, Text: text})
	l.mu.Lock()
	defer l.mu.Unlock()
	if stream != "info" {
		t := append(l.tail[step], text)
		if len(t) > tailLines {
			t = t[len(t)-tailLines:]
		}
		l.tail[step] = t
	}
	if l.f == nil || l.full {
		return
	}
	if l.size+int64(len(b)) > maxLogBytes {
		l.full = true
		b, _ = json.Marshal(apiv1.BuildLogLine{Step: step, Stream: "info", Text: fmt.Sprintf("the log reached %d MiB; later lines are not kept", maxLogBytes>>20)})
	}
	n, err := l.f.Write(append(b, '\n'))
	l.size += int64(n)
	if err != nil && l.err == nil {
		l.err = err
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// Infof appends a line of the build's own.
func (l *Log) Infof(step int, format string, args ...any) {
	l.Add(step, "info", fmt.Sprintf(format, args...))
}

// LastLines returns the last lines a step printed.
func (l *Log) LastLines(step int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.tail[step]...)
}

// Writer returns an io.Writer that adds what is written to it as lines of
// step on stream. Flush it with the returned function once the writing
// ends.
func (l *Log) Writer(step int, stream string) (io.Writer, func()) {
	w := &lineWriter{emit: func(s string) { l.Add(step, stream, s) }}
	return w, w.flush
}

// Wait returns a channel closed on the next write or on close, and
// whether the log is still open.
func (l *Log) Wait() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed, l.f != nil
}

// Close ends the log and wakes its readers. Its error says the file
// may have lost lines: a failed write, sync or close.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := errors.Join(l.err, l.f.Sync(), l.f.Close())
	l.f = nil
	close(l.changed)
	return err
}

// lineWriter splits what is written into lines (a carriage return ends a
// line too, so progress bars become lines).
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexAny(w.buf, "\r\n")
		if i < 0 {
			break
		}
		if i > 0 {
			w.emit(string(w.buf[:i]))
		}
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLogLine {
		w.emit(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(string(w.buf))
		w.buf = nil
	}
}

// BuildEnd is how a build ended, as a log follower is told.
func BuildEnd(b store.Build) apiv1.BuildEnd {
	end := apiv1.BuildEnd{Status: b.Status, Digest: b.Digest}
	if b.Error != nil {
		end.Error = &apiv1.Status{Code: b.Error.Code, Message: b.Error.Message}
	}
	return end
}

// LastLinesText joins the last lines of a step for an error message.
func LastLinesText(lines []string) string {
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.Join(lines, "\n")
}
