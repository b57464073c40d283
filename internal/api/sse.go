package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/sessions"
)

// sse writes a text/event-stream. Every write is flushed; the first error
// ends the stream.
type sse struct {
	w http.ResponseWriter
	f http.Flusher
}

func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	s := &sse{w: w, f: f}
	s.flush()
	return s
}

func (s *sse) flush() {
	if s.f != nil {
		s.f.Flush()
	}
}

func (s *sse) event(id int64, name string, data []byte) error {
	var err error
	if id > 0 {
		_, err = fmt.Fprintf(s.w, "id: %d\nevent: %s\ndata: %s\n\n", id, name, data)
	} else {
		_, err = fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, data)
	}
	s.flush()
	return err
}

func (s *sse) ping() error {
	_, err := io.WriteString(s.w, ": ping\n\n")
	s.flush()
	return err
}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	ch, err := s.svc.Watch(ctx, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := startSSE(w)
	ping := time.NewTicker(s.cfg.PingInterval)
	defer ping.Stop()
	for {
		select {
		case sb, ok := <-ch:
			if !ok {
				return nil
			}
			data, _ := json.Marshal(sb)
			if out.event(0, "state", data) != nil {
				return nil
			}
		case <-ping.C:
			if out.ping() != nil {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// streamContext ends with the request or when the server shuts down.
func (s *Server) streamContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func lastEventID(r *http.Request) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("Last-Event-ID %q is not an event number from this stream: %w", truncate(v, 30), errdefs.ErrInvalid)
	}
	return n, nil
}

func (s *Server) attach(w http.ResponseWriter, r *http.Request, p service.Principal) error {
	return s.streamCommand(w, r, sessions.AttachAuth{Principal: &p})
}

func (s *Server) attachWithToken(w *statusWriter, r *http.Request, token string) error {
	return s.streamCommand(w, r, sessions.AttachAuth{Token: token})
}

// streamCommand sends a command's events: replayed after Last-Event-ID,
// then live, with pings while it is quiet, to its exit.
func (s *Server) streamCommand(w http.ResponseWriter, r *http.Request, auth sessions.AttachAuth) error {
	after, err := lastEventID(r)
	if err != nil {
		return err
	}
	ctx, cancel := s.streamContext(r.Context())
	defer cancel()
	st, err := s.cmds.Attach(ctx, auth, r.PathValue("id"), after)
	if err != nil {
		return err
	}
	defer st.Close()
	out := startSSE(w)
	events := st.Events(ctx)
	ping := time.NewTicker(s.cfg.PingInterval)
	defer ping.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if err := st.Err(); !errors.Is(err, io.EOF) && ctx.Err() == nil {
					s.log.Warn("command stream failed", "command", r.PathValue("id"), "err", err)
				}
				return nil
			}
			name, data := commandEvent(ev)
			if out.event(ev.ID, name, data) != nil {
				return nil
			}
		case <-ping.C:
			if out.ping() != nil {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// commandEvent is a command's event as the attach stream sends it: its
// SSE event name and its JSON data (apiv1's StartEvent, DataEvent with the
// output in base64, ExitEvent, GapEvent, or dropped_bytes for output the
// guest agent no longer had).
func commandEvent(ev command.Event) (name string, data []byte) {
	var v any
	switch ev.Kind {
	case command.Start:
		name, v = apiv1.EventStart, ev.Start
	case command.Stdout:
		name, v = apiv1.EventStdout, apiv1.DataEvent{Data: ev.Data}
	case command.Stderr:
		name, v = apiv1.EventStderr, apiv1.DataEvent{Data: ev.Data}
	case command.Exit:
		name, v = apiv1.EventExit, ev.Exit
	case command.Gap:
		name, v = apiv1.EventGap, apiv1.GapEvent{DroppedEvents: ev.Dropped.Events}
		if ev.Dropped.Bytes > 0 {
			v = map[string]int64{"dropped_bytes": ev.Dropped.Bytes}
		}
	}
	data, _ = json.Marshal(v)
	return name, data
}
