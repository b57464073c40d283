package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
)

type scripted struct {
	name string
	data any
}

// TestStreamCommandResumes drops the stream three ways (inside an event,
// by cutting the connection, cleanly before the exit) and checks that the
// output comes out exactly once, in order.
func TestStreamCommandResumes(t *testing.T) {
	script := []scripted{
		{apiv1.EventStart, apiv1.StartEvent{PID: 42}},
		{apiv1.EventStdout, apiv1.DataEvent{Data: []byte("hello ")}},
		{apiv1.EventStderr, apiv1.DataEvent{Data: []byte("warn\n")}},
		{apiv1.EventStdout, apiv1.DataEvent{Data: []byte("world")}},
		{apiv1.EventStdout, apiv1.DataEvent{Data: []byte("!\n")}},
		{apiv1.EventExit, apiv1.ExitEvent{ExitCode: 3, DurationMS: 5}},
	}
	var mu sync.Mutex
	var lastIDs []string // Last-Event-ID of each attach
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/commands/cmd1/attach" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
		attach := len(lastIDs)
		mu.Unlock()
		from, _ := strconv.Atoi(r.Header.Get("Last-Event-ID"))
		w.Header().Set("Content-Type", "text/event-stream")
		ew := eventWriter{w}
		send := func(upTo int) {
			for id := from + 1; id <= upTo; id++ {
				ew.event(int64(id), script[id-1].name, script[id-1].data)
			}
		}
		switch attach {
		case 1: // three events, then half of the fourth
			send(3)
			io.WriteString(w, ": ping\nid: 4\nevent: stdout\n")
			w.(http.Flusher).Flush()
		case 2: // the fourth, then the connection is cut
			send(4)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
		default:
			send(len(script))
		}
	}))

	var stdout, stderr bytes.Buffer
	exit, err := c.StreamCommand(context.Background(), "cmd1", nil, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if exit.ExitCode != 3 || exit.DurationMS != 5 {
		t.Errorf("exit %+v", exit)
	}
	if stdout.String() != "hello world!\n" || stderr.String() != "warn\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"", "3", "4"}; !slices.Equal(lastIDs, want) {
		t.Errorf("Last-Event-ID of each attach %q, want %q", lastIDs, want)
	}
}

// catServer is a fake command that echoes its stdin when stdin closes. It
// refuses stdin before the process has started, as a real server may.
type catServer struct {
	t       *testing.T
	mu      sync.Mutex
	created apiv1.CommandRequest
	started bool
	input   bytes.Buffer
	eofs    int
	eof     chan struct{}
}

func (s *catServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes/sbx1/commands":
		s.mu.Lock()
		err := json.NewDecoder(r.Body).Decode(&s.created)
		s.mu.Unlock()
		if err != nil {
			s.t.Errorf("decode command: %v", err)
		}
		writeJSON(w, 201, apiv1.CommandSession{ID: "cmd1", SandboxID: "sbx1", State: "created"})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/commands/cmd1/stdin":
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.started {
			writeJSON(w, 409, apiv1.ErrorBody{Error: apiv1.Error{Code: "conflict", Message: "not started"}})
			return
		}
		s.input.Write(b)
		if r.URL.Query().Get("eof") == "1" {
			s.eofs++
			if s.eofs == 1 {
				close(s.eof)
			}
		}
		w.WriteHeader(204)
	case r.URL.Path == "/v1/commands/cmd1/attach":
		w.Header().Set("Content-Type", "text/event-stream")
		ew := eventWriter{w}
		s.mu.Lock()
		s.started = true
		s.mu.Unlock()
		ew.event(1, apiv1.EventStart, apiv1.StartEvent{PID: 7})
		select {
		case <-s.eof:
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
		out := slices.Clone(s.input.Bytes())
		s.mu.Unlock()
		ew.event(2, apiv1.EventGap, apiv1.GapEvent{DroppedEvents: 12})
		ew.event(3, apiv1.EventStdout, apiv1.DataEvent{Data: out})
		ew.event(4, apiv1.EventExit, apiv1.ExitEvent{ExitCode: 0})
	default:
		http.NotFound(w, r)
	}
}

func TestRunCommandStdin(t *testing.T) {
	srv := &catServer{t: t, eof: make(chan struct{})}
	c := newServer(t, srv)
	input := strings.Repeat("0123456789abcdef", 10<<10) // 160 KiB: several posts
	var stdout, stderr bytes.Buffer
	exit, err := c.RunCommand(context.Background(), "sbx1", apiv1.CommandRequest{Argv: []string{"cat"}},
		strings.NewReader(input), &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if exit.ExitCode != 0 {
		t.Errorf("exit %+v", exit)
	}
	if stdout.String() != input {
		t.Errorf("stdout has %d bytes, want the %d of stdin", stdout.Len(), len(input))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if !srv.created.Stdin || !slices.Equal(srv.created.Argv, []string{"cat"}) {
		t.Errorf("created %+v", srv.created)
	}
	if srv.eofs != 1 {
		t.Errorf("stdin closed %d times", srv.eofs)
	}
	if want := "airlock: 12 earlier output events of the command were dropped by the server\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}

func TestStreamCommandGivesUp(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		code     string
		class    error
		attaches int
	}{
		{"unavailable is retried, boundedly", 503, "unavailable", errdefs.ErrUnavailable, 1 + maxReconnects},
		{"not found is final", 404, "not_found", errdefs.ErrNotFound, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			attaches := 0
			c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				attaches++
				mu.Unlock()
				writeJSON(w, tc.status, apiv1.ErrorBody{Error: apiv1.Error{Code: tc.code, Message: "no"}})
			}))
			_, err := c.StreamCommand(context.Background(), "cmd1", nil, io.Discard, io.Discard)
			if !errors.Is(err, tc.class) {
				t.Fatalf("got %v, want %v", err, tc.class)
			}
			mu.Lock()
			defer mu.Unlock()
			if attaches != tc.attaches {
				t.Fatalf("%d attaches, want %d", attaches, tc.attaches)
			}
		})
	}
}

func TestStreamCommandStopsWithContext(t *testing.T) {
	started := make(chan struct{})
	c := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		eventWriter{w}.event(1, apiv1.EventStart, apiv1.StartEvent{PID: 1})
		close(started)
		<-r.Context().Done()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if _, err := c.StreamCommand(ctx, "cmd1", nil, io.Discard, io.Discard); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}
