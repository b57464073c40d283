// Package command keeps command sessions: a command's events (its start,
// its stdout and stderr, its exit) in an event log on disk, written as the
// process's output arrives from the guest agent, and read back by any
// number of streams from any event on, as typed events that each edge (the
// API's SSE, E2B's envd) encodes its own way.
//
// A Session is one command's open log and the process that feeds it; the
// service opens it, starts or re-attaches the process, and decides who may
// read it. A Stream reads the log after an event number and turns each
// record into an Event; its Events pump is the one goroutine that follows
// the log for a reader.
//
// The log's records (internal/eventlog) are typed by the rec* constants
// below; start, exit and lost records carry JSON (apiv1.StartEvent,
// apiv1.ExitEvent, {"dropped_bytes": n}), output records the raw bytes. A
// record's cursor is the agent's output offset after it, so that a
// reopened log knows where to re-attach.
package command

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/eventlog"
)

// Record types in a command's log. They are on disk: never renumber them.
const (
	recStart  byte = 1
	recStdout byte = 2
	recStderr byte = 3
	recExit   byte = 4
	recLost   byte = 5 // output the agent no longer had after a reconnect
)

// lost is the data of a recLost record.
type lost struct {
	DroppedBytes int64 `json:"dropped_bytes"`
}

// Session is a command whose log this server has open, with the process
// that feeds it while one is attached.
type Session struct {
	id       string
	streamed func(n int) // told of each output write's size; may be nil

	startMu sync.Mutex // serialises starting the process

	mu     sync.Mutex // guards the fields below
	log    *eventlog.Log
	proc   *agentclient.Process
	cursor int64 // the agent's output offset after the last byte logged
}

// Open opens the log of command id at path, creating it and its directory
// if missing. The log of a command that exited is finished, so that its
// readers end. streamed, if not nil, is told the size of each output write.
func Open(id, path string, exited bool, streamed func(n int)) (*Session, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open command log: %w", err)
	}
	log, err := eventlog.Open(path, 0)
	if err != nil {
		return nil, fmt.Errorf("open command log: %w", err)
	}
	if exited {
		log.Finish()
	}
	return &Session{id: id, streamed: streamed, log: log, cursor: log.Last().Cursor}, nil
}

// ID is the command's ID.
func (s *Session) ID() string { return s.id }

// Close closes the log; streams still reading it end with an error.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Close()
}

// StartOnce calls start unless the command has started already (a
// process is attached or its log has events). Concurrent first attaches
// wait for the one that starts it.
func (s *Session) StartOnce(start func() error) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	s.mu.Lock()
	started := s.proc != nil || s.log.Last().Seq > 0
	s.mu.Unlock()
	if started {
		return nil
	}
	return start()
}

// Stdio is where the process's output goes: its stdout and stderr records.
// Writes wait until ready is closed, so that output follows the start.
func (s *Session) Stdio(ready <-chan struct{}) agentclient.Stdio {
	return agentclient.Stdio{
		Stdout: &outWriter{s: s, typ: recStdout, ready: ready},
		Stderr: &outWriter{s: s, typ: recStderr, ready: ready},
	}
}

// outWriter logs one of a process's output streams.
type outWriter struct {
	s     *Session
	typ   byte
	ready <-chan struct{} // closed once the start event is logged
}

func (w *outWriter) Write(b []byte) (int, error) {
	<-w.ready
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for rest := b; len(rest) > 0; {
		n := min(len(rest), eventlog.MaxData)
		s.cursor += int64(n)
		if _, err := s.log.Append(w.typ, s.cursor, rest[:n]); err != nil {
			return 0, err
		}
		rest = rest[n:]
	}
	if s.streamed != nil {
		s.streamed(len(b))
	}
	return len(b), nil
}

// Started attaches proc, a process just started, and logs its start.
func (s *Session) Started(proc *agentclient.Process) error {
	data, err := json.Marshal(apiv1.StartEvent{PID: proc.PID})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc = proc
	_, err = s.log.Append(recStart, s.cursor, data)
	return err
}

// NotStarted ends the log of a command whose process never ran: msg on
// stderr, then an exit with code. The log's readers end even when a write
// fails; the error says the stream lacks its end.
func (s *Session) NotStarted(msg string, code int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.log.Finish()
	_, err := s.log.Append(recStderr, s.cursor, []byte(msg))
	return errors.Join(err, appendExit(s.log, s.cursor, apiv1.ExitEvent{ExitCode: code}))
}

// Exited logs the exit of the attached process and ends the log, whose
// readers end even when the write fails.
func (s *Session) Exited(ev apiv1.ExitEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := appendExit(s.log, s.cursor, ev)
	s.log.Finish()
	s.proc = nil
	return err
}

// Detach lets go of proc, which is no longer followed, if it is the one
// attached; the log stays open for a later Reattach.
func (s *Session) Detach(proc *agentclient.Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == proc {
		s.proc = nil
	}
}

// Position is the agent's output offset after the last byte logged, and
// whether a process is attached.
func (s *Session) Position() (cursor int64, attached bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor, s.proc != nil
}

// Reattach attaches proc, the command's process found again in the agent
// (after a server restart or a wake). Output the agent no longer had, from
// the log's cursor to proc.Offset, is logged as lost. proc is attached even
// when that record cannot be written; the error says so.
func (s *Session) Reattach(proc *agentclient.Process) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc = proc
	if proc.Offset <= s.cursor {
		return nil
	}
	data, _ := json.Marshal(lost{DroppedBytes: proc.Offset - s.cursor}) // a struct of one int64
	s.cursor = proc.Offset
	_, err := s.log.Append(recLost, s.cursor, data)
	return err
}

// Process is the attached process, nil if none.
func (s *Session) Process() *agentclient.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// End closes the stream of a started command that has no exit yet with
// "airlock: reason" on stderr and an exit with code -1, and lets go of
// its process. The log's readers end even when a write fails.
func (s *Session) End(reason string) error {
	return s.end(reason, lostExit)
}

// RolledBack ends the stream as End does, for a command whose sandbox
// was rolled back to a checkpoint: its exit says rolled_back.
func (s *Session) RolledBack(reason string) error {
	return s.end(reason, rolledBackExit)
}

func (s *Session) end(reason string, exit apiv1.ExitEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := endLog(s.log, s.cursor, reason, exit)
	s.log.Finish()
	s.proc = nil
	return err
}

// The exits of commands whose processes can no longer be followed: lost
// (code -1), or gone with a rollback of their sandbox.
var (
	lostExit       = apiv1.ExitEvent{ExitCode: -1}
	rolledBackExit = apiv1.ExitEvent{ExitCode: -1, RolledBack: true}
)

// LastSeq is the number of the last event logged, 0 if none.
func (s *Session) LastSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Last().Seq
}

// Present is where a stream starts to see only what comes next: after the
// last event, or just before the exit of a command that has exited.
func (s *Session) Present() int64 {
	s.mu.Lock()
	last := s.log.Last()
	s.mu.Unlock()
	if last.Type == recExit && last.Seq > 0 {
		return last.Seq - 1
	}
	return last.Seq
}

// Stream reads the log after event number after. onExit, if not nil, is
// called when the stream reads the exit.
func (s *Session) Stream(after int64, onExit func()) *Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &Stream{r: s.log.NewReader(after), onExit: onExit}
}

// EndLog closes the log at path of a command whose sandbox is gone (or
// rolled back), as End (or RolledBack) does, so that its readers end; a
// log that is missing or empty is left alone.
func EndLog(path, reason string, rolledBack bool) error {
	log, err := eventlog.Open(path, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	exit := lostExit
	if rolledBack {
		exit = rolledBackExit
	}
	return errors.Join(endLog(log, log.Last().Cursor, reason, exit), log.Close())
}

// endLog logs "airlock: reason" on stderr and exit, at cursor, unless the
// log is empty or ends with an exit.
func endLog(log *eventlog.Log, cursor int64, reason string, exit apiv1.ExitEvent) error {
	if last := log.Last(); last.Seq == 0 || last.Type == recExit {
		return nil
	}
	_, err := log.Append(recStderr, cursor, []byte("airlock: "+reason+"\n"))
	return errors.Join(err, appendExit(log, cursor, exit))
}

func appendExit(log *eventlog.Log, cursor int64, ev apiv1.ExitEvent) error {
	data, _ := json.Marshal(ev) // a struct of numbers and strings
	_, err := log.Append(recExit, cursor, data)
	return err
}
