package fake_test

import (
	"os"
	"testing"

	"github.com/lizard-build/lizard/internal/agent/server"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/runtime/runtimetest"
)

// TestMain also serves as the agent's file helper (see package fake).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == server.FileOpCommand {
		os.Exit(server.FileOpMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func newRuntime(t *testing.T) (*fake.Runtime, runtimetest.Env) {
	t.Helper()
	rt, err := fake.New(fake.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return rt, runtimetest.Env{
		Rootfs: t.TempDir(), Leaks: rt.Leaks,
		Lacks: runtimetest.Capabilities{ProcessCheckpoints: true, Hostname: true, Mounts: true},
	}
}

func TestConformance(t *testing.T) {
	rt, env := newRuntime(t)
	runtimetest.Run(t, rt, env)
}

func TestCheckpointConformance(t *testing.T) {
	rt, env := newRuntime(t)
	runtimetest.RunCheckpointer(t, rt, env)
}
