package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
)

// Reconnect policy of StreamCommand.
const (
	maxReconnects = 5                      // consecutive failed attaches before giving up
	firstBackoff  = 100 * time.Millisecond // doubled after each failure
	maxBackoff    = 2 * time.Second
	// streamIdle is how long an attach stream may stay silent before it is
	// taken for dropped: the server sends a comment at least every 15 s.
	streamIdle = 60 * time.Second
)

// RunCommand creates a command in a sandbox and runs it to its end: see
// StreamCommand. req.Stdin is set to whether stdin is not nil.
func (c *Client) RunCommand(ctx context.Context, sandboxID string, req apiv1.CommandRequest, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExitEvent, error) {
	req.Stdin = stdin != nil
	sess, err := c.CreateCommand(ctx, sandboxID, req)
	if err != nil {
		return apiv1.ExitEvent{}, err
	}
	return c.StreamCommand(ctx, sess.ID, stdin, stdout, stderr)
}

// StreamCommand attaches to a created command, which starts it, and
// returns its exit event once it has ended. Its output is decoded and
// written to stdout and stderr; a notice goes to stderr where the server
// had dropped older output. When stdin is not nil, what it yields is sent
// to the command's stdin from the moment the process has started, and
// stdin is closed at its EOF. A dropped stream is attached again with
// Last-Event-ID, so output resumes exactly where it stopped; up to five
// attaches in a row may fail, with growing pauses between them.
//
// The goroutine that copies stdin stops sending when StreamCommand
// returns, but it ends only when its pending stdin.Read returns.
func (c *Client) StreamCommand(ctx context.Context, commandID string, stdin io.Reader, stdout, stderr io.Writer) (apiv1.ExitEvent, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &commandStream{c: c, id: commandID, stdin: stdin, stdout: stdout, stderr: stderr}
	failures := 0
	for {
		exit, progressed, err := s.attach(ctx)
		if err == nil {
			return exit, nil
		}
		if ctx.Err() != nil {
			return apiv1.ExitEvent{}, ctx.Err()
		}
		if !retryable(err) {
			return apiv1.ExitEvent{}, err
		}
		if progressed {
			failures = 0
		}
		if failures == maxReconnects {
			return apiv1.ExitEvent{}, fmt.Errorf("command %s: output stream lost, %d reconnects failed: %w", commandID, maxReconnects, err)
		}
		delay := min(firstBackoff<<failures, maxBackoff)
		failures++
		select {
		case <-ctx.Done():
			return apiv1.ExitEvent{}, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// commandStream is the state of one StreamCommand across its attaches.
type commandStream struct {
	c              *Client
	id             string
	stdin          io.Reader
	stdout, stderr io.Writer

	errMu sync.Mutex // serialises writes to stderr, which the stdin goroutine also makes

	// Used by the StreamCommand goroutine only.
	lastID       int64 // the last event ID seen, sent as Last-Event-ID
	resume       bool  // an event was seen: later attaches resume after lastID
	stdinStarted bool
}

// errStreamEnded says the stream ended before the exit event.
var errStreamEnded = errors.New("the stream ended before the command's exit")

// outputError is a failed write to the caller's stdout or stderr: not a
// reason to attach again.
type outputError struct{ err error }

func (e *outputError) Error() string { return "write output: " + e.err.Error() }
func (e *outputError) Unwrap() error { return e.err }

// protocolError is an event that does not follow the contract.
type protocolError struct{ err error }

func (e *protocolError) Error() string { return e.err.Error() }
func (e *protocolError) Unwrap() error { return e.err }

// retryable reports whether attaching again may help after err.
func retryable(err error) bool {
	var ae *Error
	var oe *outputError
	var pe *protocolError
	switch {
	case errors.As(err, &ae):
		return ae.Status >= 500
	case errors.As(err, &oe), errors.As(err, &pe):
		return false
	}
	return true
}

// attach reads one attachment of the stream up to the exit event. It
// reports whether it got any event, so that the caller can tell a stream
// that broke after progress from one that cannot be opened.
func (s *commandStream) attach(ctx context.Context) (exit apiv1.ExitEvent, progressed bool, err error) {
	var opts []CallOption
	if s.resume {
		opts = append(opts, LastEventID(s.lastID))
	}
	resp, err := s.c.do(ctx, request{method: http.MethodGet, path: p("v1", "commands", s.id, "attach"),
		accept: "text/event-stream", opts: opts})
	if err != nil {
		return exit, false, err
	}
	body := newIdleBody(resp.Body, streamIdle)
	st := NewEventStream(body)
	st.lastID = s.lastID // the last event ID outlives a reconnect
	defer st.Close()
	for {
		ev, err := st.Next()
		if err != nil {
			if body.idled() {
				err = fmt.Errorf("no event or ping for %s", streamIdle)
			} else if errors.Is(err, io.EOF) {
				err = errStreamEnded
			}
			return exit, progressed, err
		}
		progressed = true
		s.lastID, s.resume = ev.ID, true
		switch ev.Name {
		case apiv1.EventStart:
			s.startStdin(ctx)
		case apiv1.EventStdout, apiv1.EventStderr:
			var d apiv1.DataEvent
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				return exit, true, &protocolError{fmt.Errorf("command %s: bad %s event: %w", s.id, ev.Name, err)}
			}
			if err := s.write(ev.Name, d.Data); err != nil {
				return exit, true, &outputError{err}
			}
		case apiv1.EventGap:
			var g apiv1.GapEvent
			_ = json.Unmarshal(ev.Data, &g) // the notice does without the count
			msg := "airlock: earlier output of the command was dropped by the server\n"
			if g.DroppedEvents > 0 {
				msg = fmt.Sprintf("airlock: %d earlier output events of the command were dropped by the server\n", g.DroppedEvents)
			}
			if err := s.write(apiv1.EventStderr, []byte(msg)); err != nil {
				return exit, true, &outputError{err}
			}
		case apiv1.EventExit:
			if err := json.Unmarshal(ev.Data, &exit); err != nil {
				return exit, true, &protocolError{fmt.Errorf("command %s: bad exit event: %w", s.id, err)}
			}
			return exit, true, nil
		}
	}
}

func (s *commandStream) write(stream string, b []byte) error {
	if stream == apiv1.EventStdout {
		_, err := s.stdout.Write(b)
		return err
	}
	s.errMu.Lock()
	defer s.errMu.Unlock()
	_, err := s.stderr.Write(b)
	return err
}

// startStdin starts, once, the goroutine that copies stdin to the command.
// It ends at stdin's EOF or error, when posting fails, or when ctx ends
// (after its pending Read returns).
func (s *commandStream) startStdin(ctx context.Context) {
	if s.stdin == nil || s.stdinStarted {
		return
	}
	s.stdinStarted = true
	go func() {
		if err := s.copyStdin(ctx); err != nil && ctx.Err() == nil {
			_ = s.write(apiv1.EventStderr, []byte(fmt.Sprintf("airlock: stdin: %v\n", err)))
		}
	}()
}

func (s *commandStream) copyStdin(ctx context.Context) error {
	buf := make([]byte, 32<<10)
	for {
		n, rerr := s.stdin.Read(buf)
		if ctx.Err() != nil {
			return nil
		}
		if n > 0 {
			if err := s.post(ctx, buf[:n], false); err != nil {
				return err
			}
		}
		if rerr != nil {
			// EOF or not, the command gets no more input.
			return s.post(ctx, nil, true)
		}
	}
}

// post sends stdin, retrying while the server is unavailable. A command
// that has already ended (conflict, not found) is no error.
func (s *commandStream) post(ctx context.Context, data []byte, eof bool) error {
	for attempt := 0; ; attempt++ {
		err := s.c.Stdin(ctx, s.id, data, eof)
		var ae *Error
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ae) && (ae.Code == apiv1.CodeConflict || ae.Code == apiv1.CodeNotFound):
			return nil
		case !retryable(err) || attempt == maxReconnects:
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(firstBackoff<<attempt, maxBackoff)):
		}
	}
}

// idleBody closes a response body that has yielded nothing for a while,
// which makes its pending Read fail.
type idleBody struct {
	io.ReadCloser
	idle  time.Duration
	timer *time.Timer

	mu    sync.Mutex // guards fired
	fired bool
}

func newIdleBody(rc io.ReadCloser, idle time.Duration) *idleBody {
	b := &idleBody{ReadCloser: rc, idle: idle}
	b.timer = time.AfterFunc(idle, func() {
		b.mu.Lock()
		b.fired = true
		b.mu.Unlock()
		rc.Close()
	})
	return b
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.timer.Reset(b.idle)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	return b.ReadCloser.Close()
}

// idled reports whether the body was closed for being silent.
func (b *idleBody) idled() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fired
}
