// Command airlock runs code in microVM sandboxes. See `airlock help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/airlockhq/airlock/internal/cli"
	"github.com/airlockhq/airlock/internal/datadir"
)

func main() {
	level := slog.LevelWarn
	if os.Getenv("AIRLOCK_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	env := &cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Log: log, Dir: datadir.Default()}
	err := cli.Run(context.Background(), env, os.Args[1:])
	var ee *cli.ExitError
	if cli.ExitCode(err) != 0 && !(errors.As(err, &ee) && ee.Err == nil) {
		fmt.Fprintf(os.Stderr, "airlock: %s\n", cli.Message(err))
	}
	os.Exit(cli.ExitCode(err))
}
