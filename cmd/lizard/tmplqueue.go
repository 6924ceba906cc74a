package main

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/tmplqueue"
)

// templateQueue is serve's background builds of built-in templates
// (--build-templates); its q is nil when there are none.
type templateQueue struct {
	q     *tmplqueue.Queue
	inner sandbox.Templates
}

// buildStatusFile is where a server's background builds are written for
// `lizard template ls`, in its data directory.
const buildStatusFile = "template-builds.json"

// newTemplateQueue makes the queue of --build-templates' built-in
// templates (comma-separated or repeated), built with the server's runtime
// on its build network; tmpls is what the sandbox service looks templates
// up in otherwise.
func newTemplateQueue(c *serveConfig, reg *template.Registry, rt runtime.Runner, run func(*exec.Cmd) error, opts template.DockerfileOptions,
	tmpls sandbox.Templates, log *slog.Logger) (*templateQueue, error) {
	var names []string
	for _, v := range c.buildTemplates {
		for _, n := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
			if !template.IsBuiltin(n) {
				return nil, fmt.Errorf("--build-templates: %q is not a built-in template (%s)", n, strings.Join(reg.Builtins(), ", "))
			}
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return &templateQueue{inner: tmpls}, nil
	}
	reg.BuildNetwork, reg.Runtime, reg.RunCommand = opts.Network(), rt, run
	q := tmplqueue.New(tmplqueue.Config{Builder: reg, Templates: tmpls, Names: names,
		StatusFile: filepath.Join(c.dataDir, buildStatusFile), Logger: log})
	return &templateQueue{q: q, inner: tmpls}, nil
}

// templates is what the sandbox service looks templates up in.
func (t *templateQueue) templates() sandbox.Templates {
	if t.q == nil {
		return t.inner
	}
	return t.q
}

// start builds the queue in the background until ctx is done or stop is
// called (the server's own templates loop publishes each built template
// and makes its ready state); stop returns once the build under way, if
// any, has stopped and removed what it made (its step containers are the
// server's runtime's: a server that exited first left them behind).
func (t *templateQueue) start(ctx context.Context) (stop func()) {
	if t.q == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.q.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// status is the queue's view for the API's template listing (nil: none).
func (t *templateQueue) status() func(name string) (tmplqueue.Status, bool) {
	if t.q == nil {
		return nil
	}
	return t.q.Status
}
