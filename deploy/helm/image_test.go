package helm_test

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"sigs.k8s.io/yaml"
)

// image is deploy/Dockerfile, parsed as BuildKit parses it.
type image struct {
	args   map[string]string // global ARG defaults
	stages []instructions.Stage
}

func parseDockerfile(t *testing.T) image {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ast, err := parser.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("deploy/Dockerfile: %v", err)
	}
	var warnings []string
	lint := linter.New(&linter.Config{Warn: func(rule, desc, url, msg string, _ []parser.Range) {
		warnings = append(warnings, fmt.Sprintf("%s: %s", rule, msg))
	}})
	stages, metaArgs, err := instructions.Parse(ast.AST, lint)
	if err != nil {
		t.Fatalf("deploy/Dockerfile: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("deploy/Dockerfile: BuildKit's linter: %s", w)
	}
	img := image{args: map[string]string{}, stages: stages}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				img.args[kv.Key] = *kv.Value
			}
		}
	}
	return img
}

func submatch(t *testing.T, re string, b []byte) string {
	t.Helper()
	m := regexp.MustCompile(re).FindSubmatch(b)
	if m == nil {
		t.Fatalf("nothing matches %s", re)
	}
	return string(m[1])
}

// The image builds what the rest of the repository pins: the Go of go.mod,
// the runsc of the Makefile, with the Debian package's dependencies.
func TestDockerfileVersions(t *testing.T) {
	img := parseDockerfile(t)

	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if want := submatch(t, `(?m)^go (\S+)$`, gomod); img.args["GO_VERSION"] != want {
		t.Errorf("Dockerfile GO_VERSION %q, go.mod says %q", img.args["GO_VERSION"], want)
	}

	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if want := submatch(t, `(?m)^RUNSC_VERSION\s*\?=\s*(\S+)$`, mk); img.args["RUNSC_VERSION"] != want {
		t.Errorf("Dockerfile RUNSC_VERSION %q, the Makefile pins %q", img.args["RUNSC_VERSION"], want)
	}

	var nfpm struct {
		Depends []string `json:"depends"`
	}
	b, err := os.ReadFile("../nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &nfpm); err != nil || len(nfpm.Depends) == 0 {
		t.Fatalf("deploy/nfpm.yaml depends: %v %v", nfpm.Depends, err)
	}
	final := img.stages[len(img.stages)-1]
	var installed []string
	for _, c := range final.Commands {
		if run, ok := c.(*instructions.RunCommand); ok {
			line := strings.Join(run.CmdLine, " ")
			if _, pkgs, ok := strings.Cut(line, "apt-get install"); ok {
				for _, w := range strings.Fields(strings.Split(pkgs, "&&")[0]) {
					if !strings.HasPrefix(w, "-") && w != "\\" {
						installed = append(installed, w)
					}
				}
			}
		}
	}
	for _, d := range nfpm.Depends {
		if !slices.Contains(installed, d) {
			t.Errorf("the image does not install %s, a dependency of the Debian package (installs %v)", d, installed)
		}
	}
}

// What the final stage puts where is what the chart's lizard.toml names,
// and the build context holds (and does not ignore) what the image copies.
func TestDockerfilePaths(t *testing.T) {
	img := parseDockerfile(t)
	final := img.stages[len(img.stages)-1]
	if final.BaseName != "debian:bookworm-slim" {
		t.Errorf("final stage FROM %s: want Debian 12 like the hosts lizard supports", final.BaseName)
	}
	// Files the final image has, by path, from the stage or context that
	// made them.
	files := map[string]string{}
	ignore, err := os.ReadFile("../Dockerfile.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range img.stages {
		for _, c := range st.Commands {
			cp, ok := c.(*instructions.CopyCommand)
			if !ok {
				continue
			}
			for _, src := range cp.SourcePaths {
				if cp.From == "" {
					if _, err := os.Stat(path.Join("../..", src)); err != nil {
						t.Errorf("stage %s copies %s from the build context: %v", st.Name, src, err)
					}
					if !bytes.Contains(ignore, []byte("\n!"+strings.TrimPrefix(src, "./"))) {
						t.Errorf("stage %s copies %s, which Dockerfile.dockerignore leaves out", st.Name, src)
					}
				}
				if st.Name == final.Name {
					dst := cp.DestPath
					if strings.HasSuffix(dst, "/") && src != "/" {
						dst += path.Base(src)
					}
					files[path.Clean(dst)] = cp.From
				}
			}
		}
	}
	cfg := config(t, mustRender(t, minimal()))
	for key, from := range map[string]string{"runsc": "runsc", "agent": "lizard", "template-dir": "templates"} {
		p, _ := cfg[key].(string)
		if got, ok := files[p]; !ok || got != from {
			t.Errorf("lizard.toml %s = %q: the image has %v there (want it from %q); it has %v", key, p, got, from, files)
		}
	}
	if from, ok := files["/usr/lib/lizard/node-hook"]; !ok || from != "" {
		t.Errorf("the image has no /usr/lib/lizard/node-hook from the build context (the pod's hooks run it): %v", files)
	}
	if files["/usr/local/bin/lizard"] != "lizard" {
		t.Errorf("the image has no /usr/local/bin/lizard (the chart runs `lizard serve` from PATH): %v", files)
	}
}
