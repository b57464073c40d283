// Command airlock-probe measures a guest's floors for the bench
// (internal/probe): the bench copies it into a sandbox and runs it there.
package main

import (
	"fmt"
	"os"

	"github.com/airlockhq/airlock/internal/probe"
)

func main() {
	if err := probe.Run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "airlock-probe: %v\n", err)
		os.Exit(1)
	}
}
