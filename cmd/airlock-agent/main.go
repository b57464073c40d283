// Command airlock-agent is PID 1 inside every sandbox VM. It is built
// static and placed in the initramfs by `airlock setup`. Run by a process
// in the guest as `/proc/1/exe probe ...`, it measures the guest's floors
// for the bench (agent.Probe) instead; it refuses to run otherwise.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentproto"
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
		// A process in the guest runs this binary again (as
		// agentproto.ProbeExe) to measure the guest's own floors.
		if len(os.Args) > 1 && os.Args[1] == agentproto.ProbeCommand {
			return agent.Probe(os.Args[2:], os.Stdout)
		}
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
