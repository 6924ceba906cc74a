package template

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestPlanSteps: steps become the Dockerfile builder's steps with the
// state each runs in, by E2B's rules (an image gives only its env, the
// default user is made first, COPY's owner is the current user, ENV
// expands $VAR).
func TestPlanSteps(t *testing.T) {
	base := baseInfo{Key: "k", Env: []string{"PATH=/usr/bin", "LANG=C"}, Workdir: "/img", User: "nobody", Cmd: []string{"python3"}}
	p, err := planSteps(Steps{
		From: "python:3.12-slim", FromImage: true, DefaultUser: "user",
		Steps: []Step{
			{Op: StepRun, Command: "apt-get update", User: "root"},
			{Op: StepEnv, Env: []EnvVar{{"PATH", "$PATH:/app/bin"}, {"MODE", "${LANG}-x $(date) $$"}}},
			{Op: StepWorkdir, Path: "/app"},
			{Op: StepCopy, Src: "./src/", Dest: "lib/", Chmod: 0o755},
			{Op: StepUser, Name: "app"},
			{Op: StepWorkdir, Path: "sub"},
			{Op: StepRun, Command: "make"},
		},
		StartCommand: []string{"/bin/sh", "-c", "serve"},
	}, base)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		Line                int
		Kind                stepKind
		Argv                []string
		User, Workdir, Dest string
		Chown               string
		WorkdirOwner        string
	}
	var steps []got
	for _, s := range p.Steps {
		steps = append(steps, got{s.Line, s.Kind, s.Argv, s.User, s.Workdir, s.Dest, s.Chown, s.WorkdirOwner})
	}
	want := []got{
		{0, stepUser, ensureUserArgv("user", true), "user", "", "", "", ""},
		{1, stepRun, []string{"/bin/sh", "-c", "apt-get update"}, "root", "", "", "", ""},
		{2, stepMeta, nil, "user", "", "", "", ""},
		{3, stepMeta, nil, "user", "", "", "", ""},
		{4, stepCopy, nil, "user", "/app", "lib/", "user", "user"},
		{5, stepUser, ensureUserArgv("app", false), "app", "/app", "", "", "user"},
		{6, stepMeta, nil, "app", "/app", "", "", "user"},
		{7, stepRun, []string{"/bin/sh", "-c", "make"}, "app", "/app/sub", "", "", "app"},
	}
	if !reflect.DeepEqual(steps, want) {
		t.Fatalf("steps:\n%+v\nwant\n%+v", steps, want)
	}
	if got := p.Steps[7].Env; !reflect.DeepEqual(got, []string{"PATH=/usr/bin:/app/bin", "LANG=C", "MODE=C-x $(date) $$"}) {
		t.Fatalf("env of the last RUN: %q", got)
	}
	if p.Steps[4].Srcs[0] != "src" || p.Steps[4].Chmod != 0o755 {
		t.Fatalf("COPY: %+v", p.Steps[4])
	}
	// The image's WORKDIR, USER and CMD are not the template's.
	if p.Workdir != "/app/sub" || p.User != "app" || p.WorkdirOwner != "app" || !reflect.DeepEqual(p.StartCommand, []string{"/bin/sh", "-c", "serve"}) {
		t.Fatalf("template: workdir %q user %q owner %q start %q", p.Workdir, p.User, p.WorkdirOwner, p.StartCommand)
	}
}

// TestPlanStepsFromTemplate: a template base gives its workdir, user and
// start command, which the steps may replace.
func TestPlanStepsFromTemplate(t *testing.T) {
	base := baseInfo{Key: "k", Workdir: "/srv", User: "user", Entrypoint: []string{"/bin/app"}, Cmd: []string{"-v"}, Ready: []string{"true"}}
	p, err := planSteps(Steps{From: "app", Steps: []Step{{Op: StepRun, Command: "true"}}}, base)
	if err != nil {
		t.Fatal(err)
	}
	if p.Steps[0].Workdir != "/srv" || p.Steps[0].User != "user" || !reflect.DeepEqual(p.StartCommand, []string{"/bin/app", "-v"}) ||
		!reflect.DeepEqual(p.ReadyCommand, []string{"true"}) {
		t.Fatalf("inherited: %+v", p)
	}
	p, err = planSteps(Steps{From: "app", StartCommand: []string{"other"}}, base)
	if err != nil || !reflect.DeepEqual(p.StartCommand, []string{"other"}) || p.ReadyCommand != nil {
		t.Fatalf("a start command of its own: %+v %v", p, err)
	}
}

// TestPlanStepsKeys: keys follow what a step does; Force makes one no
// layer has, and the steps after it follow from it.
func TestPlanStepsKeys(t *testing.T) {
	steps := []Step{{Op: StepRun, Command: "a"}, {Op: StepRun, Command: "b"}}
	key := func(s Steps) []string {
		p, err := planSteps(s, baseInfo{Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		k, out := p.FromKey, []string{}
		for _, st := range p.Steps {
			k = stepKey(k, st.KeyText, "")
			out = append(out, k)
		}
		return out
	}
	a, b := key(Steps{From: "t", Steps: steps}), key(Steps{From: "t", Steps: steps})
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("the same steps have other keys: %v %v", a, b)
	}
	forced := append([]Step(nil), steps...)
	forced[1].Force = true
	if f := key(Steps{From: "t", Steps: forced}); f[0] != a[0] || f[1] == a[1] {
		t.Fatalf("a forced second step: %v, unforced %v", f, a)
	}
	if f := key(Steps{From: "t", Steps: steps, Force: true}); f[0] == a[0] || f[1] == a[1] {
		t.Fatalf("a forced build reuses a key: %v %v", f, a)
	}
}

// TestPlanStepsInvalid: bad steps are ErrInvalid naming the step.
func TestPlanStepsInvalid(t *testing.T) {
	for _, c := range []struct {
		s    Steps
		step int
		want string
	}{
		{Steps{Steps: []Step{{Op: "FROB"}}}, 1, "unknown step type"},
		{Steps{Steps: []Step{{Op: StepRun}, {Op: StepRun, Command: " "}}}, 1, "needs a command"},
		{Steps{Steps: []Step{{Op: StepRun, Command: "x"}, {Op: StepCopy, Src: "../etc", Dest: "/x"}}}, 2, "outside the build context"},
		{Steps{Steps: []Step{{Op: StepCopy, Src: "a", Dest: "/x", Chmod: 0o17777}}}, 1, "mode"},
		{Steps{Steps: []Step{{Op: StepEnv, Env: []EnvVar{{"1A", "x"}}}}}, 1, "not a valid variable name"},
		{Steps{Steps: []Step{{Op: StepUser, Name: "Bad Name"}}}, 1, "not a valid user name"},
		{Steps{Steps: []Step{{Op: StepRun, Command: "x", User: "a;b"}}}, 1, "not a valid user name"},
		{Steps{Steps: []Step{{Op: StepWorkdir}}}, 1, "needs a path"},
		{Steps{DefaultUser: "x y"}, 0, "default user"},
		{Steps{ReadyCommand: []string{"true"}, FromImage: true}, 1, "needs a start command"},
		{Steps{Version: "a/b"}, 0, "version"},
	} {
		_, err := planSteps(c.s, baseInfo{Key: "k"})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrInvalid with %q", c.s, err, c.want)
			continue
		}
		if c.s.Version != "" {
			continue
		}
		if n, ok := FailedStep(err); !ok || n != c.step {
			t.Errorf("%+v: failed step %d %v, want %d", c.s, n, ok, c.step)
		}
	}
}
