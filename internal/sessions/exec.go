package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/tenancy"
)

// execOutputCap bounds each of stdout and stderr in an exec answer.
const execOutputCap = 16 << 20

// ExecOutput is the answer of a unary exec: its result, with stdout and
// stderr kept in unlinked temporary files of at most execOutputCap each,
// so that the server holds neither in memory however many execs run.
// WriteJSON streams the whole answer; Close releases the files.
type ExecOutput struct {
	// Result is the exec's result; its Stdout and Stderr are empty (see
	// WriteJSON and Text).
	Result         apiv1.ExecResult
	stdout, stderr *spool
	// note is stderr when there are no files (a command that could not
	// start).
	note string
}

// WriteJSON writes the answer as apiv1.ExecResult's JSON, with the output
// as valid UTF-8 (each run of invalid bytes one U+FFFD) escaped as
// encoding/json escapes it, read from the files a piece at a time.
func (o *ExecOutput) WriteJSON(w io.Writer) error {
	r := o.Result
	head := fmt.Sprintf(`{"exit_code":%d,"signal":%s,"timed_out":%t,"stdout":"`, r.ExitCode, jsonOf(r.Signal), r.TimedOut)
	if _, err := io.WriteString(w, head); err != nil {
		return err
	}
	if err := o.stdout.writeJSON(w, ""); err != nil {
		return err
	}
	if _, err := io.WriteString(w, `","stderr":"`); err != nil {
		return err
	}
	if err := o.stderr.writeJSON(w, o.note); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\",\"truncated\":%t}\n", r.Truncated)
	return err
}

// Text returns the output as the JSON answer carries it.
func (o *ExecOutput) Text() (stdout, stderr string, err error) {
	var out, errOut strings.Builder
	if err := o.stdout.text(&out, ""); err != nil {
		return "", "", err
	}
	if err := o.stderr.text(&errOut, o.note); err != nil {
		return "", "", err
	}
	return out.String(), errOut.String(), nil
}

// Close releases the output's files.
func (o *ExecOutput) Close() error {
	return errors.Join(o.stdout.close(), o.stderr.close())
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// spool is one stream of an exec's output in an unlinked file, cut at max
// bytes. A nil spool holds nothing.
type spool struct {
	f         *os.File
	n, max    int64
	truncated bool
	err       error // the first write error; the output is then incomplete
}

// newSpool makes an unlinked file in dir, made if missing.
func newSpool(dir string, max int64) (*spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("exec output: %w", err)
	}
	f, err := os.CreateTemp(dir, "exec-*")
	if err != nil {
		return nil, fmt.Errorf("exec output: %w", err)
	}
	// The descriptor keeps it; nothing is left behind by a crash.
	if err := os.Remove(f.Name()); err != nil {
		return nil, errors.Join(fmt.Errorf("exec output: %w", err), f.Close())
	}
	return &spool{f: f, max: max}, nil
}

// Write keeps what fits under max and drops the rest, marking the spool
// truncated. It never fails: a file error is kept for writeJSON, so that
// the command is not held up by its output.
func (s *spool) Write(p []byte) (int, error) {
	n := len(p)
	if room := s.max - s.n; int64(len(p)) > room {
		s.truncated = true
		p = p[:max(room, 0)]
	}
	if len(p) > 0 && s.err == nil {
		if _, err := s.f.Write(p); err != nil {
			s.err = err
		}
		s.n += int64(len(p))
	}
	return n, nil
}

func (s *spool) close() error {
	if s == nil || s.f == nil {
		return nil
	}
	return s.f.Close()
}

// reader reads the spool from its start.
func (s *spool) reader() (io.Reader, error) {
	if s == nil {
		return strings.NewReader(""), nil
	}
	if s.err != nil {
		return nil, fmt.Errorf("exec output: %w", s.err)
	}
	return io.NewSectionReader(s.f, 0, s.n), nil
}

// writeJSON writes the spool's bytes, then extra, as the inside of a JSON
// string.
func (s *spool) writeJSON(w io.Writer, extra string) error {
	r, err := s.reader()
	if err != nil {
		return err
	}
	return writeJSONString(w, io.MultiReader(r, strings.NewReader(extra)))
}

// text writes the spool's bytes, then extra, as valid UTF-8.
func (s *spool) text(w io.Writer, extra string) error {
	r, err := s.reader()
	if err != nil {
		return err
	}
	return validUTF8(io.MultiReader(r, strings.NewReader(extra)), func(seg string) error {
		_, err := io.WriteString(w, seg)
		return err
	})
}

// writeJSONString writes what r reads as the inside of a JSON string:
// exactly what json.Marshal(strings.ToValidUTF8(all, "\uFFFD")) holds
// between its quotes, a piece of at most 64 KiB at a time.
func writeJSONString(w io.Writer, r io.Reader) error {
	return validUTF8(r, func(seg string) error {
		b, err := json.Marshal(seg)
		if err != nil {
			return err
		}
		_, err = w.Write(b[1 : len(b)-1])
		return err
	})
}

// validUTF8 reads r and hands emit what strings.ToValidUTF8 would make of
// all of it, in pieces: each ends with a whole rune, and the bytes after
// the last one (a rune cut in two, or invalid bytes) wait for the next.
// A run of invalid bytes that waits keeps at most one of them before a
// possible rune start: the run gives one U+FFFD however long it is.
func validUTF8(r io.Reader, emit func(string) error) error {
	const piece = 64 << 10
	buf := make([]byte, 0, piece+2*utf8.UTFMax)
	chunk := make([]byte, piece)
	for {
		n, rerr := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return rerr
		}
		end := len(buf)
		if rerr == nil {
			end = validEnd(buf)
		}
		if end > 0 {
			if err := emit(strings.ToValidUTF8(string(buf[:end]), string(utf8.RuneError))); err != nil {
				return err
			}
		}
		rest := buf[end:]
		if len(rest) > utf8.UTFMax-1 {
			// More than a cut rune: invalid bytes, then perhaps a rune's
			// start. One invalid byte stands for the run.
			rest = append([]byte{0xff}, rest[len(rest)-(utf8.UTFMax-1):]...)
		}
		buf = append(buf[:0], rest...)
		if errors.Is(rerr, io.EOF) {
			return nil
		}
	}
}

// validEnd is the end of the last whole, valid rune in b (0 if none).
func validEnd(b []byte) int {
	i := len(b)
	for i > 0 {
		if r, size := utf8.DecodeLastRune(b[:i]); r != utf8.RuneError || size > 1 {
			return i
		}
		i--
	}
	return 0
}

// Exec runs a command to its end and returns its output, kept on disk
// (see ExecOutput); the caller must Close it.
func (c *Commands) Exec(ctx context.Context, p tenancy.Principal, sbxID string, req apiv1.CommandRequest) (*ExecOutput, error) {
	x, err := toExec(req)
	if err != nil {
		return nil, err
	}
	if x.Stdin {
		return nil, fmt.Errorf("exec takes no stdin: create a command session for that: %w", errdefs.ErrInvalid)
	}
	// The sandbox is in use until the command ends.
	release, err := c.use(ctx, p, sbxID)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := c.sb.Running(ctx, p, sbxID); err != nil {
		return nil, err
	}
	box, vmCtx, err := c.sb.VM(sbxID)
	if err != nil {
		return nil, err
	}
	out := &ExecOutput{}
	if out.stdout, err = newSpool(c.execTmp(), execOutputCap); err != nil {
		return nil, err
	}
	if out.stderr, err = newSpool(c.execTmp(), execOutputCap); err != nil {
		return nil, errors.Join(err, out.Close())
	}
	proc, err := box.Exec(vmCtx, x, agentclient.Stdio{Stdout: out.stdout, Stderr: out.stderr})
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			c.m.commandEnded("exited")
			out.Result.ExitCode, out.note = 127, agentMessage(err)+"\n"
			return out, nil
		}
		return nil, errors.Join(err, out.Close())
	}
	c.m.following(1)
	select {
	case <-proc.Done():
	case <-ctx.Done():
		if err := proc.Signal(context.Background(), "KILL"); err != nil {
			c.log.Warn("kill an exec whose caller left", "sandbox", sbxID, "err", err)
		}
		<-proc.Done()
	}
	exit, err := box.Wait(proc)
	c.m.following(-1)
	if err != nil {
		c.m.commandEnded("lost")
		return nil, errors.Join(err, out.Close())
	}
	c.m.commandEnded("exited")
	c.streamed(int(out.stdout.n + out.stderr.n))
	out.Result = apiv1.ExecResult{ExitCode: exit.ExitCode, TimedOut: exit.TimedOut, Truncated: out.stdout.truncated || out.stderr.truncated}
	if exit.Signal != "" {
		sig := exit.Signal
		out.Result.Signal = &sig
	}
	return out, nil
}
