package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

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

// buildLog is a build's log: JSON lines of apiv1.BuildLogLine in a file
// under the data directory, kept after the build for replay, and a signal
// for readers following it live.
type buildLog struct {
	path string

	mu      sync.Mutex    // guards the fields below
	f       *os.File      // nil once closed
	size    int64         // bytes written
	full    bool          // past maxLogBytes
	err     error         // the first failed write, for close to report
	changed chan struct{} // closed and replaced on every write, and on close
	tail    map[int][]string
}

func (s *Service) buildLogPath(id string) string {
	return filepath.Join(s.cfg.Dir.Root, "builds", id+".log")
}

func newBuildLog(path string) (*buildLog, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	return &buildLog{path: path, f: f, changed: make(chan struct{}), tail: map[int][]string{}}, nil
}

// add appends one line.
func (l *buildLog) add(step int, stream, text string) {
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

// infof appends a line of the build's own.
func (l *buildLog) infof(step int, format string, args ...any) {
	l.add(step, "info", fmt.Sprintf(format, args...))
}

// lastLines returns the last lines a step printed.
func (l *buildLog) lastLines(step int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.tail[step]...)
}

// writer returns an io.Writer that adds what is written to it as lines of
// step on stream. Flush it with the returned function once the writing
// ends.
func (l *buildLog) writer(step int, stream string) (io.Writer, func()) {
	w := &lineWriter{emit: func(s string) { l.add(step, stream, s) }}
	return w, w.flush
}

// wait returns a channel closed on the next write or on close, and
// whether the log is still open.
func (l *buildLog) wait() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed, l.f != nil
}

// close ends the log and wakes its readers. Its error says the file
// may have lost lines: a failed write, sync or close.
func (l *buildLog) close() error {
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

// FollowBuildLog calls line for every line of the log of the build that
// made (or is making) the template ref names, from the first, following a
// build in progress until it ends, and with nil after each idle period
// without a line (a keepalive); then it returns how the build ended. It
// returns early with ctx's error when ctx ends, or with line's.
func (s *Service) FollowBuildLog(ctx context.Context, ref string, idle time.Duration, line func(*apiv1.BuildLogLine) error) (apiv1.BuildEnd, error) {
	b, err := s.buildOf(ctx, ref)
	if err != nil {
		return apiv1.BuildEnd{}, err
	}
	s.mu.Lock()
	run := s.builds[b.ID]
	s.mu.Unlock()
	f, err := os.Open(s.buildLogPath(b.ID))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && run == nil {
			return buildEnd(b), nil // its log is gone: the end is all there is
		}
		return apiv1.BuildEnd{}, fmt.Errorf("open the build log of %s: %w", b.ID, err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	var partial []byte
	lastLine := time.Now()
	for {
		var changed <-chan struct{}
		open := false
		if run != nil {
			changed, open = run.log.wait()
		}
		for {
			chunk, err := r.ReadBytes('\n')
			partial = append(partial, chunk...)
			if err != nil {
				break // EOF: what is there is read
			}
			var ln apiv1.BuildLogLine
			if json.Unmarshal(partial, &ln) == nil {
				if err := line(&ln); err != nil {
					return apiv1.BuildEnd{}, err
				}
				lastLine = time.Now()
			}
			partial = partial[:0]
		}
		if !open {
			break
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return apiv1.BuildEnd{}, ctx.Err()
		}
		if idle > 0 && time.Since(lastLine) >= idle {
			if err := line(nil); err != nil {
				return apiv1.BuildEnd{}, err
			}
			lastLine = time.Now()
		}
	}
	if run != nil {
		<-run.done // the log is closed just before the build's end is stored
	}
	if b, err = s.st.GetBuild(ctx, b.ID); err != nil {
		return apiv1.BuildEnd{}, err
	}
	return buildEnd(b), nil
}

func buildEnd(b store.Build) apiv1.BuildEnd {
	end := apiv1.BuildEnd{Status: b.Status, Digest: b.Digest}
	if b.Error != nil {
		end.Error = &apiv1.Status{Code: b.Error.Code, Message: b.Error.Message}
	}
	return end
}

// lastLinesText joins the last lines of a step for an error message.
func lastLinesText(lines []string) string {
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.Join(lines, "\n")
}

// MaxContextBytes is the largest build context the server takes.
func (s *Service) MaxContextBytes() int64 { return s.cfg.MaxContextBytes }

// ContextLimit is the largest build context p may upload: the server's
// bound, or the key's build_context_mib when lower. keyMiB is then that
// limit (else -1), for the refusal of an upload that passes it.
func (s *Service) ContextLimit(ctx context.Context, p Principal) (limit, keyMiB int64, err error) {
	l, err := s.limitsOf(ctx, p.KeyID)
	if err != nil {
		return 0, 0, err
	}
	if l.BuildContextMiB != nil && *l.BuildContextMiB<<20 < s.cfg.MaxContextBytes {
		return *l.BuildContextMiB << 20, *l.BuildContextMiB, nil
	}
	return s.cfg.MaxContextBytes, -1, nil
}
