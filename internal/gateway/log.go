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
// the gateway decided, or (Proto "log") what the log itself dropped.
type Event struct {
	// Time is when the flow opened (Phase "open"), ended (Phase "end") or
	// was refused, or the query arrived; for an entry that counts several
	// (Count), the first of them.
	Time time.Time `json:"time"`
	// Proto is "tcp", "udp" or "dns"; "log" for an entry of the log's own.
	Proto string `json:"proto"`
	// Phase is "open" or "end" for an allowed TCP flow, which is logged
	// when it opens and again when it ends; "" otherwise.
	Phase string `json:"phase,omitempty"`
	// Count is how many events of the same kind to the same destination
	// within one second this entry stands for, when more than one: allowed
	// events are summed (bytes too), so that a flood of them costs one
	// entry a second. For Proto "log" it is how many entries were dropped.
	Count int64 `json:"count,omitempty"`
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
	// "dial-error", "no-host"). For Proto "log": "sampled" (refused flows,
	// queries and datagrams past the log's rate, not written one by one)
	// or "rotated" (the entries of the oldest segment, discarded).
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
// by two segments and a restarted server still lists what happened.
//
// Nothing leaves it silently. Allowed events of one kind to one
// destination are summed per second (Count), so that a guest opening
// flows or asking names as fast as it can writes one entry a second for
// each; refused ones the gateway does not write (it samples them) are
// counted with Suppressed and written as one "sampled" entry a second; and
// a rotation starts the new segment with a "rotated" entry counting the
// entries it discarded. It is safe for concurrent use.
type Log struct {
	path    string
	segment int64

	mu      sync.Mutex // guards f, size, err, closed, pending and sampled, and serializes rotation against List
	f       *os.File   // PATH, opened for append; nil once closed
	size    int64      // bytes in PATH
	err     error      // the first write error, reported by Close
	closed  bool
	dropped int64             // entries the rotations discarded so far, as PATH's "rotated" entry says
	pending map[aggKey]*Event // allowed events being summed, by kind and second
	sampled *Event            // refused events not written, this second

	stop chan struct{} // closed by Close: ends the flush loop
	done chan struct{} // closed when the flush loop has ended
}

// aggKey is what allowed events are summed by: all but their counts.
type aggKey struct {
	second                               int64
	proto, phase, host, ip, verdict, why string
	port                                 uint16
}

// flushEvery is how often the summed entries of past seconds are written.
const flushEvery = 250 * time.Millisecond

// OpenLog opens or creates the egress log at path, whose directory must
// exist. maxBytes bounds each of the two segments; 0 means
// DefaultLogSegment.
func OpenLog(path string, maxBytes int64) (*Log, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultLogSegment
	}
	l := &Log{path: path, segment: maxBytes, pending: map[aggKey]*Event{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := l.open(); err != nil {
		return nil, err
	}
	l.dropped = droppedIn(path)
	go l.flushLoop()
	return l, nil
}

// flushLoop writes the summed entries of each second once it has passed.
func (l *Log) flushLoop() {
	defer close(l.done)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			l.mu.Lock()
			l.flushLocked(now.Unix())
			l.mu.Unlock()
		}
	}
}

// flushLocked writes the summed entries of the seconds before second, in
// the order of their times. l.mu is held.
func (l *Log) flushLocked(second int64) {
	var out []*Event
	for k, e := range l.pending {
		if k.second < second {
			out = append(out, e)
			delete(l.pending, k)
		}
	}
	if l.sampled != nil && l.sampled.Time.Unix() < second {
		out = append(out, l.sampled)
		l.sampled = nil
	}
	slices.SortStableFunc(out, func(a, b *Event) int { return a.Time.Compare(b.Time) })
	for _, e := range out {
		if e.Count == 1 && e.Proto != "log" {
			e.Count = 0 // one event: written as it was
		}
		l.writeLocked(*e)
	}
}

// Suppressed counts an event the gateway refused and did not write (it
// samples refusals under a flood): the log writes how many, once a second.
func (l *Log) Suppressed(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if l.sampled == nil {
		l.sampled = &Event{Time: e.Time, Proto: "log", Verdict: "deny", Reason: "sampled"}
	}
	l.sampled.Count++
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

// Add appends e; an allowed event is summed with the others of its kind,
// destination and second, and written once that second has passed. A write
// error is kept and reported by Close; the event is lost.
func (l *Log) Add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if e.Verdict != "allow" {
		l.writeLocked(e)
		return
	}
	k := aggKey{second: e.Time.Unix(), proto: e.Proto, phase: e.Phase, host: e.Host, ip: e.IP, verdict: e.Verdict, why: e.Reason, port: e.Port}
	if p := l.pending[k]; p != nil {
		p.Count++
		p.BytesOut += e.BytesOut
		p.BytesIn += e.BytesIn
		return
	}
	e.Count = 1
	l.pending[k] = &e
}

// writeLocked appends e to PATH, rotating first when it would not fit.
// l.mu is held.
func (l *Log) writeLocked(e Event) {
	line, err := json.Marshal(e)
	if err != nil { // cannot happen: Event has only plain fields
		return
	}
	line = append(line, '\n')
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

// rotate makes PATH the older segment and starts a new PATH, whose first
// entry counts the entries of the older segment it discarded.
func (l *Log) rotate() error {
	err := l.f.Close()
	l.f = nil
	if err != nil {
		return fmt.Errorf("rotate egress log: %w", err)
	}
	gone, first := countEntries(l.path + ".1")
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("rotate egress log: %w", err)
	}
	if err := l.open(); err != nil {
		return err
	}
	l.dropped += gone
	if l.dropped > 0 {
		line, _ := json.Marshal(Event{Time: first, Proto: "log", Verdict: "deny", Reason: "rotated", Count: l.dropped})
		line = append(line, '\n')
		n, err := l.f.Write(line)
		l.size += int64(n)
		if err != nil {
			return fmt.Errorf("write egress log: %w", err)
		}
	}
	return nil
}

// countEntries counts the entries of the segment at path but its
// "rotated" one (which PATH's own carries on), and returns the time of the
// oldest; 0 when there is no segment.
func countEntries(path string) (n int64, oldest time.Time) {
	evs, err := readEvents(path)
	if err != nil {
		return 0, time.Time{}
	}
	for i, e := range evs {
		if e.Proto != "log" || e.Reason != "rotated" {
			n++
		}
		if i == 0 || e.Time.Before(oldest) {
			oldest = e.Time
		}
	}
	return n, oldest
}

// droppedIn is the count of the "rotated" entry of the segment at path:
// what the rotations before it discarded.
func droppedIn(path string) int64 {
	evs, _ := readEvents(path)
	var n int64
	for _, e := range evs {
		if e.Proto == "log" && e.Reason == "rotated" {
			n = max(n, e.Count)
		}
	}
	return n
}

// List returns up to limit events (all when limit <= 0), newest first by
// Time. Lines that do not parse (a write cut short) are skipped.
func (l *Log) List(limit int) ([]Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.flushLocked(1 << 62) // what is being summed is shown too
	}
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
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.flushLocked(1 << 62)
	l.closed = true
	close(l.stop)
	l.mu.Unlock()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.f != nil {
		err = l.f.Close()
		l.f = nil
	}
	return errors.Join(l.err, err)
}
