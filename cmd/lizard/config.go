package main

//go:generate sh -c "go run . config docs > ../../docs/CONFIG.md"
//go:generate sh -c "go run . config example > ../../deploy/lizard.toml"

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// The configuration of `lizard serve` is its flag set: every flag is a key
// of the config file (same name) and a LIZARD_* environment variable, so a
// flag added to serveFlags is configurable everywhere without more code.
// Precedence: command line > environment > file > the flag's default.

const defaultConfigPath = "/etc/lizard/lizard.toml"

// reservedEnv are LIZARD_* variables that mean something else (the SDK's and
// the CLI's endpoint and key; the key firstStart creates; the secrets key
// itself, secrets.go). No flag may map
// to one of them.
var reservedEnv = []string{"LIZARD_API_KEY", "LIZARD_API_URL", secretsKeyEnv, secretsPreviousKeyEnv}

// envName is the environment variable of a flag: LIZARD_ and the name in
// upper case with dashes as underscores.
func envName(flagName string) string {
	return "LIZARD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// configure parses args into fs, then fills every flag that the command line
// did not set from the environment or, failing that, the config file
// (--config, $LIZARD_CONFIG, else /etc/lizard/lizard.toml, which may be
// missing). The keys of the file are the flags of `lizard serve`; fs may be
// another command's flag set, which takes the keys it shares with serve. It
// returns the positional arguments.
func configure(fs *flag.FlagSet, args []string) ([]string, error) {
	path := fs.String("config", "", "config file (default $LIZARD_CONFIG, else "+defaultConfigPath+" if it exists)")
	pos, err := parse(fs, args)
	if err != nil {
		return nil, err
	}
	explicit := *path != ""
	if !explicit {
		*path = os.Getenv("LIZARD_CONFIG")
		explicit = *path != ""
	}
	if !explicit {
		*path = defaultConfigPath
	}
	file, err := readConfig(*path, explicit)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := serveFlags(new(serveConfig))
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || keys.Lookup(f.Name) == nil {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			vals := []string{v}
			if repeatable(f) {
				vals = strings.Split(v, ",")
			}
			for _, v := range vals {
				if err := f.Value.Set(v); err != nil {
					errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
					return
				}
			}
			return
		}
		kv, ok := file[f.Name]
		if !ok {
			return
		}
		if err := applyKey(f, kv); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: key %q: %w", *path, kv.line, f.Name, err))
		}
	})
	return pos, errors.Join(errs...)
}

// keyValue is one key of the config file and the line it is on.
type keyValue struct {
	value any
	line  int
}

// readConfig reads the config file at path: a TOML document of top-level
// keys, each a flag of `lizard serve`. A key that is not one is an error
// naming it and its line. A missing file is an error only if it was asked
// for.
func readConfig(path string, explicit bool) (map[string]keyValue, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// A struct with one field per key lets the decoder report unknown keys
	// with their positions, and a second one with lines for known keys.
	var fields []reflect.StructField
	var names []string
	fs := serveFlags(new(serveConfig))
	fs.VisitAll(func(f *flag.Flag) {
		fields = append(fields, reflect.StructField{
			Name: fmt.Sprintf("F%d", len(fields)),
			Type: reflect.TypeFor[any](),
			Tag:  reflect.StructTag(fmt.Sprintf(`toml:%q`, f.Name)),
		})
		names = append(names, f.Name)
	})
	doc := reflect.New(reflect.StructOf(fields))
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(doc.Interface()); err != nil {
		var strict *toml.StrictMissingError
		var derr *toml.DecodeError
		switch {
		case errors.As(err, &strict):
			var errs []error
			for _, e := range strict.Errors {
				line, _ := e.Position()
				errs = append(errs, fmt.Errorf("%s:%d: unknown key %q (the keys are the flags of `lizard serve`; see docs/CONFIG.md)",
					path, line, strings.Join(e.Key(), ".")))
			}
			return nil, errors.Join(errs...)
		case errors.As(err, &derr):
			line, col := derr.Position()
			return nil, fmt.Errorf("%s:%d:%d: %w", path, line, col, err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	lines := keyLines(data)
	out := map[string]keyValue{}
	for i, name := range names {
		if v := doc.Elem().Field(i).Interface(); v != nil {
			out[name] = keyValue{value: v, line: lines[name]}
		}
	}
	return out, nil
}

// keyLines finds the line of each top-level key of a document that
// decoded without error.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(data)
	for p.NextExpression() {
		e := p.Expression()
		if e.Kind != unstable.KeyValue {
			continue
		}
		it := e.Key()
		if !it.Next() {
			continue
		}
		k := it.Node()
		lines[string(k.Data)] = p.Shape(k.Raw).Start.Line
	}
	return lines
}

// applyKey sets f from a value of the config file: a string, number or
// boolean; an array for a repeatable flag.
func applyKey(f *flag.Flag, kv keyValue) error {
	if arr, ok := kv.value.([]any); ok {
		if !repeatable(f) {
			return errors.New("an array, but this flag takes one value")
		}
		for _, v := range arr {
			s, err := scalar(v)
			if err != nil {
				return err
			}
			if err := f.Value.Set(s); err != nil {
				return err
			}
		}
		return nil
	}
	s, err := scalar(kv.value)
	if err != nil {
		return err
	}
	return f.Value.Set(s)
}

func scalar(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	case bool:
		return strconv.FormatBool(v), nil
	}
	return "", fmt.Errorf("a %T, want a string, number or boolean", v)
}

// scalarTypes are the types of the flag package's own single-valued flags;
// every other flag.Value (e.g. --build-arg style) is taken as repeatable.
var scalarTypes = func() []reflect.Type {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.String("s", "", "")
	fs.Int("i", 0, "")
	fs.Int64("i64", 0, "")
	fs.Uint("u", 0, "")
	fs.Uint64("u64", 0, "")
	fs.Float64("f", 0, "")
	fs.Bool("b", false, "")
	fs.Duration("d", 0, "")
	var ts []reflect.Type
	fs.VisitAll(func(f *flag.Flag) { ts = append(ts, reflect.TypeOf(f.Value)) })
	return ts
}()

func repeatable(f *flag.Flag) bool {
	return !slices.Contains(scalarTypes, reflect.TypeOf(f.Value))
}

// config runs `lizard config docs|example`: the reference of every key
// (docs/CONFIG.md) and a config file with every key commented out at its
// default (deploy/lizard.toml, installed as /etc/lizard/lizard.toml). Both
// are generated from serveFlags, and a test compares the committed files.
func config(args []string) error {
	if len(args) == 1 && args[0] == "docs" {
		return writeConfigDocs(os.Stdout)
	}
	if len(args) == 1 && args[0] == "example" {
		return writeConfigExample(os.Stdout)
	}
	return errors.New("usage: lizard config docs|example")
}

// tomlValue is how a flag's default is written in TOML.
func tomlValue(f *flag.Flag) string {
	if repeatable(f) {
		return "[]"
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool, int, int64, uint, uint64, float64:
			return f.DefValue
		}
	}
	return strconv.Quote(f.DefValue)
}

func writeConfigDocs(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`# Configuration of lizard serve

<!-- Generated by ` + "`go run ./cmd/lizard config docs > docs/CONFIG.md`" + ` (go generate ./cmd/lizard) from
the flags of ` + "`lizard serve`" + `; do not edit. A test fails when this file differs from the code. -->

Every flag of ` + "`lizard serve`" + ` is also a key of the config file and an environment variable.
Precedence, highest first: the command line, the environment, the config file, the default.

- **Config file**: TOML, top-level keys only, named as the flags. ` + "`--config FILE`" + ` (or ` + "`LIZARD_CONFIG`" + `)
  names it and must exist; without either, ` + "`" + defaultConfigPath + "`" + ` is read when it exists. A key that is
  not listed below is an error naming the key and its line. Flags that can be given more than once
  take an array.
- **Environment**: ` + "`LIZARD_`" + ` and the flag's name in upper case with dashes as underscores. For a
  flag that can be given more than once, the variable holds the values separated by commas.
  ` + "`LIZARD_API_KEY`" + ` and ` + "`LIZARD_API_URL`" + ` are not configuration: they are the SDK's and CLI's key and URL
  (and ` + "`LIZARD_API_KEY`" + ` is the key the first start creates); no flag is named to collide with them.
- The operator commands (` + "`lizard projects`, `keys`, `template`, `backup`, `restore`" + `) read the same file
  and environment for the keys they share with serve (` + "`data-dir`, `template-dir`, `runsc`" + `), so they find the
  server's state without repeating flags.

| key | environment | default | what it is |
|---|---|---|---|
`)
	serveFlags(new(serveConfig)).VisitAll(func(f *flag.Flag) {
		def := "`" + tomlValue(f) + "`"
		if f.DefValue == "" && !repeatable(f) {
			def = "(none)"
		}
		usage := strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(f.Usage)
		if repeatable(f) {
			usage += " (repeatable: an array in the file)"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", f.Name, envName(f.Name), def, usage)
	})
	_, err := io.WriteString(w, b.String())
	return err
}

func writeConfigExample(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`# /etc/lizard/lizard.toml: configuration of lizard serve (and the operator
# commands: lizard projects, keys, template, backup, restore).
# Every key is a flag of ` + "`lizard serve`" + `, shown at its default; uncomment to change.
# Precedence: command line > LIZARD_* environment > this file > defaults.
# Reference: docs/CONFIG.md. Generated by ` + "`lizard config example`" + `.
`)
	serveFlags(new(serveConfig)).VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(&b, "\n# %s\n#%s = %s\n", f.Usage, f.Name, tomlValue(f))
	})
	_, err := io.WriteString(w, b.String())
	return err
}
