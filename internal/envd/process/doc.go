// Package process is the generated Go code (protoc-gen-go) of envd's
// process service, process.proto: the messages of E2B's Process RPCs
// (Start, Connect, List, SendInput, StreamInput, SendSignal, Update) that
// lizard-agent serves (internal/agent/server/envd_process.go). make proto
// regenerates it; this file is not generated.
package process
