package command

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/eventlog"
)

// Kind is what an event says.
type Kind uint8

// The kinds of event, in the order a stream gives them: a start, output,
// an exit last; a gap where output is missing.
const (
	Start Kind = iota + 1
	Stdout
	Stderr
	Exit
	Gap
)

// Event is one event of a command's stream. Exactly the field of its kind
// is set.
type Event struct {
	// ID numbers the event so that a reader can go on after it (the API's
	// Last-Event-ID): the log's sequence number; for a gap, that of the
	// last event dropped.
	ID   int64
	Kind Kind
	// Data is the output of a Stdout or Stderr event.
	Data []byte
	// Start is a Start event's.
	Start *apiv1.StartEvent
	// Exit is an Exit event's.
	Exit *apiv1.ExitEvent
	// Dropped is a Gap event's.
	Dropped *Dropped
}

// Dropped says what is missing before a Gap event: either events the log
// no longer keeps (it keeps only the most recent output), or bytes of
// output the guest agent no longer had when the server re-attached to the
// process. One of the two is set.
type Dropped struct {
	Events int64
	Bytes  int64
}

// Stream reads a command's events, from its log after an event number.
type Stream struct {
	r       *eventlog.Reader
	onExit  func() // called when the exit is read; may be nil
	onClose func() // called by Close; may be nil

	// The pump, once Events started it.
	cancel context.CancelFunc
	done   chan struct{} // closed when the pump has ended
	err    error         // why it ended; read after its channel closed
}

// Next returns the next event, waiting for it until ctx ends; io.EOF after
// the exit.
func (st *Stream) Next(ctx context.Context) (Event, error) {
	e, err := st.r.Next(ctx)
	if err != nil {
		return Event{}, err
	}
	ev := Event{ID: e.Seq}
	switch e.Type {
	case eventlog.Gap:
		ev.ID = e.Seq + e.Cursor - 1
		ev.Kind, ev.Dropped = Gap, &Dropped{Events: e.Cursor}
	case recStart:
		ev.Kind, ev.Start = Start, &apiv1.StartEvent{}
		err = json.Unmarshal(e.Data, ev.Start)
	case recStdout:
		ev.Kind, ev.Data = Stdout, e.Data
	case recStderr:
		ev.Kind, ev.Data = Stderr, e.Data
	case recLost:
		var x lost
		err = json.Unmarshal(e.Data, &x)
		ev.Kind, ev.Dropped = Gap, &Dropped{Bytes: x.DroppedBytes}
	case recExit:
		ev.Kind, ev.Exit = Exit, &apiv1.ExitEvent{}
		if err = json.Unmarshal(e.Data, ev.Exit); err == nil && st.onExit != nil {
			st.onExit()
		}
	default:
		return Event{}, fmt.Errorf("unknown event type %d in command log", e.Type)
	}
	if err != nil {
		return Event{}, fmt.Errorf("command log: event %d: %w", e.Seq, err)
	}
	return ev, nil
}

// Events starts the stream's pump, the one goroutine that reads it, and
// returns the channel the pump sends each event on. The channel closes
// after the exit, when ctx ends, or on an error; Err then says which. The
// pump ends with its channel, or when ctx ends or Close is called, whether
// or not the channel is read. Call Events at most once, and not with Next.
func (st *Stream) Events(ctx context.Context) <-chan Event {
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan Event)
	st.cancel, st.done = cancel, make(chan struct{})
	go func() {
		defer close(st.done)
		defer close(ch)
		for {
			ev, err := st.Next(ctx)
			if err != nil {
				st.err = err
				return
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				st.err = ctx.Err()
				return
			}
		}
	}()
	return ch
}

// Err is why the channel of Events closed: io.EOF after the exit, the
// context's error when it ended, else the log's. Call it only once the
// channel is closed.
func (st *Stream) Err() error { return st.err }

// OnClose has f called when the stream is closed: the end of what the
// reader's use of the stream held. Set it before the stream is shared.
func (st *Stream) OnClose(f func()) { st.onClose = f }

// Close ends the pump, if Events started it, waits for it, and releases
// the stream.
func (st *Stream) Close() error {
	if st.cancel != nil {
		st.cancel()
		<-st.done
	}
	if st.onClose != nil {
		st.onClose()
	}
	return st.r.Close()
}
