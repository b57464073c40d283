package apiclient

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Event is one server-sent event.
type Event struct {
	// ID is the stream's last event ID when the event was dispatched: the
	// value of the latest id field so far, as the SSE spec has it.
	ID   int64
	Name string // the event field; "message" when the event had none
	Data []byte // the data fields joined by newlines
}

// maxEventBytes bounds one event, so that a broken stream cannot make the
// reader grow without end.
const maxEventBytes = 64 << 20

// EventStream reads a text/event-stream body event by event, following
// the parsing rules of the HTML living standard: lines end with CRLF, LF
// or CR; lines starting with ':' are comments; "field: value" lines set
// fields; a blank line ends an event; an event without data is not
// dispatched. Only the fields id, event and data are used.
type EventStream struct {
	body   io.ReadCloser
	r      *bufio.Reader
	line   []byte
	skipLF bool  // the last line ended with CR: a LF right after belongs to it
	lastID int64 // the last event ID so far
	err    error // sticky: once set, Next returns it
}

// NewEventStream reads events from body, which Close closes.
func NewEventStream(body io.ReadCloser) *EventStream {
	return &EventStream{body: body, r: bufio.NewReaderSize(body, 64<<10)}
}

// LastEventID is the value of the latest id field read so far (0 if none):
// what a client sends as Last-Event-ID to resume after a reconnect.
func (s *EventStream) LastEventID() int64 { return s.lastID }

// Close ends the stream. It may be called while Next blocks, which then
// returns an error.
func (s *EventStream) Close() error { return s.body.Close() }

// Next returns the next event. It returns io.EOF when the stream ended
// cleanly between events, and io.ErrUnexpectedEOF when it ended inside one
// (which is discarded, as the spec says).
func (s *EventStream) Next() (Event, error) {
	if s.err != nil {
		return Event{}, s.err
	}
	var (
		name    string
		data    []byte
		hasData bool
		pending bool // a field of an undispatched event was read
	)
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && pending {
				err = io.ErrUnexpectedEOF
			}
			s.err = err
			return Event{}, err
		}
		if len(line) == 0 {
			if !hasData {
				name, pending = "", false
				continue
			}
			if name == "" {
				name = "message"
			}
			return Event{ID: s.lastID, Name: name, Data: bytes.TrimSuffix(data, []byte("\n"))}, nil
		}
		if line[0] == ':' {
			continue
		}
		pending = true
		field, value, found := bytes.Cut(line, []byte(":"))
		if found {
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(field) {
		case "event":
			name = string(value)
		case "data":
			if len(data)+len(value) > maxEventBytes {
				s.err = fmt.Errorf("event stream: an event is larger than %d bytes", maxEventBytes)
				return Event{}, s.err
			}
			data = append(data, value...)
			data = append(data, '\n')
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) >= 0 {
				break
			}
			if len(value) == 0 {
				s.lastID = 0
			} else if n, err := strconv.ParseInt(string(value), 10, 64); err == nil {
				s.lastID = n
			}
		}
	}
}

// readLine returns the next line without its end. The slice is valid until
// the next call.
func (s *EventStream) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		if s.r.Buffered() == 0 {
			if _, err := s.r.Peek(1); err != nil {
				if errors.Is(err, io.EOF) && len(s.line) > 0 {
					return nil, io.ErrUnexpectedEOF
				}
				return nil, err
			}
		}
		buf, _ := s.r.Peek(s.r.Buffered())
		if s.skipLF {
			s.skipLF = false
			if buf[0] == '\n' {
				_, _ = s.r.Discard(1)
				continue
			}
		}
		i := bytes.IndexAny(buf, "\r\n")
		if i < 0 {
			i = len(buf)
		}
		if len(s.line)+i > maxEventBytes {
			return nil, fmt.Errorf("event stream: a line is longer than %d bytes", maxEventBytes)
		}
		s.line = append(s.line, buf[:i]...)
		if i == len(buf) {
			_, _ = s.r.Discard(i)
			continue
		}
		s.skipLF = buf[i] == '\r'
		_, _ = s.r.Discard(i + 1)
		return s.line, nil
	}
}
