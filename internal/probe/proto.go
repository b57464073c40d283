package probe

import "strconv"

// Exe is where the bench puts the airlock-probe binary in a guest before
// it runs a probe there (the guest's /tmp is a tmpfs that allows exec).
const Exe = "/tmp/airlock-probe"

// Block is the block size of the probe's pipe copy: the size of each
// write of the dd it starts.
const Block = 64 << 10

// Spawn is what the spawn probe prints, as JSON: the duration of each of
// its runs of a program, in order.
type Spawn struct {
	RunsNS []int64 `json:"runs_ns"`
}

// Pipe is what the pipe probe prints, as JSON: how many bytes it read
// from a pipe and how long that took, from before the writer started to
// after it was reaped.
type Pipe struct {
	Bytes int64 `json:"bytes"`
	NS    int64 `json:"ns"`
}

// SpawnArgv runs the program at path (absolute) runs times, each one
// started as the agent's exec starts a command (stdin /dev/null, stdout
// and stderr pipes read to their end, a process group of its own) and
// waited for; it prints a Spawn.
func SpawnArgv(runs int, path string) []string {
	return []string{Exe, "spawn", strconv.Itoa(runs), path}
}

// PipeArgv copies bytes (a multiple of Block) of zeros from dd through a
// pipe into the probe, which counts them; it prints a Pipe.
func PipeArgv(bytes int64) []string {
	return []string{Exe, "pipe", strconv.FormatInt(bytes, 10)}
}

// PatternArgv is the argv that writes a pattern of bytes bytes (a
// multiple of 8) to stdout: each 8-byte word is its own offset in the
// stream, big-endian, so a reader can tell a byte lost, repeated or out
// of order.
func PatternArgv(bytes int64) []string {
	return []string{Exe, "pattern", strconv.FormatInt(bytes, 10)}
}
