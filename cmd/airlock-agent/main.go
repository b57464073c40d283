// Command airlock-agent is PID 1 inside every sandbox VM. It is built
// static and placed in the initramfs by `airlock setup`; it refuses to run
// as any other process.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(log); err != nil {
		// As PID 1, exiting panics the kernel, which the host reports with
		// the console tail that this line ends.
		fmt.Fprintf(os.Stderr, "airlock-agent: %v\n", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	if os.Getpid() != 1 {
		return fmt.Errorf("must run as PID 1 inside a sandbox VM")
	}
	if err := agent.Boot(); err != nil {
		return err
	}
	port, err := agent.OpenPort(10 * time.Second)
	if err != nil {
		return err
	}
	a := agent.New(agent.Config{System: true, Log: log})
	return a.Serve(context.Background(), port, 20*time.Millisecond)
}
