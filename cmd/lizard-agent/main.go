// Command lizard-agent is PID 1 of every lizard sandbox: it serves the agent
// API (see package agent) on port agent.Port, authenticated by the token it
// reads from the environment at boot. It is built as a static binary
// (CGO_ENABLED=0) so that it runs in any image.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/agent/server"
)

func main() {
	// The agent re-executes itself to do file operations as sandbox users;
	// that mode must not parse flags or touch the environment.
	if len(os.Args) > 1 && os.Args[1] == server.FileOpCommand {
		os.Exit(server.FileOpMain(os.Args[2:]))
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(logger); err != nil {
		logger.Error("lizard-agent failed", "err", err)
		os.Exit(1)
	}
}

func run(logger *slog.Logger) error {
	addr := flag.String("addr", fmt.Sprintf(":%d", agent.Port), "TCP address to serve the agent API on")
	flag.Parse()

	token := os.Getenv(agent.EnvToken)
	// Commands never see the token: the server builds their environment
	// from scratch, and it is gone from ours too.
	os.Unsetenv(agent.EnvToken)
	if token == "" {
		return errors.New(agent.EnvToken + " is not set")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return server.Run(ctx, server.Config{Addr: *addr, Token: token, Logger: logger, EnvdTokenFile: agent.EnvdTokenFile,
		EgressCA: agent.EgressCAFile})
}
