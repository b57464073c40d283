package agent

import "testing"

func TestCommandsPidsMax(t *testing.T) {
	const lots = 1 << 40 // memory that does not bind
	for _, tc := range []struct {
		threads, pids int
		memory        int64
		want          int
	}{
		{1870, 32768, lots, 1870 - 256},    // threads-max binds, the reserve's floor
		{32768, 32768, lots, 32768 - 4096}, // an eighth kept
		{65536, 32768, lots, 32768 - 4096}, // pid_max binds
		{3700, 32768, 400 << 20, 800},      // a 512 MiB guest: memory binds, 512 KiB a pid
		{1870, 32768, 168 << 20, 336},      // a 256 MiB guest
		{256, 32768, lots, 0},              // nothing left
		{20, 32768, lots, 0},
		{1870, 32768, 0, 0},
	} {
		if got := commandsPidsMax(tc.threads, tc.pids, tc.memory); got != tc.want {
			t.Errorf("commandsPidsMax(%d, %d, %d) = %d, want %d", tc.threads, tc.pids, tc.memory, got, tc.want)
		}
	}
}

func TestCommandsMemoryMax(t *testing.T) {
	for _, tc := range []struct{ total, available, want int64 }{
		{240 << 20, 200 << 20, 168 << 20},                // a 256 MiB guest: the reserve's floor
		{1000 << 20, 900 << 20, 900<<20 - 1000<<20/16},   // a sixteenth kept
		{1000 << 20, 2000 << 20, 1000<<20 - 1000<<20/16}, // never more than the total
		{240 << 20, 30 << 20, 0},                         // nothing left
		{0, 0, 0},
	} {
		if got := commandsMemoryMax(tc.total, tc.available); got != tc.want {
			t.Errorf("commandsMemoryMax(%d, %d) = %d, want %d", tc.total, tc.available, got, tc.want)
		}
	}
}
