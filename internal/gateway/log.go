package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// DefaultLogSegment is the segment size OpenLog uses when given none.
const DefaultLogSegment = 1 << 20

// Event is one entry of the egress log: a guest flow or DNS query and what
// the gateway decided.
type Event struct {
	// Time is when the flow started or the query arrived.
	Time time.Time `json:"time"`
	// Proto is "tcp", "udp" or "dns".
	Proto string `json:"proto"`
	// Host is the name: the DNS query's, or the TLS SNI or HTTP Host the
	// guest sent on a TCP flow ("" if none).
	Host string `json:"host"`
	// IP is the address the guest dialed; for DNS, the first address of the
	// answer ("" if none).
	IP   string `json:"ip"`
	Port uint16 `json:"port"`
	// Verdict is "allow" or "deny".
	Verdict string `json:"verdict"`
	// Reason is short and machine-friendly: the policy's reason
	// ("allow-rule", "default-deny", "not-resolved", ...) or the gateway's
	// own ("gateway", "limit", "rate-limit", "udp", "upstream-error",
	// "dial-error").
	Reason string `json:"reason"`
	// BytesOut and BytesIn count what a TCP flow carried from the guest and
	// to it.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
}

// Log is a sandbox's egress log, persisted as JSON lines in two segment
// files: PATH, which Add appends to, and PATH.1, the one before. When PATH
// would grow past the segment size it becomes PATH.1 (dropping the older
// one) and a new PATH starts, so the disk a sandbox's log takes is bounded
// by two segments and a restarted server still lists what happened. It is
// safe for concurrent use.
type Log struct {
	path    string
	segment int64

	mu     sync.Mutex // guards f, size, err and serializes rotation against List
	f      *os.File   // PATH, opened for append; nil once closed
	size   int64      // bytes in PATH
	err    error      // the first write error, reported by Close
	closed bool
}

// OpenLog opens or creates the egress log at path, whose directory must
// exist. maxBytes bounds each of the two segments; 0 means
// DefaultLogSegment.
func OpenLog(path string, maxBytes int64) (*Log, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultLogSegment
	}
	l := &Log{path: path, segment: maxBytes}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

// open opens PATH for append. A last line cut short by a crash is ended so
// that the next event starts a line of its own.
func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open egress log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open egress log: %w", err)
	}
	l.f, l.size = f, st.Size()
	if l.size > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, l.size-1); err != nil {
			f.Close()
			return fmt.Errorf("open egress log: %w", err)
		}
		if last[0] != '\n' {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				f.Close()
				return fmt.Errorf("open egress log: %w", err)
			}
			l.size++
		}
	}
	return nil
}

// Add appends e. A write error is kept and reported by Close; the event is
// lost.
func (l *Log) Add(e Event) {
	line, err := json.Marshal(e)
	if err != nil { // cannot happen: Event has only plain fields
		return
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if l.f == nil { // a rotation failed to reopen: try again
		if err := l.open(); err != nil {
			l.fail(err)
			return
		}
	}
	if l.size > 0 && l.size+int64(len(line)) > l.segment {
		if err := l.rotate(); err != nil {
			l.fail(err)
			return
		}
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	if err != nil {
		l.fail(fmt.Errorf("write egress log: %w", err))
	}
}

func (l *Log) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// rotate makes PATH the older segment and starts a new PATH.
func (l *Log) rotate() error {
	err := l.f.Close()
	l.f = nil
	if err != nil {
		return fmt.Errorf("rotate egress log: %w", err)
	}
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("rotate egress log: %w", err)
	}
	return l.open()
}

// List returns up to limit events (all when limit <= 0), newest first by
// Time. Lines that do not parse (a write cut short) are skipped.
func (l *Log) List(limit int) ([]Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all []Event
	for _, p := range []string{l.path + ".1", l.path} {
		evs, err := readEvents(p)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	// Events are written in the order flows end, which is not quite the
	// order they started: sort, keeping the written order among equals.
	slices.Reverse(all)
	slices.SortStableFunc(all, func(a, b Event) int { return b.Time.Compare(a.Time) })
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// readEvents reads the events of one segment, oldest first; a missing
// segment has none.
func readEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read egress log: %w", err)
	}
	defer f.Close()
	var evs []Event
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if line = bytes.TrimSpace(line); len(line) > 0 {
			var e Event
			if json.Unmarshal(line, &e) == nil {
				evs = append(evs, e)
			}
		}
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read egress log: %w", err)
		}
	}
}

// Close closes the log and reports the first error a write met, if any.
// Add after Close does nothing; List still reads the files.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var err error
	if l.f != nil {
		err = l.f.Close()
		l.f = nil
	}
	return errors.Join(l.err, err)
}
