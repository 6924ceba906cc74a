package template

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func fakeBase(env ...string) baseResolver {
	return func(name string, line int) (baseInfo, error) {
		if name != "base" {
			return baseInfo{}, errdefs.ErrNotFound
		}
		return baseInfo{Env: env, Key: fromKey("base", "v1", "t")}, nil
	}
}

func plan(t *testing.T, df string, args map[string]string) *dfPlan {
	t.Helper()
	p, err := parseDockerfile("Dockerfile", []byte(df), args, fakeBase("PATH=/usr/bin:/bin", "LANG=C.UTF-8"))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return p
}

func TestParseDockerfile(t *testing.T) {
	p := plan(t, `# comment
ARG BASE=base
FROM ${BASE}
ARG VERSION=1.0
ENV APP=/opt/app \
    PATH=/opt/bin:$PATH
WORKDIR $APP
WORKDIR sub
RUN echo "$VERSION" > v.txt
RUN ["/bin/echo", "exec", "form"]
COPY --chown=user:user --chmod=0640 a.txt b.txt ./
ADD data/ /data/
USER user:user
CMD python3 -m http.server
`, nil)
	if p.From != "base" {
		t.Errorf("From = %q", p.From)
	}
	if want := []string{"PATH=/opt/bin:/usr/bin:/bin", "LANG=C.UTF-8", "APP=/opt/app"}; !slices.Equal(p.Env, want) {
		t.Errorf("Env = %q, want %q", p.Env, want)
	}
	if p.Workdir != "/opt/app/sub" || p.User != "user:user" {
		t.Errorf("Workdir, User = %q, %q", p.Workdir, p.User)
	}
	if want := []string{"/bin/sh", "-c", "python3 -m http.server"}; !slices.Equal(p.StartCommand, want) {
		t.Errorf("StartCommand = %q", p.StartCommand)
	}
	var ops []string
	for _, s := range p.Steps {
		ops = append(ops, s.Op)
	}
	if want := []string{"ARG", "ENV", "WORKDIR", "WORKDIR", "RUN", "RUN", "COPY", "ADD", "USER", "CMD"}; !slices.Equal(ops, want) {
		t.Fatalf("ops = %q, want %q", ops, want)
	}
	run := p.Steps[4]
	if !slices.Equal(run.Argv, []string{"/bin/sh", "-c", `echo "$VERSION" > v.txt`}) || run.Workdir != "/opt/app/sub" || run.Kind != stepRun {
		t.Errorf("shell RUN = %+v", run)
	}
	// ARGs are in RUN's environment (not in the template's).
	if v, _ := lookupEnv(run.Env, "VERSION"); v != "1.0" {
		t.Errorf("RUN env %q lacks VERSION=1.0", run.Env)
	}
	if _, ok := lookupEnv(p.Env, "VERSION"); ok {
		t.Errorf("ARG VERSION leaked into the template's env")
	}
	if !slices.Equal(p.Steps[5].Argv, []string{"/bin/echo", "exec", "form"}) {
		t.Errorf("exec RUN argv = %q", p.Steps[5].Argv)
	}
	cp := p.Steps[6]
	if !slices.Equal(cp.Srcs, []string{"a.txt", "b.txt"}) || cp.Dest != "/opt/app/sub/" || cp.Chown != "user:user" || cp.Chmod != 0o640 {
		t.Errorf("COPY = %+v", cp)
	}
	add := p.Steps[7]
	if !add.Add || add.Dest != "/data/" || !slices.Equal(add.Srcs, []string{"data"}) {
		t.Errorf("ADD = %+v", add)
	}
}

func TestParseDockerfileArgs(t *testing.T) {
	df := "ARG V=global\nFROM base\nARG V\nARG W=${V}-w\nENV X=$W\nRUN echo $V\n"
	p := plan(t, df, nil)
	if v, _ := lookupEnv(p.Env, "X"); v != "global-w" {
		t.Errorf("X = %q, want global-w (a redeclared global ARG keeps its value)", v)
	}
	p = plan(t, df, map[string]string{"V": "cli", "UNUSED": "x"})
	if v, _ := lookupEnv(p.Env, "X"); v != "cli-w" {
		t.Errorf("X = %q, want cli-w (--build-arg wins)", v)
	}
	if !slices.ContainsFunc(p.Warnings, func(w string) bool { return strings.Contains(w, "UNUSED") }) {
		t.Errorf("no warning about the unused build arg: %q", p.Warnings)
	}
	// ENV over ARG of the same name.
	p = plan(t, "FROM base\nARG A=arg\nENV A=env\nENV B=$A\n", nil)
	if v, _ := lookupEnv(p.Env, "B"); v != "env" {
		t.Errorf("B = %q, want env", v)
	}
	// ENTRYPOINT + CMD.
	p = plan(t, "FROM base\nENTRYPOINT [\"/bin/app\"]\nCMD [\"--port\", \"80\"]\n", nil)
	if !slices.Equal(p.StartCommand, []string{"/bin/app", "--port", "80"}) {
		t.Errorf("StartCommand = %q", p.StartCommand)
	}
	// A RUN heredoc is the script.
	p = plan(t, "FROM base\nRUN <<EOF\necho a\necho b\nEOF\n", nil)
	if got := p.Steps[0].Argv; len(got) != 3 || got[2] != "echo a\necho b\n" {
		t.Errorf("heredoc argv = %q", got)
	}
}

func TestParseDockerfileErrors(t *testing.T) {
	for _, c := range []struct{ df, want string }{
		{"FROM base\nFROBNICATE x\n", "Dockerfile:2: unknown instruction FROBNICATE"},
		{"RUN true\n", "Dockerfile:1: RUN before FROM"},
		{"FROM base\nFROM base\n", "multi-stage"},
		{"FROM base\nCOPY --from=x a b\n", "multi-stage"},
		{"FROM base\nADD https://example.com/x.tgz /x\n", "adding URLs is not supported"},
		{"FROM base\nCOPY ../secret /x\n", "outside the build context"},
		{"FROM base\nCOPY a b c\n", "ending with /"},
		{"FROM base\nHEALTHCHECK CMD true\n", "HEALTHCHECK without CMD"},
		{"FROM base\nRUN --mount=type=cache,target=/x true\n", "RUN --mount=type=cache,target=/x is not supported"},
		{"FROM debian:bookworm\n", "container registry"},
		{"FROM nosuch\n", "no such lizard template"},
		{"ENV A=b\n", "ENV before FROM"},
		{"# nothing\n", "no instructions"},
		{"ARG A=1\n", "no FROM"},
	} {
		res := func(name string, line int) (baseInfo, error) {
			if name == "base" {
				return baseInfo{Key: "k"}, nil
			}
			why := "no such lizard template"
			if looksLikeImage(name) {
				why = "cannot pull the image from its container registry"
			}
			return baseInfo{}, errors.New(why)
		}
		_, err := parseDockerfile("Dockerfile", []byte(c.df), nil, res)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.df, err, c.want)
		}
	}
}

// keys computes the key chain of a plan the way the build does, with
// COPY/ADD content hashed from ctx.
func keys(t *testing.T, p *dfPlan, ctx string) []string {
	t.Helper()
	key := p.FromKey
	var out []string
	for _, s := range p.Steps {
		content := ""
		if s.Kind == stepCopy {
			srcs, err := expandSources(ctx, s.Srcs)
			if err != nil {
				t.Fatal(err)
			}
			if content, _, err = hashSources(srcs); err != nil {
				t.Fatal(err)
			}
		}
		key = stepKey(key, s.KeyText, content)
		out = append(out, key)
	}
	return out
}

func TestCacheKeys(t *testing.T) {
	ctx := t.TempDir()
	os.WriteFile(filepath.Join(ctx, "a.txt"), []byte("one"), 0o644)
	df := "FROM base\nARG V=1\nRUN echo $V\nCOPY a.txt /a.txt\nENV E=1\nRUN echo last\n"
	k1 := keys(t, plan(t, df, nil), ctx)
	if again := keys(t, plan(t, df, nil), ctx); !slices.Equal(k1, again) {
		t.Fatalf("keys are not deterministic")
	}
	// Editing the last line changes only the last key.
	k2 := keys(t, plan(t, strings.Replace(df, "echo last", "echo changed", 1), nil), ctx)
	if !slices.Equal(k1[:len(k1)-1], k2[:len(k2)-1]) || k1[len(k1)-1] == k2[len(k2)-1] {
		t.Errorf("last-line edit: keys %v → %v", k1, k2)
	}
	// A build arg changes its ARG and everything after.
	k3 := keys(t, plan(t, df, map[string]string{"V": "2"}), ctx)
	for i := range k1 {
		if k1[i] == k3[i] {
			t.Errorf("--build-arg V=2: key %d unchanged", i)
		}
	}
	// The content of a copied file changes its COPY and what follows, not
	// what comes before.
	os.WriteFile(filepath.Join(ctx, "a.txt"), []byte("two"), 0o644)
	k4 := keys(t, plan(t, df, nil), ctx)
	if k4[0] != k1[0] || k4[1] != k1[1] || k4[2] == k1[2] || k4[4] == k1[4] {
		t.Errorf("content edit: keys %v → %v", k1, k4)
	}
	// Another base build changes everything.
	p, err := parseDockerfile("Dockerfile", []byte(df), nil, func(string, int) (baseInfo, error) {
		return baseInfo{Key: fromKey("base", "v2", "t")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if k5 := keys(t, p, ctx); k5[0] == k1[0] {
		t.Errorf("a new base build kept the first key")
	}
}

func TestExpandSourcesRefusesEscapes(t *testing.T) {
	ctx := t.TempDir()
	os.Mkdir(filepath.Join(ctx, "d"), 0o755)
	os.WriteFile(filepath.Join(ctx, "d", "f"), []byte("x"), 0o644)
	os.Symlink("/etc", filepath.Join(ctx, "link"))
	if _, err := expandSources(ctx, []string{"link/passwd"}); err == nil {
		t.Errorf("a source through a symlink out of the context was accepted")
	}
	got, err := expandSources(ctx, []string{"d/*"})
	if err != nil || len(got) != 1 || got[0].Rel != "d/f" {
		t.Errorf("glob: %v, %v", got, err)
	}
	if _, err := expandSources(ctx, []string{"missing"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing source: %v", err)
	}
}

func TestParseHealthcheck(t *testing.T) {
	p := plan(t, "FROM base\nHEALTHCHECK --interval=5s CMD curl -sf http://127.0.0.1:8000/\nCMD [\"app\"]\n", nil)
	if want := []string{"/bin/sh", "-c", "curl -sf http://127.0.0.1:8000/"}; !slices.Equal(p.ReadyCommand, want) {
		t.Errorf("ReadyCommand = %q, want %q", p.ReadyCommand, want)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "--interval=5s") {
		t.Errorf("Warnings = %q, want one naming the ignored option", p.Warnings)
	}
	p = plan(t, "FROM base\nCMD [\"app\"]\nHEALTHCHECK CMD [\"test\", \"-f\", \"/tmp/up\"]\n", nil)
	if want := []string{"test", "-f", "/tmp/up"}; !slices.Equal(p.ReadyCommand, want) {
		t.Errorf("exec form: ReadyCommand = %q", p.ReadyCommand)
	}
	p = plan(t, "FROM base\nHEALTHCHECK CMD true\nHEALTHCHECK NONE\nCMD [\"app\"]\n", nil)
	if p.ReadyCommand != nil {
		t.Errorf("HEALTHCHECK NONE: ReadyCommand = %q", p.ReadyCommand)
	}
	for _, df := range []string{
		"FROM base\nHEALTHCHECK CMD true\n",              // nothing to check
		"FROM base\nHEALTHCHECK PING x\nCMD [\"app\"]\n", // neither CMD nor NONE
		"FROM base\nHEALTHCHECK --bogus=1 CMD true\nCMD [\"app\"]\n",
	} {
		_, err := parseDockerfile("Dockerfile", []byte(df), nil, fakeBase())
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: err = %v, want ErrInvalid", df, err)
		}
	}
}

func TestParseInheritsBase(t *testing.T) {
	base := func(string, int) (baseInfo, error) {
		return baseInfo{Key: "k", Env: []string{"A=1"}, Workdir: "/srv", User: "app", Cmd: []string{"serve"}, Ready: []string{"check"}}, nil
	}
	p, err := parseDockerfile("Dockerfile", []byte("FROM web\nRUN true\n"), nil, base)
	if err != nil {
		t.Fatal(err)
	}
	if p.Workdir != "/srv" || p.User != "app" || !slices.Equal(p.StartCommand, []string{"serve"}) || !slices.Equal(p.ReadyCommand, []string{"check"}) || !slices.Equal(p.Env, []string{"A=1"}) {
		t.Fatalf("inherited: workdir %q user %q start %q ready %q env %q", p.Workdir, p.User, p.StartCommand, p.ReadyCommand, p.Env)
	}
	if st := p.Steps[0]; st.Workdir != "/srv" || st.User != "app" {
		t.Fatalf("RUN runs in %q as %q, want the base's", st.Workdir, st.User)
	}
	// ENTRYPOINT resets the base's CMD.
	p, err = parseDockerfile("Dockerfile", []byte("FROM web\nENTRYPOINT [\"app\"]\n"), nil, base)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.StartCommand, []string{"app"}) {
		t.Fatalf("ENTRYPOINT over a base CMD: %q", p.StartCommand)
	}
	// CMD over a base's ENTRYPOINT keeps the ENTRYPOINT, as in Docker.
	withEntry := func(string, int) (baseInfo, error) {
		return baseInfo{Key: "k", Entrypoint: []string{"app"}, Cmd: []string{"--port", "1"}}, nil
	}
	p, err = parseDockerfile("Dockerfile", []byte("FROM web\nCMD [\"--port\", \"2\"]\n"), nil, withEntry)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.StartCommand, []string{"app", "--port", "2"}) || !slices.Equal(p.Entrypoint, []string{"app"}) {
		t.Fatalf("CMD over a base ENTRYPOINT: start %q entrypoint %q", p.StartCommand, p.Entrypoint)
	}
}
