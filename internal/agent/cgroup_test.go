package agent

import "testing"

func TestCommandsPidsMax(t *testing.T) {
	for _, tc := range []struct{ threads, pids, want int }{
		{1870, 32768, 1870 - 256},    // a 256 MiB guest: threads-max binds, the reserve's floor
		{32768, 32768, 32768 - 4096}, // a large guest: an eighth kept
		{65536, 32768, 32768 - 4096}, // pid_max binds
		{256, 32768, 0},              // nothing left
		{20, 32768, 0},
	} {
		if got := commandsPidsMax(tc.threads, tc.pids); got != tc.want {
			t.Errorf("commandsPidsMax(%d, %d) = %d, want %d", tc.threads, tc.pids, got, tc.want)
		}
	}
}
