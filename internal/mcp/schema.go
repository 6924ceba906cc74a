package mcp

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// props are a tool's argument schemas by name, for a tool to refine what
// was inferred from its argument type.
type props map[string]*jsonschema.Schema

// inputSchema is the JSON schema of a tool's arguments: inferred from In
// (a property's description is its field's jsonschema tag, a field without
// omitempty is required, no other property is allowed), then refined by
// refine (ranges, enums, defaults). The SDK checks every call against it
// and fills in the defaults before the handler runs, and a call that does
// not fit is a tool error naming the argument.
func inputSchema[In any](refine func(props)) *jsonschema.Schema {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: the schema of %T: %v", *new(In), err)) // a programming error: the tests build every tool
	}
	if refine != nil {
		refine(props(s.Properties))
	}
	return s
}

// rangeOf limits a number to [min, max].
func (p props) rangeOf(name string, min, max float64) {
	p[name].Minimum, p[name].Maximum = &min, &max
}

// enum limits a string to values.
func (p props) enum(name string, values ...string) {
	p[name].Enum = nil
	for _, v := range values {
		p[name].Enum = append(p[name].Enum, v)
	}
}

// byDefault is what the SDK fills in for an argument the call leaves out.
func (p props) byDefault(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	p[name].Default = b
}

// pattern limits a string to a regular expression.
func (p props) pattern(name, re string) { p[name].Pattern = re }

// nonEmpty requires a string of at least one character.
func (p props) nonEmpty(names ...string) {
	one := 1
	for _, n := range names {
		p[n].MinLength = &one
	}
}

// toolKind says how a tool touches a sandbox, for the clients that ask
// before running tools (MCP's tool annotations).
type toolKind int

const (
	reads    toolKind = iota // reads only
	adds                     // makes or changes something; nothing is lost
	sets                     // changes something; a repeat changes nothing more
	destroys                 // may lose what a sandbox held
)

func (k toolKind) annotations(title string) *sdk.ToolAnnotations {
	no, yes := false, true
	a := &sdk.ToolAnnotations{Title: title, OpenWorldHint: &no}
	switch k {
	case reads:
		a.ReadOnlyHint, a.IdempotentHint = true, true
	case adds:
		a.DestructiveHint = &no
	case sets:
		a.DestructiveHint, a.IdempotentHint = &no, true
	case destroys:
		a.DestructiveHint = &yes
	}
	return a
}

// addTool adds a tool whose arguments are In, with the schema inputSchema
// makes of In and refine.
func addTool[In any](s *sdk.Server, name, title, description string, kind toolKind, refine func(props),
	h func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, error)) {
	tool := &sdk.Tool{Name: name, Title: title, Description: description, InputSchema: inputSchema[In](refine), Annotations: kind.annotations(title)}
	sdk.AddTool(s, tool, func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, any, error) {
		res, err := h(ctx, req, in)
		return res, nil, err
	})
}
