// Package filesystem is the generated Go code (protoc-gen-go) of envd's
// filesystem service, filesystem.proto: the messages of E2B's Filesystem
// RPCs (Stat, MakeDir, Move, ListDir, Remove, WatchDir and the watcher
// calls) that lizard-agent serves (internal/agent/server/envd_fs.go). make
// proto regenerates it; this file is not generated.
package filesystem
