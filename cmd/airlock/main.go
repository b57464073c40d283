// Command airlock runs code in microVM sandboxes. See `airlock help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/airlockhq/airlock/internal/cli"
	"github.com/airlockhq/airlock/internal/datadir"
)

func main() {
	level := slog.LevelWarn
	if os.Getenv("AIRLOCK_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// The gateway's link package (gvisor-tap-vsock) logs through logrus's
	// global logger, an error line each time a VM's link ends, which is
	// how every gateway ends: the gateway silences it, unless debugging
	// sends its words to our log.
	if level == slog.LevelDebug {
		logrus.SetOutput(slogWriter{log})
	}
	env := &cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Log: log, Dir: datadir.Default()}
	err := cli.Run(context.Background(), env, os.Args[1:])
	var ee *cli.ExitError
	if cli.ExitCode(err) != 0 && !(errors.As(err, &ee) && ee.Err == nil) {
		fmt.Fprintf(os.Stderr, "airlock: %s\n", cli.Message(err))
	}
	os.Exit(cli.ExitCode(err))
}

// slogWriter writes each logrus line to a slog logger at debug level.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(p)), "component", "gateway link")
	return len(p), nil
}
