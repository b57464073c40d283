// Package setup prepares a host to run sandboxes: it installs the Debian
// packages airlock uses, builds the guest boot artifacts and makes the
// built-in templates. Every step is idempotent, so running setup again
// only does what is missing and says so.
package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/guest"
	"github.com/airlockhq/airlock/internal/template"
)

// DefaultTemplates returns the built-in templates setup makes unless told
// otherwise.
func DefaultTemplates() []string { return []string{"tiny", "base", "code-interpreter"} }

// Config says what setup prepares.
type Config struct {
	// Dir is the data directory to fill. Required.
	Dir datadir.Dir
	// AgentPath is the static guest agent binary put into the initramfs.
	// Required.
	AgentPath string
	// Mirror is the Debian archive URL the base template is bootstrapped
	// from. Default: the one the host's apt configuration uses.
	Mirror string
	// Templates are the built-in templates to make. Default DefaultTemplates().
	Templates []string
	// Out receives one line per step with its duration, and progress while
	// a step runs. Nil discards them.
	Out io.Writer
	// Force rebuilds the boot artifacts and templates even when current.
	Force bool
}

// Validate checks the config before anything runs.
func (c Config) Validate() error {
	if c.Dir.Root == "" {
		return fmt.Errorf("setup: no data directory given: %w", errdefs.ErrInvalid)
	}
	if c.AgentPath == "" {
		return fmt.Errorf("setup: no guest agent binary given: %w", errdefs.ErrInvalid)
	}
	if fi, err := os.Stat(c.AgentPath); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("setup: guest agent %s is not a file: %w", c.AgentPath, errdefs.ErrInvalid)
	}
	for _, t := range c.Templates {
		if _, ok := template.LookupBuiltin(t); !ok {
			return fmt.Errorf("setup: %q is not a built-in template: %w", t, errdefs.ErrInvalid)
		}
	}
	return nil
}

// Ready reports whether setup has run: the boot artifacts and at least one
// template exist. It is cheap enough to call before every command.
func Ready(dir datadir.Dir) error {
	notSetUp := fmt.Errorf("airlock is not set up: run `sudo airlock setup`: %w", errdefs.ErrPrecondition)
	if err := guest.Check(dir); err != nil {
		return notSetUp
	}
	ts, err := template.Open(dir).List()
	if err != nil || len(ts) == 0 {
		return notSetUp
	}
	return nil
}

// Run performs the setup steps in order: Debian packages, guest boot
// artifacts, then each template. It stops at the first failing step with an
// error naming it; what earlier steps made stays, and no step leaves a
// partly written file, so running it again resumes.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(cfg.Templates) == 0 {
		cfg.Templates = DefaultTemplates()
	}
	out := &syncWriter{w: cfg.Out}
	if cfg.Out == nil {
		out.w = io.Discard
	}
	agent, err := filepath.Abs(cfg.AgentPath)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	cfg.AgentPath = agent

	if err := os.MkdirAll(cfg.Dir.Root, 0o755); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("setup: create data directory %s: run `sudo airlock setup` or set AIRLOCK_HOME: %w", cfg.Dir.Root, errdefs.ErrPrecondition)
		}
		return fmt.Errorf("setup: create data directory: %w", err)
	}
	unlock, err := lock(cfg.Dir)
	if err != nil {
		return err
	}
	defer unlock()

	store := template.Open(cfg.Dir)
	steps := []struct {
		name string
		run  func(ctx context.Context, out io.Writer) (string, error)
	}{
		{"packages", func(ctx context.Context, out io.Writer) (string, error) {
			return ensurePackages(ctx, out)
		}},
		{"boot", func(ctx context.Context, out io.Writer) (string, error) {
			m, err := guest.Build(ctx, guest.BuildConfig{Dir: cfg.Dir, AgentPath: cfg.AgentPath, Force: cfg.Force, Out: out})
			if err != nil {
				return "", err
			}
			if m.UpToDate {
				return upToDate, nil
			}
			return fmt.Sprintf("kernel %s, %d modules", m.KernelRelease, len(m.Modules)), nil
		}},
	}
	for _, name := range cfg.Templates {
		steps = append(steps, struct {
			name string
			run  func(ctx context.Context, out io.Writer) (string, error)
		}{name, func(ctx context.Context, out io.Writer) (string, error) {
			return ensureTemplate(ctx, store, name, cfg, out)
		}})
	}

	start := time.Now()
	changed := false
	for _, s := range steps {
		summary, err := runStep(ctx, out, s.name, s.run)
		if err != nil {
			return fmt.Errorf("setup step %s failed (re-run `airlock setup` to retry): %w", s.name, err)
		}
		changed = changed || summary != upToDate
	}
	if !changed {
		fmt.Fprintf(out, "airlock is set up; nothing to do (%s)\n", round(time.Since(start)))
	} else {
		fmt.Fprintf(out, "airlock is set up (%s)\n", round(time.Since(start)))
	}
	return nil
}

// upToDate is the summary of a step that found nothing to do.
const upToDate = "up to date"

// ensureTemplate makes the built-in template name unless a valid one exists.
func ensureTemplate(ctx context.Context, store *template.Store, name string, cfg Config, out io.Writer) (string, error) {
	if !cfg.Force {
		b, _ := template.LookupBuiltin(name)
		if t, err := store.Resolve(name); err == nil {
			switch err := store.Verify(ctx, t); {
			case err != nil:
				fmt.Fprintf(out, "stored %s is damaged; rebuilding\n", t.Ref())
			case t.Recipe != b.Defaults.Recipe:
				fmt.Fprintf(out, "stored %s was made from another recipe; rebuilding\n", t.Ref())
			default:
				return upToDate, nil
			}
		}
	}
	t, err := store.BuildBuiltin(ctx, name, template.BuildConfig{Cache: cfg.Dir.Cache(), Mirror: cfg.Mirror, Out: out})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %s, %d MiB image", t.Ref(), t.Digest[:19], t.SizeBytes>>20), nil
}

// runStep runs one step, indenting its output under its name and printing
// how long it has run whenever it has been quiet for a while. It prints the
// step's summary and duration when it ends.
func runStep(ctx context.Context, out *syncWriter, name string,
	fn func(ctx context.Context, out io.Writer) (string, error)) (string, error) {
	start := time.Now()
	fmt.Fprintf(out, "%s: ...\n", name)
	sub := &stepWriter{out: out, prefix: "  " + name + ": "}
	stop := make(chan struct{})
	done := make(chan struct{})
	// The heartbeat ends when the step returns (stop is closed).
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if sub.quietFor() >= 5*time.Second {
					fmt.Fprintf(sub, "working (%s)\n", round(time.Since(start)))
				}
			}
		}
	}()
	summary, err := fn(ctx, sub)
	close(stop)
	<-done
	sub.flush()
	if err != nil {
		fmt.Fprintf(out, "%s: failed (%s)\n", name, round(time.Since(start)))
		return "", err
	}
	fmt.Fprintf(out, "%s: %s (%s)\n", name, summary, round(time.Since(start)))
	return summary, nil
}

// round makes a duration readable.
func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// stepWriter prefixes each line a step writes and remembers when it last
// wrote, for the heartbeat.
type stepWriter struct {
	out    io.Writer
	prefix string

	mu      sync.Mutex // guards partial and last
	partial []byte
	last    time.Time
}

func (s *stepWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = time.Now()
	s.partial = append(s.partial, p...)
	for {
		i := strings.IndexByte(string(s.partial), '\n')
		if i < 0 {
			break
		}
		line := s.partial[:i+1]
		if _, err := io.WriteString(s.out, s.prefix+string(line)); err != nil {
			return 0, err
		}
		s.partial = s.partial[i+1:]
	}
	return len(p), nil
}

// flush writes a final line without its newline.
func (s *stepWriter) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.partial) > 0 {
		io.WriteString(s.out, s.prefix+string(s.partial)+"\n")
		s.partial = nil
	}
}

// quietFor is how long since the step last wrote.
func (s *stepWriter) quietFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last.IsZero() {
		s.last = time.Now()
	}
	return time.Since(s.last)
}

// lock takes an exclusive lock on the data directory for the duration of
// setup, so two setups do not build the same files at once.
func lock(dir datadir.Dir) (func(), error) {
	path := filepath.Join(dir.Root, ".setup.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("setup: lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("setup: another `airlock setup` is running on %s: %w", dir.Root, errdefs.ErrConflict)
	}
	return func() { f.Close() }, nil
}
