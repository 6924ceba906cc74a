// Command lizard is the self-hosted Lizard sandbox server and its operator
// CLI: `lizard serve`, `lizard projects`, `lizard keys`, `lizard template`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lizard:", err)
		os.Exit(1)
	}
}
