package agentclient

import (
	"errors"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// An agent older than file metadata ignores it and answers a write with
// no stat: a write that asked for metadata then fails, never succeeds
// without it.
func TestWrittenConfirmsMetadata(t *testing.T) {
	md := map[string]string{"k": "v"}
	tests := []struct {
		name string
		md   map[string]string
		res  agentproto.Result
		ok   bool
	}{
		{"no metadata, older agent", nil, agentproto.Result{}, true},
		{"no metadata", nil, agentproto.Result{Stat: &agentproto.Stat{Path: "/f"}}, true},
		{"metadata kept", md, agentproto.Result{Stat: &agentproto.Stat{Path: "/f", Metadata: map[string]string{"k": "v"}}}, true},
		{"metadata, older agent", md, agentproto.Result{}, false},
		{"metadata not kept", md, agentproto.Result{Stat: &agentproto.Stat{Path: "/f"}}, false},
		{"other metadata kept", md, agentproto.Result{Stat: &agentproto.Stat{Path: "/f", Metadata: map[string]string{"k": "w"}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := written("/f", tt.md, tt.res)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrPrecondition)) {
				t.Fatalf("got %v, want ok %v", err, tt.ok)
			}
		})
	}
}
