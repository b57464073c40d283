package agentproto

import "strconv"

// The agent's binary has a probe mode for the bench: measurements of the
// guest's own floors, timed inside the guest by a process that a command
// in the sandbox starts. Every process in the guest can run the agent's
// binary as ProbeExe, since the agent is PID 1; the probe refuses to run
// as PID 1 and the agent as anything else, so one binary is both.
const (
	// ProbeExe is the agent's binary as a process in the guest sees it.
	ProbeExe = "/proc/1/exe"
	// ProbeCommand is the first argument that selects the probe mode.
	ProbeCommand = "probe"
)

// ProbeBlock is the block size of the probe's pipe copy: the size of
// each write of the dd it starts.
const ProbeBlock = 64 << 10

// SpawnProbe is what the spawn probe prints, as JSON: the duration of each
// of its runs of a program, in order.
type SpawnProbe struct {
	RunsNS []int64 `json:"runs_ns"`
}

// PipeProbe is what the pipe probe prints, as JSON: how many bytes it read
// from a pipe and how long that took, from before the writer started to
// after it was reaped.
type PipeProbe struct {
	Bytes int64 `json:"bytes"`
	NS    int64 `json:"ns"`
}

// ProbeSpawnArgv runs the program at path (absolute) runs times, each one
// started as the agent's exec starts a command (stdin /dev/null, stdout
// and stderr pipes read to their end, a process group of its own) and
// waited for; it prints a SpawnProbe.
func ProbeSpawnArgv(runs int, path string) []string {
	return []string{ProbeExe, ProbeCommand, "spawn", strconv.Itoa(runs), path}
}

// ProbePipeArgv copies bytes (a multiple of ProbeBlock) of zeros from dd
// through a pipe into the probe, which counts them; it prints a
// PipeProbe.
func ProbePipeArgv(bytes int64) []string {
	return []string{ProbeExe, ProbeCommand, "pipe", strconv.FormatInt(bytes, 10)}
}

// ProbePatternArgv is the argv that writes a pattern of bytes bytes (a
// multiple of 8) to stdout: each 8-byte word is its own offset in the
// stream, big-endian, so a reader can tell a byte lost, repeated or out
// of order.
func ProbePatternArgv(bytes int64) []string {
	return []string{ProbeExe, ProbeCommand, "pattern", strconv.FormatInt(bytes, 10)}
}
