package agent

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// A filesystem that keeps no extended attributes, or no more of them,
// is said so; other failures keep their errno for toProtoError.
func TestMetadataError(t *testing.T) {
	tests := []struct {
		err  error
		code string
		says string
	}{
		{unix.ENOTSUP, agentproto.CodeInvalid, "keeps no user extended attributes"},
		{unix.E2BIG, agentproto.CodeInvalid, "no room"},
		{unix.ERANGE, agentproto.CodeInvalid, "no room"},
		{unix.ENOSPC, agentproto.CodeNoSpace, "no space"},
		{unix.EIO, agentproto.CodeInternal, "input/output"},
	}
	for _, tt := range tests {
		got := toProtoError(metadataError("k", tt.err))
		if got.Code != tt.code || !strings.Contains(got.Message, tt.says) {
			t.Errorf("%v: %+v, want code %s saying %q", tt.err, got, tt.code, tt.says)
		}
	}
	if !errors.Is(metadataError("k", unix.ENOSPC), unix.ENOSPC) {
		t.Error("ENOSPC is not kept")
	}
}
