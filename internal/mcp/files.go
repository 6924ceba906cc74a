package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// maxReadFile bounds what read_file and a file resource answer: a model's
// context is no place for more.
const maxReadFile = 1 << 20

type readFileIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"the file's absolute path in the sandbox"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text gives the content as UTF-8 text; base64 gives the bytes in base64 (for binary files)"`
	User      string `json:"user,omitempty" jsonschema:"the user to read as (default root)"`
}

type writeFileIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"the file's absolute path in the sandbox; missing parent directories are made"`
	Content   string `json:"content" jsonschema:"the file's content: text, or base64 with encoding base64"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text writes content as it is; base64 writes the bytes content encodes"`
	User      string `json:"user,omitempty" jsonschema:"the user to write as, who then owns the file (default root)"`
}

type listDirIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"the directory's absolute path in the sandbox"`
	User      string `json:"user,omitempty" jsonschema:"the user to list as (default root)"`
}

func paths(p props) {
	sandboxIDs(p)
	p.nonEmpty("path")
}

func encodings(p props) {
	p.enum("encoding", "text", "base64")
	p.byDefault("encoding", "text")
}

func (t *tools) addFileTools(s *sdk.Server) {
	addTool(s, "read_file", "Read a file",
		fmt.Sprintf("Read a file of a sandbox (at most %d MiB), as text or base64.", maxReadFile>>20),
		reads, func(p props) { paths(p); encodings(p) }, t.readFile)
	addTool(s, "write_file", "Write a file",
		"Write a file in a sandbox, replacing it if it exists, from text or base64.",
		sets, func(p props) { paths(p); encodings(p) }, t.writeFile)
	addTool(s, "list_directory", "List a directory",
		"List a directory of a sandbox: each entry's name, path, type (file, dir, symlink) and size.",
		reads, paths, t.listDir)
}

func (t *tools) readFile(ctx context.Context, req *sdk.CallToolRequest, in readFileIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	b, err := readSandboxFile(ctx, c, in.SandboxID, in.Path, in.User, maxReadFile)
	if err != nil {
		return nil, err
	}
	if in.Encoding == "base64" {
		s := base64.StdEncoding.EncodeToString(b)
		return textResult(s, map[string]any{"path": in.Path, "encoding": "base64", "content": s, "size": len(b)}), nil
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%s is not UTF-8 text (%d bytes): read it with encoding base64", in.Path, len(b))
	}
	return textResult(string(b), map[string]any{"path": in.Path, "encoding": "text", "content": string(b), "size": len(b)}), nil
}

// userQuery is the query parameter that names the user of a file call
// (after path=…), "" for the API's default.
func userQuery(user string) string {
	if user == "" {
		return ""
	}
	return "&user=" + url.QueryEscape(user)
}

func (t *tools) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeFileIn) (*sdk.CallToolResult, error) {
	body := map[string]string{"path": in.Path, "content": in.Content}
	n := len(in.Content)
	if in.Encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(in.Content)
		if err != nil {
			return nil, fmt.Errorf("content: not valid base64: %w", err)
		}
		body["encoding"], n = "base64", len(b)
	}
	if in.User != "" {
		body["user"] = in.User
	}
	if _, err := t.call(ctx, req, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/files"), body, ""); err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("wrote %d bytes to %s", n, in.Path), map[string]any{"path": in.Path, "size": n}), nil
}

func (t *tools) listDir(ctx context.Context, req *sdk.CallToolRequest, in listDirIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	var entries []struct {
		Name string `json:"name"`
		Path string `json:"path"`
		Type string `json:"type"`
		Size int64  `json:"size"`
	}
	raw, err := c.CallInto(ctx, http.MethodGet, apiclient.SandboxPath(in.SandboxID, "/files/list?path="+url.QueryEscape(in.Path)+userQuery(in.User)), nil, &entries)
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	fmt.Fprintf(&text, "%s: %d entries\n", in.Path, len(entries))
	for _, e := range entries {
		name := e.Name
		if e.Type == "dir" {
			name += "/"
		}
		fmt.Fprintf(&text, "%-7s %12d  %s\n", e.Type, e.Size, name)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return textResult(text.String(), map[string]any{"path": in.Path, "entries": v}), nil
}
