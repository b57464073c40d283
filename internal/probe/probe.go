// Package probe measures a guest's own floors for the bench: how long the
// guest takes to spawn a program, and how fast a pipe moves bytes, timed
// inside the guest by a process that a command in the sandbox starts. It
// runs as cmd/airlock-probe, a static binary that the bench copies into a
// sandbox (to Exe) before it runs a probe there, so that the guest agent
// carries no bench code.
package probe

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Bounds of the probe's arguments, so that a typo cannot keep a guest busy
// for days.
const (
	maxProbeRuns  = 100_000
	maxProbeBytes = 1 << 40
)

// Run is airlock-probe's command line: args are its arguments, and the
// result goes to out as one line of JSON.
//
//	spawn N PATH  Spawn of N runs of the program at PATH
//	pipe BYTES    Pipe of BYTES through a pipe from dd
//	pattern BYTES BYTES of PatternArgv's pattern, itself
//	              the output rather than a result
func Run(args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "pattern" {
		return probePattern(args[1:], out)
	}
	res, err := probe(args)
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = out.Write(append(b, '\n'))
	return err
}

func probe(args []string) (any, error) {
	usage := errors.New("usage: probe spawn N PATH | probe pipe BYTES")
	if len(args) == 0 {
		return nil, usage
	}
	switch args[0] {
	case "spawn":
		if len(args) != 3 {
			return nil, usage
		}
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 || n > maxProbeRuns {
			return nil, fmt.Errorf("spawn: runs %q is not a number from 1 to %d", args[1], maxProbeRuns)
		}
		if !filepath.IsAbs(args[2]) {
			return nil, fmt.Errorf("spawn: %q is not an absolute path", args[2])
		}
		return probeSpawn(n, args[2])
	case "pipe":
		if len(args) != 2 {
			return nil, usage
		}
		n, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil || n < Block || n > maxProbeBytes || n%Block != 0 {
			return nil, fmt.Errorf("pipe: bytes %q is not a multiple of %d up to %d", args[1], Block, int64(maxProbeBytes))
		}
		return probePipe(n)
	}
	return nil, usage
}

// probeSpawn runs the program at path n times, one after another, and
// times each run from before its pipes are made to after it was reaped.
func probeSpawn(n int, path string) (Spawn, error) {
	res := Spawn{RunsNS: make([]int64, 0, n)}
	for i := 0; i < n; i++ {
		start := time.Now()
		c, err := startPiped(path, []string{path})
		if err != nil {
			return res, err
		}
		if err := c.finish(io.Discard); err != nil {
			return res, err
		}
		res.RunsNS = append(res.RunsNS, time.Since(start).Nanoseconds())
	}
	return res, nil
}

// probePipe starts dd writing size bytes of zeros to its stdout, a pipe,
// reads them all, and times that from before the pipes are made to after
// dd was reaped.
func probePipe(size int64) (Pipe, error) {
	path, err := exec.LookPath("dd")
	if err != nil {
		return Pipe{}, err
	}
	argv := []string{"dd", "if=/dev/zero", "bs=" + strconv.Itoa(Block),
		"count=" + strconv.FormatInt(size/Block, 10), "status=none"}
	var cw countWriter
	start := time.Now()
	c, err := startPiped(path, argv)
	if err != nil {
		return Pipe{}, err
	}
	if err := c.finish(&cw); err != nil {
		return Pipe{}, err
	}
	res := Pipe{Bytes: cw.n, NS: time.Since(start).Nanoseconds()}
	if cw.n != size {
		return res, fmt.Errorf("pipe: read %d bytes from dd, want %d", cw.n, size)
	}
	return res, nil
}

// piped is a process started by startPiped: ours are the read ends of its
// stdout and stderr.
type piped struct {
	name           string
	proc           *os.Process
	stdout, stderr *os.File
}

// startPiped starts the program at path with argv as the agent's exec
// starts a command without a terminal or stdin (Agent.run): /dev/null as
// stdin, a pipe each for stdout and stderr, a process group of its own,
// and this process's environment and working directory, which are the
// ones the agent's exec gave it.
func startPiped(path string, argv []string) (_ *piped, err error) {
	var child, ours []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if err != nil {
			for _, f := range ours {
				f.Close()
			}
		}
	}()
	in, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	child = append(child, in)
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		child, ours = append(child, w), append(ours, r)
	}
	p, err := os.StartProcess(path, argv, &os.ProcAttr{Env: os.Environ(), Files: child, Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return &piped{name: argv[0], proc: p, stdout: ours[0], stderr: ours[1]}, nil
}

// finish copies the process's stdout to w and keeps the start of its
// stderr, both to their end, reaps it, and fails unless it exited 0.
func (c *piped) finish(w io.Writer) error {
	var stderr bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(&stderr, io.LimitReader(c.stderr, 1<<10))
		io.Copy(io.Discard, c.stderr)
	}()
	cerr := copyOut(w, c.stdout)
	wg.Wait()
	c.stdout.Close()
	c.stderr.Close()
	st, err := c.proc.Wait()
	if err != nil {
		return fmt.Errorf("wait for %s: %w", c.name, err)
	}
	if !st.Success() {
		return fmt.Errorf("%s: %s: %s", c.name, st, strings.TrimSpace(stderr.String()))
	}
	if cerr != nil {
		return fmt.Errorf("read the output of %s: %w", c.name, cerr)
	}
	return nil
}

// copyOut copies r to w until r ends, reading up to ProbeBlock at a time
// (io.Copy would leave the size of the reads to the file's WriteTo).
func copyOut(w io.Writer, r io.Reader) error {
	buf := make([]byte, Block)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// countWriter counts what is written to it and drops it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// probePattern writes the pattern of PatternArgv: args is
// its size in bytes, a multiple of 8.
func probePattern(args []string, out io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: probe pattern BYTES")
	}
	n, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || n < 0 || n > maxProbeBytes || n%8 != 0 {
		return fmt.Errorf("pattern: bytes %q is not a multiple of 8 up to %d", args[0], int64(maxProbeBytes))
	}
	buf := make([]byte, 64<<10)
	for off := int64(0); off < n; {
		k := min(int64(len(buf)), n-off)
		for i := int64(0); i < k; i += 8 {
			binary.BigEndian.PutUint64(buf[i:], uint64(off+i))
		}
		if _, err := out.Write(buf[:k]); err != nil {
			return err
		}
		off += k
	}
	return nil
}
