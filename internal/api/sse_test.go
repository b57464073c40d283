package api

import (
	"testing"

	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/command"
)

// The attach stream's event names and JSON, byte for byte, as clients
// (apiclient, the CLI, the Python example) read them.
func TestCommandEventWire(t *testing.T) {
	sig := "KILL"
	tests := []struct {
		name     string
		ev       command.Event
		wantName string
		wantData string
	}{
		{"start", command.Event{Kind: command.Start, Start: &apiv1.StartEvent{PID: 42}}, "start", `{"pid":42}`},
		{"stdout", command.Event{Kind: command.Stdout, Data: []byte("hi\n")}, "stdout", `{"data":"aGkK"}`},
		{"stderr, not UTF-8", command.Event{Kind: command.Stderr, Data: []byte{0, 0xff}}, "stderr", `{"data":"AP8="}`},
		{"exit", command.Event{Kind: command.Exit, Exit: &apiv1.ExitEvent{ExitCode: 3, DurationMS: 12}}, "exit",
			`{"exit_code":3,"signal":null,"timed_out":false,"duration_ms":12}`},
		{"exit on a signal", command.Event{Kind: command.Exit, Exit: &apiv1.ExitEvent{ExitCode: -1, Signal: &sig, TimedOut: true}}, "exit",
			`{"exit_code":-1,"signal":"KILL","timed_out":true,"duration_ms":0}`},
		{"gap of events", command.Event{Kind: command.Gap, Dropped: &command.Dropped{Events: 5}}, "gap", `{"dropped_events":5}`},
		{"gap of bytes", command.Event{Kind: command.Gap, Dropped: &command.Dropped{Bytes: 70}}, "gap", `{"dropped_bytes":70}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, data := commandEvent(tt.ev)
			if name != tt.wantName || string(data) != tt.wantData {
				t.Fatalf("got %s %s, want %s %s", name, data, tt.wantName, tt.wantData)
			}
		})
	}
}
