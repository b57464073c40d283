// Package eventlog keeps a command's events (start, output, exit) as a
// numbered log on disk: one writer appends, any number of readers follow
// it from any event on, and a restarted server reopens it where it was.
//
// The log is two segment files, NAME and NAME.1. When NAME grows past the
// segment size it becomes NAME.1 (dropping the older NAME.1) and a new NAME
// starts, so at least one segment's worth of the most recent events is
// always kept and the disk used is bounded by two segments. A reader that
// asks for events that were dropped gets a Gap first.
//
// A record is a 21-byte header (sequence, cursor, type, length, all
// big-endian) followed by its data. Sequences start at 1 and have no holes.
// The cursor is the writer's own position in its source (the agent's output
// offset), kept so a reopened log knows where to resume.
package eventlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// DefaultSegment is the segment size: the log keeps at least this much of
// the most recent output.
const DefaultSegment = 8 << 20

const headerSize = 8 + 8 + 1 + 4

// MaxData bounds one event's data.
const MaxData = 1 << 20

// Event is one record of the log.
type Event struct {
	Seq    int64
	Cursor int64
	Type   byte
	Data   []byte
}

// Gap is the Type of the synthetic event a reader gets when the events it
// asked for were dropped; its Seq is that of the first dropped event.
const Gap byte = 0

// Log is an open event log.
type Log struct {
	path    string
	segment int64

	mu      sync.Mutex // guards everything below
	f       *os.File   // the current segment, opened for append
	size    int64      // bytes in the current segment
	gen     int64      // bumped on every rotation
	first   int64      // sequence of the first record in the current segment
	oldest  int64      // sequence of the first record kept (in NAME.1 or NAME)
	last    Event      // the last record written (Data not kept)
	closed  bool       // no more events will come
	changed chan struct{}
}

// Open opens or creates the log at path. Segment 0 means DefaultSegment.
func Open(path string, segment int64) (*Log, error) {
	if segment <= 0 {
		segment = DefaultSegment
	}
	l := &Log{path: path, segment: segment, changed: make(chan struct{})}
	old, err := scan(path + ".1")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	cur, err := scan(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open event log: %w", err)
	}
	// A record cut short by a crash is dropped.
	if err := f.Truncate(cur.size); err != nil {
		f.Close()
		return nil, fmt.Errorf("open event log: %w", err)
	}
	if _, err := f.Seek(cur.size, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	l.f, l.size = f, cur.size
	l.last = cur.last
	if l.last.Seq == 0 {
		l.last = old.last
	}
	l.first = cur.first
	if l.first == 0 {
		l.first = l.last.Seq + 1
	}
	l.oldest = old.first
	if l.oldest == 0 {
		l.oldest = l.first
	}
	return l, nil
}

type scanResult struct {
	size  int64 // bytes of whole records
	first int64
	last  Event
}

// scan walks a segment's headers and stops at the first incomplete record.
func scan(path string) (scanResult, error) {
	var r scanResult
	f, err := os.Open(path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	var off int64
	for {
		e, n, err := readAt(f, off, false)
		if err != nil {
			return r, nil
		}
		if r.first == 0 {
			r.first = e.Seq
		}
		r.last, r.size = e, off+n
		off += n
	}
}

// readAt reads the record at off; it returns io.EOF (or ErrUnexpectedEOF)
// when no whole record is there yet.
func readAt(f *os.File, off int64, withData bool) (Event, int64, error) {
	var h [headerSize]byte
	if _, err := f.ReadAt(h[:], off); err != nil {
		return Event{}, 0, err
	}
	e := Event{
		Seq:    int64(binary.BigEndian.Uint64(h[0:])),
		Cursor: int64(binary.BigEndian.Uint64(h[8:])),
		Type:   h[16],
	}
	n := int64(binary.BigEndian.Uint32(h[17:]))
	if n > MaxData || e.Seq <= 0 {
		return Event{}, 0, fmt.Errorf("corrupt event log record at %d", off)
	}
	if withData {
		e.Data = make([]byte, n)
		if _, err := f.ReadAt(e.Data, off+headerSize); err != nil {
			return Event{}, 0, io.ErrUnexpectedEOF
		}
	} else if st, err := f.Stat(); err != nil || st.Size() < off+headerSize+n {
		return Event{}, 0, io.ErrUnexpectedEOF
	}
	return e, headerSize + n, nil
}

// Append writes an event with the next sequence number and returns it.
func (l *Log) Append(typ byte, cursor int64, data []byte) (int64, error) {
	if len(data) > MaxData {
		return 0, fmt.Errorf("event of %d bytes is over the %d limit", len(data), MaxData)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, errors.New("event log is closed")
	}
	if l.size >= l.segment {
		if err := l.rotate(); err != nil {
			return 0, err
		}
	}
	seq := l.last.Seq + 1
	buf := make([]byte, headerSize+len(data))
	binary.BigEndian.PutUint64(buf[0:], uint64(seq))
	binary.BigEndian.PutUint64(buf[8:], uint64(cursor))
	buf[16] = typ
	binary.BigEndian.PutUint32(buf[17:], uint32(len(data)))
	copy(buf[headerSize:], data)
	if _, err := l.f.Write(buf); err != nil {
		// Leave the segment as it was so the next append starts clean.
		l.f.Truncate(l.size)
		l.f.Seek(l.size, io.SeekStart)
		return 0, fmt.Errorf("append event: %w", err)
	}
	l.size += int64(len(buf))
	l.last = Event{Seq: seq, Cursor: cursor, Type: typ}
	l.notify()
	return seq, nil
}

// rotate makes the current segment the old one and starts a new one.
func (l *Log) rotate() error {
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("rotate event log: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("rotate event log: %w", err)
	}
	l.f.Close()
	l.f, l.size = f, 0
	l.oldest, l.first = l.first, l.last.Seq+1
	l.gen++
	return nil
}

func (l *Log) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Last is the last event written (without its data); Seq is 0 for an
// empty log.
func (l *Log) Last() Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// Finish marks the log complete: readers that reach its end return io.EOF
// instead of waiting.
func (l *Log) Finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		l.notify()
	}
}

// Close finishes the log and closes its file.
func (l *Log) Close() error {
	l.Finish()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// Reader follows a log from an event on.
type Reader struct {
	l    *Log
	next int64 // sequence of the next event to return
	f    *os.File
	gen  int64 // the log's generation when f was opened as the current segment
	old  bool  // f is NAME.1
	off  int64
}

// NewReader returns a reader whose first event is the one after seq
// (seq 0: from the beginning).
func (l *Log) NewReader(after int64) *Reader {
	return &Reader{l: l, next: after + 1}
}

// Close releases the reader's file.
func (r *Reader) Close() error {
	if r.f != nil {
		return r.f.Close()
	}
	return nil
}

// Next returns the next event, waiting for it until ctx ends. It returns
// io.EOF after the last event of a finished log. When events were dropped
// it returns a Gap event whose Seq is the first one dropped and whose
// Cursor is the count dropped, then goes on from the oldest one kept.
func (r *Reader) Next(ctx context.Context) (Event, error) {
	for {
		if r.f == nil {
			gap, err := r.open()
			if err != nil {
				return Event{}, err
			}
			if gap.Seq != 0 {
				return gap, nil
			}
		}
		e, n, err := readAt(r.f, r.off, true)
		if err == nil {
			r.off += n
			if e.Seq < r.next {
				continue // before where we start
			}
			r.next = e.Seq + 1
			return e, nil
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return Event{}, err
		}
		// The end of this file: move on if it has been rotated away,
		// else wait for more.
		r.l.mu.Lock()
		gen, last, closed, changed := r.l.gen, r.l.last.Seq, r.l.closed, r.l.changed
		r.l.mu.Unlock()
		if r.old || gen != r.gen {
			r.f.Close()
			r.f = nil
			continue
		}
		if r.next > last {
			if closed {
				return Event{}, io.EOF
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return Event{}, ctx.Err()
			}
		}
	}
}

// open positions the reader at the segment holding r.next.
func (r *Reader) open() (Event, error) {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	var gap Event
	if r.next < l.oldest {
		gap = Event{Seq: r.next, Cursor: l.oldest - r.next, Type: Gap}
		r.next = l.oldest
	}
	path, old := l.path, false
	if r.next < l.first {
		path, old = l.path+".1", true
	}
	f, err := os.Open(path)
	if err != nil {
		return Event{}, fmt.Errorf("read event log: %w", err)
	}
	r.f, r.off, r.old, r.gen = f, 0, old, l.gen
	return gap, nil
}
