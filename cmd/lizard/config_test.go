package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lizard.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// unsetenv unsets variables for the test, restoring them after.
func unsetenv(t *testing.T, names ...string) {
	for _, n := range names {
		t.Setenv(n, "")
		os.Unsetenv(n)
	}
}

// configured parses args for serve and returns the resulting configuration.
func configured(t *testing.T, args ...string) (serveConfig, error) {
	t.Helper()
	var c serveConfig
	_, err := configure(serveFlags(&c), args)
	return c, err
}

func TestConfigPrecedence(t *testing.T) {
	path := writeConfig(t, `# a comment
listen = "127.0.0.1:9000"
max-sandboxes = 7
log-level = "warn"
domain = "file.example"
max-volume-gb = 9
`)
	t.Setenv("LIZARD_CONFIG", "")
	t.Setenv("LIZARD_MAX_SANDBOXES", "8")
	t.Setenv("LIZARD_LOG_LEVEL", "error")
	unsetenv(t, "LIZARD_MAX_VOLUME_GB", "LIZARD_LISTEN", "LIZARD_DOMAIN", "LIZARD_SUBNET")

	c, err := configured(t, "--config", path, "--log-level", "debug", "--domain=flag.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key, got, want string
	}{
		{"listen (file)", c.listen, "127.0.0.1:9000"},
		{"subnet (default)", c.subnet, "10.250.0.0/16"},
		{"log-level (flag over env and file)", c.logLevel, "debug"},
		{"domain (flag over file)", c.domain, "flag.example"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.key, tc.got, tc.want)
		}
	}
	if c.maxSandboxes != 8 {
		t.Errorf("max-sandboxes (env over file) = %d, want 8", c.maxSandboxes)
	}
	if c.maxVolumeGB != 9 {
		t.Errorf("max-volume-gb (file) = %d, want 9", c.maxVolumeGB)
	}

	// LIZARD_CONFIG names the file when --config does not.
	t.Setenv("LIZARD_CONFIG", path)
	c, err = configured(t)
	if err != nil {
		t.Fatal(err)
	}
	if c.listen != "127.0.0.1:9000" || c.logLevel != "error" {
		t.Errorf("with LIZARD_CONFIG: listen %q log-level %q, want the file's listen and the env's level", c.listen, c.logLevel)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Setenv("LIZARD_CONFIG", "")
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"unknown key", "listen = \"127.0.0.1:1\"\n\n# comment\nlisten-addr = \"x\"\n", []string{":4: unknown key \"listen-addr\""}},
		{"two unknown keys", "foo = 1\nlisten = \"a:1\"\nbar = true\n", []string{":1: unknown key \"foo\"", ":3: unknown key \"bar\""}},
		{"a table", "listen = \"a:1\"\n[serve]\nlisten = \"b:2\"\n", []string{":2: unknown key \"serve\""}},
		{"array for a single value", "\nsubnet = [\"10.0.0.0/8\"]\n", []string{":2: key \"subnet\": an array"}},
		{"bad value", "max-sandboxes = \"many\"\n", []string{":1: key \"max-sandboxes\"", "parse error"}},
		{"bad toml", "listen = \n", []string{":1:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.text)
			_, err := configured(t, "--config", path)
			if err == nil {
				t.Fatalf("no error for %q", tc.text)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), path+w) && !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestConfigMissingFile(t *testing.T) {
	t.Setenv("LIZARD_CONFIG", "")
	missing := filepath.Join(t.TempDir(), "nope.toml")
	if _, err := configured(t, "--config", missing); err == nil || !strings.Contains(err.Error(), "nope.toml") {
		t.Errorf("an explicit missing config: err %v, want one naming the file", err)
	}
	t.Setenv("LIZARD_CONFIG", missing)
	if _, err := configured(t); err == nil {
		t.Error("a missing LIZARD_CONFIG file: no error")
	}
	// The default file may be missing.
	if _, err := readConfig(missing, false); err != nil {
		t.Errorf("missing default config: %v", err)
	}
}

// The operator commands take the keys they share with serve, and ignore
// the rest of the file.
func TestConfigSubcommand(t *testing.T) {
	t.Setenv("LIZARD_CONFIG", "")
	unsetenv(t, "LIZARD_DATA_DIR")
	path := writeConfig(t, "data-dir = \"/srv/lizard\"\nlisten = \"a:1\"\n")
	fs := flag.NewFlagSet("projects", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "")
	pos, err := configure(fs, []string{"ls", "--config", path})
	if err != nil {
		t.Fatal(err)
	}
	if *dataDir != "/srv/lizard" || !slices.Equal(pos, []string{"ls"}) {
		t.Errorf("data-dir %q, args %q; want the file's and [ls]", *dataDir, pos)
	}
	// A key only a subcommand has is not a config key.
	bad := writeConfig(t, "project = \"x\"\n")
	fs = flag.NewFlagSet("keys", flag.ContinueOnError)
	fs.String("project", "", "")
	if _, err := configure(fs, []string{"--config", bad}); err == nil || !strings.Contains(err.Error(), `unknown key "project"`) {
		t.Errorf("err %v, want unknown key project", err)
	}
}

func TestConfigRepeatable(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var args buildArgFlag
	fs.Var(&args, "build-arg", "")
	fs.String("one", "", "")
	f := fs.Lookup("build-arg")
	if !repeatable(f) || repeatable(fs.Lookup("one")) {
		t.Fatal("build-arg should be repeatable and a string flag not")
	}
	if err := applyKey(f, keyValue{value: []any{"A=1", "B=2"}}); err != nil {
		t.Fatal(err)
	}
	if args.m["A"] != "1" || args.m["B"] != "2" {
		t.Errorf("array applied as %v", args.m)
	}
	if err := applyKey(fs.Lookup("one"), keyValue{value: []any{"a"}}); err == nil {
		t.Error("array for a single-valued flag: no error")
	}
	if err := applyKey(fs.Lookup("one"), keyValue{value: map[string]any{"a": 1}}); err == nil {
		t.Error("table for a flag: no error")
	}
}

// No flag's environment variable may take the name of one that means
// something else.
func TestConfigReservedEnv(t *testing.T) {
	serveFlags(new(serveConfig)).VisitAll(func(f *flag.Flag) {
		if slices.Contains(reservedEnv, envName(f.Name)) {
			t.Errorf("flag --%s maps to %s, which is the SDK's/CLI's; rename the flag", f.Name, envName(f.Name))
		}
	})
}

// docs/CONFIG.md and deploy/lizard.toml are what the code generates.
func TestConfigGeneratedFiles(t *testing.T) {
	for _, tc := range []struct {
		file string
		gen  func(*bytes.Buffer) error
	}{
		{"../../docs/CONFIG.md", func(b *bytes.Buffer) error { return writeConfigDocs(b) }},
		{"../../deploy/lizard.toml", func(b *bytes.Buffer) error { return writeConfigExample(b) }},
	} {
		var want bytes.Buffer
		if err := tc.gen(&want); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%s differs from what the code generates: run `go generate ./cmd/lizard`", tc.file)
		}
	}
	// The example file parses and sets nothing.
	if _, err := readConfig("../../deploy/lizard.toml", true); err != nil {
		t.Errorf("deploy/lizard.toml: %v", err)
	}
}
