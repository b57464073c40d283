package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/airlockhq/airlock/internal/apiclient"
	"github.com/airlockhq/airlock/internal/apiv1"
	"github.com/airlockhq/airlock/internal/datadir"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// serverFlags are the flags of every command that talks to `airlock serve`.
type serverFlags struct {
	url string
}

func addServerFlags(fs *flagSet) *serverFlags {
	f := &serverFlags{}
	def := os.Getenv("AIRLOCK_URL")
	if def == "" {
		def = apiclient.DefaultURL
	}
	fs.StringVar(&f.url, "url", def, "`URL` of the airlock server; $AIRLOCK_URL sets the default")
	return f
}

// client returns a client of the server the flags name, with the API key
// of $AIRLOCK_API_KEY or of the admin key file.
func (f *serverFlags) client(env *Env) (*apiclient.Client, error) {
	if err := f.checkURL(); err != nil {
		return nil, err
	}
	key, err := apiKey(env.Dir)
	if err != nil {
		return nil, err
	}
	return apiclient.New(f.url, key), nil
}

// clientWithKey returns a client of the server the flags name with key.
func (f *serverFlags) clientWithKey(key string) (*apiclient.Client, error) {
	if err := f.checkURL(); err != nil {
		return nil, err
	}
	return apiclient.New(f.url, key), nil
}

// checkURL says whether --url is an http:// or https:// URL.
func (f *serverFlags) checkURL() error {
	u, err := url.Parse(f.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--url %q is not an http:// or https:// URL: %w", f.url, errdefs.ErrInvalid)
	}
	return nil
}

// adminKeyFile is where `airlock serve` writes the admin key.
func adminKeyFile(dir datadir.Dir) string { return dir.AdminKey() }

// apiKey is $AIRLOCK_API_KEY, else the admin key file when it is readable.
func apiKey(dir datadir.Dir) (string, error) {
	if k := strings.TrimSpace(os.Getenv("AIRLOCK_API_KEY")); k != "" {
		return k, nil
	}
	path := adminKeyFile(dir)
	b, err := os.ReadFile(path)
	switch {
	case err == nil && strings.TrimSpace(string(b)) != "":
		return strings.TrimSpace(string(b)), nil
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("no API key: set AIRLOCK_API_KEY (the admin key file %s is not readable by this user): %w", path, errdefs.ErrPrecondition)
	default:
		return "", fmt.Errorf("no API key: set AIRLOCK_API_KEY (or run where `airlock serve` wrote %s): %w", path, errdefs.ErrPrecondition)
	}
}

// secondsFlag is a whole number of seconds, given as a number ("90") or a
// duration ("90s", "15m", rounded up to whole seconds).
type secondsFlag struct {
	n   int
	set bool
}

func (s *secondsFlag) String() string {
	if s == nil || !s.set {
		return ""
	}
	return strconv.Itoa(s.n)
}

func (s *secondsFlag) Set(v string) error {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return fmt.Errorf("%q is negative", v)
		}
		s.n, s.set = n, true
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d.Seconds() > math.MaxInt32 {
		return fmt.Errorf("%q is not a number of seconds or a duration like 90s or 15m", v)
	}
	s.n, s.set = int(math.Ceil(d.Seconds())), true
	return nil
}

// parseInterspersed parses flags that may come before, between or after
// the positional arguments, which it returns. After "--" all is positional.
func parseInterspersed(fs *flagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// runGroup runs the subcommand args[0] of a command such as `airlock
// sandbox`.
func runGroup(ctx context.Context, env *Env, group, about string, subs []command, args []string) error {
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "%s\n\nUsage:\n  airlock %s COMMAND [FLAGS] [ARGS]\n\nCommands:\n", about, group)
		for _, c := range subs {
			fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		}
		fmt.Fprintf(w, "\nRun `airlock %s COMMAND -h` for a command's flags.\n", group)
	}
	if len(args) == 0 {
		usage(env.Stderr)
		return &ExitError{Code: 2, Err: fmt.Errorf("%s: no command given", group)}
	}
	switch args[0] {
	case "-h", "--help", "help":
		usage(env.Stdout)
		return nil
	}
	for _, c := range subs {
		if c.name == args[0] {
			return c.run(ctx, env, args[1:])
		}
	}
	return fmt.Errorf("unknown command %q: run `airlock %s help` for the list: %w", group+" "+args[0], group, errdefs.ErrInvalid)
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressAfter is how long a wait goes before it shows progress.
const progressAfter = time.Second

// waitOperation waits for op to finish. If that takes more than a second it
// shows "<doing> <target>… (N s)" on stderr: updated in place on a
// terminal, else once. A failed operation is an error with its message.
func waitOperation(ctx context.Context, env *Env, c *apiclient.Client, op apiv1.Operation, doing string) (apiv1.Operation, error) {
	if op.Done() {
		return op, opError(op)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { showProgress(env.Stderr, fmt.Sprintf("%s %s…", doing, op.TargetID), stop) })
	done, err := c.WaitOperation(ctx, op.ID)
	close(stop)
	wg.Wait()
	if err != nil {
		return op, err
	}
	return done, opError(done)
}

// showProgress writes msg with the time spent to w from progressAfter on,
// until stop is closed.
func showProgress(w io.Writer, msg string, stop <-chan struct{}) {
	start := time.Now()
	tick := time.NewTimer(progressAfter)
	defer tick.Stop()
	live := isTerminal(w)
	shown := false
	for {
		select {
		case <-stop:
			if shown && live {
				fmt.Fprint(w, "\r\033[K")
			}
			return
		case <-tick.C:
		}
		switch {
		case live:
			fmt.Fprintf(w, "\r\033[Kairlock: %s (%d s)", msg, int(time.Since(start).Seconds()))
			tick.Reset(time.Second)
		case !shown:
			fmt.Fprintf(w, "airlock: %s\n", msg)
		}
		shown = true
	}
}

// opError is the error of a failed operation, nil for others. It exits 1.
func opError(op apiv1.Operation) error {
	if err := op.Failure(); err != nil {
		return &ExitError{Code: 1, Err: err}
	}
	return nil
}

// formatTime is t as the API writes it, or "-" for none.
func formatTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// age is how long ago t was, in one short unit.
func age(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}
