package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// memorySession connects a client to a server whose tools have no API:
// every call that passes validation fails, and calls counts them.
func memorySession(t *testing.T) (*sdk.ClientSession, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := NewServer(Config{Version: "test", Client: func(*sdk.RequestExtra) (*apiclient.Client, error) {
		calls.Add(1)
		return nil, errors.New("no API in this test")
	}})
	st, ct := sdk.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, &calls
}

// schemaOf decodes a tool's input schema as a client sees it.
type schemaOf struct {
	Type                 string                     `json:"type"`
	Required             []string                   `json:"required"`
	AdditionalProperties json.RawMessage            `json:"additionalProperties"`
	Properties           map[string]json.RawMessage `json:"properties"`
}

type propOf struct {
	Type        any     `json:"type"`
	Description string  `json:"description"`
	Minimum     *int    `json:"minimum"`
	Maximum     *int    `json:"maximum"`
	Enum        []any   `json:"enum"`
	Default     any     `json:"default"`
	Pattern     string  `json:"pattern"`
	MinLength   *int    `json:"minLength"`
	Items       *propOf `json:"items"`
}

// TestToolSchemas: every tool the issue asks for is listed with a one-line
// description and a JSON schema of its arguments that admits nothing
// else, names what is required, and carries the ranges, enums and
// defaults the handlers rely on.
func TestToolSchemas(t *testing.T) {
	cs, _ := memorySession(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*sdk.Tool{}
	for _, tool := range res.Tools {
		tools[tool.Name] = tool
	}
	want := map[string][]string{ // tool → its required arguments
		"create_sandbox": nil, "list_sandboxes": nil, "get_sandbox": {"sandboxId"}, "kill_sandbox": {"sandboxId"},
		"set_sandbox_timeout": {"sandboxId", "timeoutSeconds"},
		"run_command":         {"sandboxId", "command"}, "start_command": {"sandboxId", "command"},
		"read_command_output": {"sandboxId", "commandId"}, "stop_command": {"sandboxId", "commandId"},
		"read_file": {"sandboxId", "path"}, "write_file": {"sandboxId", "path", "content"}, "list_directory": {"sandboxId", "path"},
		"run_code": {"sandboxId", "code"}, "create_code_context": {"sandboxId"},
		"expose_port": {"sandboxId", "port"}, "pause_sandbox": {"sandboxId"}, "resume_sandbox": {"sandboxId"},
		"snapshot_sandbox": {"sandboxId"}, "restore_snapshot": {"snapshotId"}, "fork_sandbox": {"sandboxId"},
		"desktop_screenshot": {"sandboxId"}, "desktop_click": {"sandboxId", "x", "y"}, "desktop_type": {"sandboxId", "text"},
		"desktop_key": {"sandboxId", "keys"},
	}
	for name, required := range want {
		tool := tools[name]
		if tool == nil {
			t.Errorf("no tool %s", name)
			continue
		}
		if d := tool.Description; d == "" || strings.Contains(d, "\n") || len(d) > 300 {
			t.Errorf("%s: the description is not one line an LLM can act on: %q", name, d)
		}
		if tool.Annotations == nil || tool.Annotations.Title == "" {
			t.Errorf("%s: no annotations", name)
		}
		b, _ := json.Marshal(tool.InputSchema)
		var s schemaOf
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: schema %s: %v", name, b, err)
		}
		if s.Type != "object" || string(s.AdditionalProperties) != "false" {
			t.Errorf("%s: schema %s: want an object admitting no other property", name, b)
		}
		slices.Sort(s.Required)
		r := slices.Clone(required)
		slices.Sort(r)
		if !slices.Equal(s.Required, r) {
			t.Errorf("%s: required %v, want %v", name, s.Required, r)
		}
		for p, raw := range s.Properties {
			var pr propOf
			json.Unmarshal(raw, &pr)
			if pr.Description == "" {
				t.Errorf("%s.%s: no description", name, p)
			}
		}
	}
	for name := range tools {
		if _, ok := want[name]; !ok {
			t.Errorf("tool %s is not in this test", name)
		}
	}
	prop := func(tool, name string) propOf {
		var pr propOf
		if err := json.Unmarshal(mustJSON(t, tools[tool].InputSchema).Properties[name], &pr); err != nil {
			t.Fatalf("%s.%s: %v", tool, name, err)
		}
		return pr
	}
	checks := []struct {
		tool, prop         string
		min, max           int
		def                any
		enum               []any
		pattern, typ       string
		minLength          int
		arrayOf, mapValues bool
	}{
		{tool: "run_command", prop: "timeoutSeconds", min: 1, max: 600, def: float64(60), typ: "integer"},
		{tool: "run_command", prop: "command", minLength: 1, typ: "string"},
		{tool: "run_code", prop: "language", enum: []any{"python", "javascript", "typescript", "bash", "r", "java"}, typ: "string"},
		{tool: "run_code", prop: "timeoutSeconds", min: 1, max: 600, def: float64(60)},
		{tool: "create_sandbox", prop: "template", def: "base"},
		{tool: "create_sandbox", prop: "timeoutSeconds", min: 0, max: maxLifetime, def: float64(defaultLifetime)},
		{tool: "create_sandbox", prop: "size", enum: []any{"nano", "mini", "small", "medium", "large", "big"}},
		{tool: "create_sandbox", prop: "internetAccess", typ: "boolean"},
		{tool: "create_sandbox", prop: "allowedHosts", arrayOf: true},
		{tool: "create_sandbox", prop: "envs", typ: "object"},
		{tool: "read_file", prop: "encoding", enum: []any{"text", "base64"}, def: "text"},
		{tool: "write_file", prop: "encoding", enum: []any{"text", "base64"}, def: "text"},
		{tool: "expose_port", prop: "port", min: 1, max: 65535},
		{tool: "fork_sandbox", prop: "count", min: 1, max: 10, def: float64(1)},
		{tool: "read_command_output", prop: "commandId", pattern: "^[0-9a-f]{16}$"},
		{tool: "read_command_output", prop: "waitSeconds", min: 0, max: maxWait},
		{tool: "stop_command", prop: "signal", def: "SIGTERM", enum: []any{"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"}},
		{tool: "desktop_click", prop: "button", def: "left", enum: []any{"left", "middle", "right"}},
	}
	for _, c := range checks {
		pr := prop(c.tool, c.prop)
		where := c.tool + "." + c.prop
		if c.max != 0 && (pr.Minimum == nil || pr.Maximum == nil || *pr.Minimum != c.min || *pr.Maximum != c.max) {
			t.Errorf("%s: range %v..%v, want %d..%d", where, pr.Minimum, pr.Maximum, c.min, c.max)
		}
		if c.def != nil && pr.Default != c.def {
			t.Errorf("%s: default %#v, want %#v", where, pr.Default, c.def)
		}
		if c.enum != nil && !slices.Equal(pr.Enum, c.enum) {
			t.Errorf("%s: enum %v, want %v", where, pr.Enum, c.enum)
		}
		if pr.Pattern != c.pattern {
			t.Errorf("%s: pattern %q, want %q", where, pr.Pattern, c.pattern)
		}
		if c.minLength != 0 && (pr.MinLength == nil || *pr.MinLength != c.minLength) {
			t.Errorf("%s: minLength %v, want %d", where, pr.MinLength, c.minLength)
		}
		if c.typ != "" && !typeIs(pr.Type, c.typ) {
			t.Errorf("%s: type %v, want %s", where, pr.Type, c.typ)
		}
		if c.arrayOf && (!typeIs(pr.Type, "array") || pr.Items == nil || !typeIs(pr.Items.Type, "string")) {
			t.Errorf("%s: type %v items %v, want an array of strings", where, pr.Type, pr.Items)
		}
	}
}

// typeIs says whether a schema's type (a name or a list of names, as for
// a pointer: ["null", "boolean"]) is or includes want.
func typeIs(typ any, want string) bool {
	switch v := typ.(type) {
	case string:
		return v == want
	case []any:
		return slices.Contains(v, any(want))
	}
	return false
}

func mustJSON(t *testing.T, v any) schemaOf {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var s schemaOf
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestArgumentValidation: arguments that do not fit a tool's schema are a
// tool error (isError, never a protocol error) naming what is wrong, and
// the tool never calls the API.
func TestArgumentValidation(t *testing.T) {
	cs, calls := memorySession(t)
	tests := []struct {
		tool    string
		args    map[string]any
		mention string
	}{
		{"run_command", map[string]any{"sandboxId": "sb1"}, "command"},
		{"run_command", map[string]any{"sandboxId": "sb1", "command": ""}, "command"},
		{"run_command", map[string]any{"sandboxId": "sb1", "command": "ls", "timeoutSeconds": 601}, "timeoutSeconds"},
		{"run_command", map[string]any{"sandboxId": "sb1", "command": "ls", "timeoutSeconds": 0}, "timeoutSeconds"},
		{"run_command", map[string]any{"sandboxId": "sb1", "command": "ls", "timeoutSeconds": "ten"}, "timeoutSeconds"},
		{"run_command", map[string]any{"sandboxId": "sb1", "command": "ls", "shell": "bash"}, "shell"},
		{"get_sandbox", map[string]any{}, "sandboxId"},
		{"get_sandbox", map[string]any{"sandboxId": ""}, "sandboxId"},
		{"expose_port", map[string]any{"sandboxId": "sb1", "port": 70000}, "port"},
		{"expose_port", map[string]any{"sandboxId": "sb1", "port": 0}, "port"},
		{"read_command_output", map[string]any{"sandboxId": "sb1", "commandId": "../etc"}, "commandId"},
		{"read_file", map[string]any{"sandboxId": "sb1", "path": "/etc/hostname", "encoding": "hex"}, "encoding"},
		{"run_code", map[string]any{"sandboxId": "sb1", "code": "1", "language": "cobol"}, "language"},
		{"create_sandbox", map[string]any{"size": "huge"}, "size"},
		{"create_sandbox", map[string]any{"timeoutSeconds": -1}, "timeoutSeconds"},
		{"fork_sandbox", map[string]any{"sandboxId": "sb1", "count": 11}, "count"},
		{"desktop_click", map[string]any{"sandboxId": "sb1", "x": 1, "y": 2, "button": "fourth"}, "button"},
	}
	for _, tt := range tests {
		res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tt.tool, Arguments: tt.args})
		if err != nil {
			t.Errorf("%s %v: a protocol error %v, want a tool error", tt.tool, tt.args, err)
			continue
		}
		if text := resultText(res); !res.IsError || !strings.Contains(text, tt.mention) {
			t.Errorf("%s %v: isError %v %q, want a tool error naming %q", tt.tool, tt.args, res.IsError, text, tt.mention)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the tools called the API %d times for arguments their schema refuses", n)
	}
	// Arguments that fit reach the handler, whose failure is a tool error
	// too.
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "get_sandbox", Arguments: map[string]any{"sandboxId": "sb1"}})
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "no API in this test") || calls.Load() != 1 {
		t.Fatalf("a valid call: %v %v %q (calls %d)", err, res.IsError, resultText(res), calls.Load())
	}
}

// resultText is a tool result's text content.
func resultText(res *sdk.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// TestResourceTemplates: a sandbox's files and its log are resources, by
// URI template.
func TestResourceTemplates(t *testing.T) {
	cs, _ := memorySession(t)
	res, err := cs.ListResourceTemplates(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rt := range res.ResourceTemplates {
		got = append(got, rt.URITemplate)
	}
	slices.Sort(got)
	if want := []string{"lizard://sandboxes/{id}/files/{+path}", "lizard://sandboxes/{id}/logs"}; !slices.Equal(got, want) {
		t.Fatalf("resource templates %v, want %v", got, want)
	}
}

func TestResourceURIs(t *testing.T) {
	tests := []struct {
		uri, id, path string
		bad           bool
	}{
		{uri: "lizard://sandboxes/sb1/files/etc/hostname", id: "sb1", path: "/etc/hostname"},
		{uri: "lizard://sandboxes/sb1/files/home/user/my%20notes.txt", id: "sb1", path: "/home/user/my notes.txt"},
		{uri: "lizard://sandboxes/sb1/files/tmp/../etc/passwd", id: "sb1", path: "/etc/passwd"},
		{uri: "lizard://sandboxes/sb1/files/", bad: true},
		{uri: "lizard://sandboxes//files/etc", bad: true},
		{uri: "file:///etc/hostname", bad: true},
	}
	for _, tt := range tests {
		id, rest, err := parseResourceURI(tt.uri)
		var p string
		if err == nil {
			p, err = filePath(rest)
		}
		if tt.bad {
			if err == nil {
				t.Errorf("%s: no error", tt.uri)
			}
			continue
		}
		if err != nil || id != tt.id || p != tt.path {
			t.Errorf("%s: %q %q %v, want %q %q", tt.uri, id, p, err, tt.id, tt.path)
		}
	}
}
