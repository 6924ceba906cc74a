// Package runtimetest is the conformance suite every runtime.Runtime backend
// must pass (after containerd's snapshots/testsuite): lifecycle, the agent
// answering at the reported address, idempotent destroy, errors for unknown
// ids, and no leaked host resources. Backends call Run from their tests.
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// Env is what the suite needs besides the runtime.
type Env struct {
	// Rootfs is a template root filesystem holding /bin/sh.
	Rootfs string
	// Leaks lists the host resources that sandbox id still holds (mounts,
	// cgroups, namespaces, veths, processes, files); empty when none.
	Leaks func(id string) []string
}

// Run runs the suite against the runtime made by newRuntime.
func Run(t *testing.T, rt runtime.Runtime, env Env) {
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, rt, env) })
	t.Run("CreateConflict", func(t *testing.T) { testConflict(t, rt, env) })
	t.Run("UnknownID", func(t *testing.T) { testUnknown(t, rt) })
	t.Run("FailedCreateLeavesNothing", func(t *testing.T) { testFailedCreate(t, rt, env) })
	t.Run("ParallelCreates", func(t *testing.T) { testParallel(t, rt, env) })
}

// NewID returns a fresh sandbox id for tests.
func NewID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

func spec(id, rootfs, token string) runtime.Spec {
	return runtime.Spec{ID: id, Rootfs: rootfs, AgentToken: token,
		Resources: runtime.Resources{CPUs: 1, MemoryMB: 1024, Pids: 1024, DiskMB: 1024}}
}

// WaitAgent polls the agent's /health at addr until it answers 200.
func WaitAgent(ctx context.Context, addr, token string) error {
	url := "http://" + net.JoinHostPort(addr, strconv.Itoa(agent.Port)) + "/health"
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set(agent.TokenHeader, token)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("health: %s", resp.Status)
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("agent at %s: %v", addr, last)
}

func state(t *testing.T, rt runtime.Runtime, id string) runtime.State {
	t.Helper()
	list, err := rt.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, sb := range list {
		if sb.ID == id {
			return sb.State
		}
	}
	return ""
}

func testLifecycle(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	sb, err := rt.Create(ctx, spec(id, env.Rootfs, "secret-token"))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !sb.Addr.IsValid() {
		t.Fatalf("Create returned no address")
	}
	if got := state(t, rt, id); got != runtime.StateCreated {
		t.Fatalf("after Create: state %q, want created", got)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("second Start must be a no-op: %v", err)
	}
	if got := state(t, rt, id); got != runtime.StateRunning {
		t.Fatalf("after Start: state %q, want running", got)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := WaitAgent(wctx, sb.Addr.String(), "secret-token"); err != nil {
		t.Fatalf("agent: %v", err)
	}
	// A wrong token is refused.
	req, _ := http.NewRequest("GET", "http://"+net.JoinHostPort(sb.Addr.String(), strconv.Itoa(agent.Port))+"/health", nil)
	req.Header.Set(agent.TokenHeader, "wrong")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: resp %v err %v, want 401", resp, err)
	}
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("second Stop must be a no-op: %v", err)
	}
	if got := state(t, rt, id); got != runtime.StateStopped {
		t.Fatalf("after Stop: state %q, want stopped", got)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if got := state(t, rt, id); got != "" {
		t.Fatalf("after Destroy: still listed as %q", got)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("second Destroy must be a no-op: %v", err)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("Destroy leaked: %v", leaks)
	}
}

func testConflict(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	if _, err := rt.Create(ctx, spec(id, env.Rootfs, "tok")); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := rt.Create(ctx, spec(id, env.Rootfs, "tok")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Create: %v, want ErrConflict", err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("Destroy of a created (never started) sandbox leaked: %v", leaks)
	}
}

func testUnknown(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := NewID()
	if err := rt.Start(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Start unknown: %v, want ErrNotFound", err)
	}
	if err := rt.Stop(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stop unknown: %v, want ErrNotFound", err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Errorf("Destroy unknown: %v, want nil", err)
	}
}

func testFailedCreate(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	id := NewID()
	missing := filepath.Join(os.TempDir(), "no-such-rootfs-"+id)
	if _, err := rt.Create(ctx, spec(id, missing, "tok")); err == nil {
		rt.Destroy(ctx, id)
		t.Fatalf("Create with a missing rootfs succeeded")
	}
	if got := state(t, rt, id); got != "" {
		t.Fatalf("failed Create still listed as %q", got)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("failed Create leaked: %v", leaks)
	}
	if _, err := rt.Create(ctx, runtime.Spec{ID: "Bad/Id", Rootfs: env.Rootfs}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Create with a bad id: %v, want ErrInvalid", err)
	}
}

func testParallel(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	const n = 4
	ids := make([]string, n)
	errc := make(chan error, n)
	for i := range ids {
		ids[i] = NewID()
		go func(id string) {
			sb, err := rt.Create(ctx, spec(id, env.Rootfs, "tok"))
			if err == nil {
				err = rt.Start(ctx, id)
			}
			if err == nil {
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				err = WaitAgent(wctx, sb.Addr.String(), "tok")
				cancel()
			}
			errc <- err
		}(ids[i])
	}
	var errs []string
	for range ids {
		if err := <-errc; err != nil {
			errs = append(errs, err.Error())
		}
	}
	for _, id := range ids {
		if err := rt.Destroy(ctx, id); err != nil {
			errs = append(errs, err.Error())
		}
		if leaks := env.Leaks(id); len(leaks) > 0 {
			errs = append(errs, fmt.Sprintf("%s leaked %v", id, leaks))
		}
	}
	if len(errs) > 0 {
		t.Fatalf("parallel creates: %s", strings.Join(errs, "; "))
	}
}
