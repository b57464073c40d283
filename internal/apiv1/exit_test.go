package apiv1

import (
	"encoding/json"
	"testing"
)

// A rolled back command's exit has a null exit_code on the wire and -1
// in Go; any other exit keeps its code both ways.
func TestExitEventJSON(t *testing.T) {
	for _, c := range []struct {
		ev   ExitEvent
		wire string
	}{
		{ExitEvent{ExitCode: -1, RolledBack: true}, `{"exit_code":null,"signal":null,"timed_out":false,"duration_ms":0,"rolled_back":true}`},
		{ExitEvent{ExitCode: 3, DurationMS: 12}, `{"exit_code":3,"signal":null,"timed_out":false,"duration_ms":12}`},
		{ExitEvent{}, `{"exit_code":0,"signal":null,"timed_out":false,"duration_ms":0}`},
	} {
		b, err := json.Marshal(c.ev)
		if err != nil || string(b) != c.wire {
			t.Errorf("marshal %+v: %s, %v; want %s", c.ev, b, err, c.wire)
		}
		var back ExitEvent
		if err := json.Unmarshal(b, &back); err != nil || back != c.ev {
			t.Errorf("unmarshal %s: %+v, %v; want %+v", b, back, err, c.ev)
		}
	}
}
