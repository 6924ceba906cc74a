// Command lizard is the self-hosted Lizard sandbox server and its operator
// CLI: `lizard serve`, `lizard projects`, `lizard keys`, `lizard template`,
// and `lizard sandbox`, a client of the HTTP API.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[1:]); err != nil {
		var st exitStatus
		if errors.As(err, &st) {
			// A remote command's status (sandbox exec, sandbox shell).
			stop()
			os.Exit(int(st))
		}
		fmt.Fprintln(os.Stderr, "lizard:", err)
		os.Exit(1)
	}
}
