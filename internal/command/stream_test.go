package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/eventlog"
)

// want is an event as a test expects it.
type want struct {
	id   int64
	kind Kind
	data string
	pid  int
	exit *apiv1.ExitEvent
	gap  *Dropped
}

func (w want) String() string {
	return fmt.Sprintf("{id %d kind %d data %q pid %d exit %+v gap %+v}", w.id, w.kind, w.data, w.pid, w.exit, w.gap)
}

func got(ev Event) want {
	w := want{id: ev.ID, kind: ev.Kind, data: string(ev.Data), exit: ev.Exit, gap: ev.Dropped}
	if ev.Start != nil {
		w.pid = ev.Start.PID
	}
	return w
}

// readAll reads a stream to its end and returns its events and the error
// that ended it.
func readAll(t *testing.T, st *Stream) ([]want, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := []want{}
	for {
		ev, err := st.Next(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, got(ev))
	}
}

func open(t *testing.T) *Session {
	t.Helper()
	s, err := Open("cmdtest", filepath.Join(t.TempDir(), "commands", "cmdtest.log"), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func write(t *testing.T, w io.Writer, s string) {
	t.Helper()
	if _, err := io.WriteString(w, s); err != nil {
		t.Fatal(err)
	}
}

func sig(s string) *string { return &s }

// A command's log read back from every point a reconnect can ask for: the
// events after it, numbered as the first read numbered them, to the exit.
func TestStreamReplay(t *testing.T) {
	s := open(t)
	ready := make(chan struct{})
	stdio := s.Stdio(ready)
	if err := s.Started(&agentclient.Process{PID: 42}); err != nil {
		t.Fatal(err)
	}
	close(ready)
	write(t, stdio.Stdout, "out\n")
	write(t, stdio.Stderr, "err\n")
	write(t, stdio.Stdout, "\x00\xff")
	exit := apiv1.ExitEvent{ExitCode: -1, Signal: sig("KILL"), TimedOut: true, DurationMS: 1500}
	s.Exited(exit)

	all := []want{
		{id: 1, kind: Start, pid: 42},
		{id: 2, kind: Stdout, data: "out\n"},
		{id: 3, kind: Stderr, data: "err\n"},
		{id: 4, kind: Stdout, data: "\x00\xff"},
		{id: 5, kind: Exit, exit: &exit},
	}
	for after := int64(0); after <= 5; after++ {
		t.Run(fmt.Sprintf("after %d", after), func(t *testing.T) {
			exits := 0
			st := s.Stream(after, func() { exits++ })
			defer st.Close()
			evs, err := readAll(t, st)
			if !errors.Is(err, io.EOF) {
				t.Fatalf("the stream ended with %v, want io.EOF", err)
			}
			if !reflect.DeepEqual(evs, all[after:]) {
				t.Fatalf("events\n%v\nwant\n%v", evs, all[after:])
			}
			wantExits := 1
			if after == 5 {
				wantExits = 0 // the exit is not read again
			}
			if exits != wantExits {
				t.Fatalf("onExit called %d times, want %d", exits, wantExits)
			}
		})
	}
	if got := s.Present(); got != 4 {
		t.Fatalf("the present of an exited command is %d, want 4 (just before its exit)", got)
	}
}

// A reader behind what the log keeps gets a gap numbered as the last event
// it missed, then the oldest event kept.
func TestStreamGap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cmd.log")
	log, err := eventlog.Open(path, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	chunk := strings.Repeat("x", 100)
	for i := 0; i < 10; i++ {
		if _, err := log.Append(recStdout, int64(100*(i+1)), []byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	log.Finish()
	st := &Stream{r: log.NewReader(0)}
	defer st.Close()
	evs, err := readAll(t, st)
	if !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if len(evs) < 2 || evs[0].kind != Gap || evs[0].gap == nil || evs[0].gap.Events == 0 || evs[0].gap.Bytes != 0 {
		t.Fatalf("the first event is %v, want a gap of events", evs)
	}
	dropped := evs[0].gap.Events
	if evs[0].id != dropped || evs[1].id != dropped+1 || evs[1].kind != Stdout || evs[1].data != chunk {
		t.Fatalf("gap of %d events numbered %d, then %v: want the gap numbered as the last dropped event, then the next", dropped, evs[0].id, evs[1])
	}
	if int64(len(evs)-1)+dropped != 10 {
		t.Fatalf("%d events kept and %d dropped, want 10 in all", len(evs)-1, dropped)
	}
}

// Output the agent no longer had when the server re-attached is a gap of
// bytes; the process's output then goes on at the agent's offset.
func TestStreamLostOutput(t *testing.T) {
	s := open(t)
	ready := make(chan struct{})
	close(ready)
	if err := s.Started(&agentclient.Process{PID: 7}); err != nil {
		t.Fatal(err)
	}
	write(t, s.Stdio(ready).Stdout, "abc")
	s.Detach(s.Process())
	if cursor, attached := s.Position(); cursor != 3 || attached {
		t.Fatalf("position %d, attached %v: want 3, detached", cursor, attached)
	}
	s.Reattach(&agentclient.Process{PID: 7, Offset: 10})
	write(t, s.Stdio(ready).Stdout, "k")
	if cursor, attached := s.Position(); cursor != 11 || !attached {
		t.Fatalf("position %d, attached %v: want 11, attached", cursor, attached)
	}
	s.End("the test ended it")

	evs, err := readAll(t, s.Stream(0, nil))
	if !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	all := []want{
		{id: 1, kind: Start, pid: 7},
		{id: 2, kind: Stdout, data: "abc"},
		{id: 3, kind: Gap, gap: &Dropped{Bytes: 7}},
		{id: 4, kind: Stdout, data: "k"},
		{id: 5, kind: Stderr, data: "airlock: the test ended it\n"},
		{id: 6, kind: Exit, exit: &apiv1.ExitEvent{ExitCode: -1}},
	}
	if !reflect.DeepEqual(evs, all) {
		t.Fatalf("events\n%v\nwant\n%v", evs, all)
	}
}

// The ways a command's log ends without an exit from its process.
func TestStreamEnds(t *testing.T) {
	tests := []struct {
		name string
		do   func(t *testing.T, s *Session, path string)
		want []want
	}{
		{
			name: "could not start",
			do:   func(t *testing.T, s *Session, path string) { s.NotStarted("no such file\n", 127) },
			want: []want{
				{id: 1, kind: Stderr, data: "no such file\n"},
				{id: 2, kind: Exit, exit: &apiv1.ExitEvent{ExitCode: 127}},
			},
		},
		{
			name: "sandbox gone",
			do: func(t *testing.T, s *Session, path string) {
				if err := s.Started(&agentclient.Process{PID: 1}); err != nil {
					t.Fatal(err)
				}
				s.Close()
				EndLog(path, "the sandbox VM exited", false)
				EndLog(path, "twice", false)
			},
			want: []want{
				{id: 1, kind: Start, pid: 1},
				{id: 2, kind: Stderr, data: "airlock: the sandbox VM exited\n"},
				{id: 3, kind: Exit, exit: &apiv1.ExitEvent{ExitCode: -1}},
			},
		},
		{
			name: "rolled back",
			do: func(t *testing.T, s *Session, path string) {
				if err := s.Started(&agentclient.Process{PID: 1}); err != nil {
					t.Fatal(err)
				}
				s.RolledBack("the sandbox was rolled back")
				s.End("after")
			},
			want: []want{
				{id: 1, kind: Start, pid: 1},
				{id: 2, kind: Stderr, data: "airlock: the sandbox was rolled back\n"},
				{id: 3, kind: Exit, exit: &apiv1.ExitEvent{ExitCode: -1, RolledBack: true}},
			},
		},
		{
			name: "rolled back with its sandbox gone",
			do: func(t *testing.T, s *Session, path string) {
				if err := s.Started(&agentclient.Process{PID: 1}); err != nil {
					t.Fatal(err)
				}
				s.Close()
				EndLog(path, "rolled back", true)
			},
			want: []want{
				{id: 1, kind: Start, pid: 1},
				{id: 2, kind: Stderr, data: "airlock: rolled back\n"},
				{id: 3, kind: Exit, exit: &apiv1.ExitEvent{ExitCode: -1, RolledBack: true}},
			},
		},
		{
			name: "ended after its exit",
			do: func(t *testing.T, s *Session, path string) {
				if err := s.Started(&agentclient.Process{PID: 1}); err != nil {
					t.Fatal(err)
				}
				s.Exited(apiv1.ExitEvent{ExitCode: 0})
				s.End("too late")
			},
			want: []want{
				{id: 1, kind: Start, pid: 1},
				{id: 2, kind: Exit, exit: &apiv1.ExitEvent{}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cmd.log")
			s, err := Open("cmdtest", path, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			tt.do(t, s, path)
			s.Close()
			// Reopened as a server restart reopens an exited command's log.
			s, err = Open("cmdtest", path, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			evs, err := readAll(t, s.Stream(0, nil))
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(evs, tt.want) {
				t.Fatalf("events\n%v\nwant\n%v", evs, tt.want)
			}
		})
	}
}

// The pump delivers a live command's events as they are logged, then
// closes with io.EOF after the exit.
func TestEventsFollowsLiveCommand(t *testing.T) {
	s := open(t)
	ready := make(chan struct{})
	close(ready)
	st := s.Stream(0, nil)
	defer st.Close()
	events := st.Events(context.Background())
	next := func() want {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the channel closed early: %v", st.Err())
			}
			return got(ev)
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
		return want{}
	}
	if err := s.Started(&agentclient.Process{PID: 3}); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.kind != Start || ev.pid != 3 {
		t.Fatalf("first event %v", ev)
	}
	write(t, s.Stdio(ready).Stdout, "live")
	if ev := next(); ev.kind != Stdout || ev.data != "live" || ev.id != 2 {
		t.Fatalf("second event %v", ev)
	}
	s.Exited(apiv1.ExitEvent{ExitCode: 1})
	if ev := next(); ev.kind != Exit || ev.exit.ExitCode != 1 {
		t.Fatalf("third event %v", ev)
	}
	select {
	case _, ok := <-events:
		if ok {
			t.Fatal("an event after the exit")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the channel stayed open after the exit")
	}
	if !errors.Is(st.Err(), io.EOF) {
		t.Fatalf("Err %v, want io.EOF", st.Err())
	}
}

// The pump ends with its context or with Close, read or not.
func TestEventsEnds(t *testing.T) {
	t.Run("context", func(t *testing.T) {
		s := open(t)
		st := s.Stream(0, nil)
		defer st.Close()
		ctx, cancel := context.WithCancel(context.Background())
		events := st.Events(ctx)
		cancel()
		select {
		case _, ok := <-events:
			if ok {
				t.Fatal("an event from an empty log")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the pump outlived its context")
		}
		if !errors.Is(st.Err(), context.Canceled) {
			t.Fatalf("Err %v, want context.Canceled", st.Err())
		}
	})
	t.Run("close unread", func(t *testing.T) {
		s := open(t)
		if err := s.Started(&agentclient.Process{PID: 3}); err != nil {
			t.Fatal(err)
		}
		st := s.Stream(0, nil)
		st.Events(context.Background()) // the pump blocks sending the start
		done := make(chan struct{})
		go func() { st.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not end the pump")
		}
	})
}

// A log write that fails is reported to the caller, and the stream's
// readers still end.
func TestEndReportsFailedWrite(t *testing.T) {
	s := open(t)
	huge := strings.Repeat("x", eventlog.MaxData+1)
	if err := s.NotStarted(huge, 127); err == nil {
		t.Fatal("NotStarted logged an event over the limit without an error")
	}
	_, err := readAll(t, s.Stream(0, nil))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("stream ended with %v, want io.EOF", err)
	}

	path := filepath.Join(t.TempDir(), "gone", "cmd.log")
	if err := EndLog(path, "the sandbox is gone", false); err != nil {
		t.Fatalf("EndLog of a missing log: %v", err)
	}
}
