// Package filesystemconnect is the generated Connect code
// (protoc-gen-connect-go) of envd's filesystem service: the handler
// lizard-agent mounts and the client its tests use. make proto regenerates
// it; this file is not generated.
package filesystemconnect
