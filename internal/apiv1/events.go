package apiv1

import (
	"encoding/json"
	"strings"
	"time"
)

// Event types: every state change of a sandbox or a build callers are
// told of (GET /v1/events).
const (
	EventSandboxCreated   = "sandbox.created"
	EventSandboxRunning   = "sandbox.running"
	EventSandboxPaused    = "sandbox.paused"
	EventSandboxSuspended = "sandbox.suspended"
	EventSandboxWoken     = "sandbox.woken"
	EventSandboxDeleted   = "sandbox.deleted"
	EventSandboxFailed    = "sandbox.failed"
	EventSandboxExpiring  = "sandbox.expiring"
	EventSandboxIdle      = "sandbox.idle"
	EventCheckpointReady  = "checkpoint.ready"
	EventBuildSucceeded   = "build.succeeded"
	EventBuildFailed      = "build.failed"
)

// EventTypes lists every event type.
var EventTypes = []string{EventSandboxCreated, EventSandboxRunning, EventSandboxPaused, EventSandboxSuspended,
	EventSandboxWoken, EventSandboxDeleted, EventSandboxFailed, EventSandboxExpiring, EventSandboxIdle,
	EventCheckpointReady, EventBuildSucceeded, EventBuildFailed}

// ValidEventType reports whether t names event types: one of EventTypes,
// or a kind followed by ".*" ("sandbox.*": every sandbox event).
func ValidEventType(t string) bool {
	for _, known := range EventTypes {
		if t == known {
			return true
		}
		if kind, ok := strings.CutSuffix(t, ".*"); ok && strings.HasPrefix(known, kind+".") {
			return true
		}
	}
	return false
}

// Event is one state change (GET /v1/events).
type Event struct {
	ID        string          `json:"id"`
	Seq       int64           `json:"seq"`
	Time      time.Time       `json:"time"`
	Type      string          `json:"type"`
	SandboxID string          `json:"sandbox_id,omitempty"`
	Data      json.RawMessage `json:"data"`
}

// Events is a page of events and the seq to ask after next.
type Events struct {
	Items   []Event `json:"items"`
	LastSeq int64   `json:"last_seq"`
}
