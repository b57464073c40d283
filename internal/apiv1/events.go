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
	// EventCheckpointFailed and EventCheckpointDeleted end a checkpoint
	// that never became ready, and one that was deleted.
	EventCheckpointFailed  = "checkpoint.failed"
	EventCheckpointDeleted = "checkpoint.deleted"
	EventBuildSucceeded    = "build.succeeded"
	EventBuildFailed       = "build.failed"
)

// EventTypes lists every event type.
var EventTypes = []string{EventSandboxCreated, EventSandboxRunning, EventSandboxPaused, EventSandboxSuspended,
	EventSandboxWoken, EventSandboxDeleted, EventSandboxFailed, EventSandboxExpiring, EventSandboxIdle,
	EventCheckpointReady, EventCheckpointFailed, EventCheckpointDeleted, EventBuildSucceeded, EventBuildFailed}

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

// CreateWebhook is the body of POST /v1/webhooks.
type CreateWebhook struct {
	URL   string   `json:"url"`
	Types []string `json:"types,omitempty"`
	// Secret signs the deliveries; left out, one is made and shown once.
	Secret string `json:"secret,omitempty"`
}

// Webhook is a registered receiver of events.
type Webhook struct {
	ID        string    `json:"id"`
	URL       string    `json:"url"`
	Types     []string  `json:"types"`
	CreatedAt time.Time `json:"created_at"`
}

// WebhookCreated answers POST /v1/webhooks: the webhook, and the secret
// when the server made it (shown this once).
type WebhookCreated struct {
	Webhook
	Secret string `json:"secret,omitempty"`
}

// Delivery is one attempt to deliver an event to a webhook.
type Delivery struct {
	ID         string    `json:"id"`
	EventID    string    `json:"event_id"`
	EventType  string    `json:"event_type"`
	Attempt    int       `json:"attempt"`
	Status     int       `json:"status"`
	Error      string    `json:"error,omitempty"`
	DurationMS int64     `json:"duration_ms"`
	CreatedAt  time.Time `json:"created_at"`
}
