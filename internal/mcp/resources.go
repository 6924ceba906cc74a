package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// Resource URIs. A file's path follows /files/ without its leading slash,
// percent-encoded where a URI needs it:
// lizard://sandboxes/sb1/files/home/user/notes.txt.
const (
	uriPrefix        = "lizard://sandboxes/"
	fileTemplate     = uriPrefix + "{id}/files/{+path}"
	logTemplate      = uriPrefix + "{id}/logs"
	logResourceLines = 1000
)

func (t *tools) addResources(s *sdk.Server) {
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		URITemplate: fileTemplate,
		Name:        "sandbox-file",
		Title:       "A file of a sandbox",
		Description: fmt.Sprintf("A file of a sandbox, by its absolute path after /files/ (at most %d MiB): text, or bytes for binary files.", maxReadFile>>20),
	}, t.readFileResource)
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		URITemplate: logTemplate,
		Name:        "sandbox-logs",
		Title:       "A sandbox's log",
		Description: fmt.Sprintf("The last %d lines of a sandbox's log: its lifecycle and every command's output, with times and pids.", logResourceLines),
		MIMEType:    "text/plain",
	}, t.readLogResource)
}

// parseResourceURI splits a resource URI into its sandbox id and what
// follows it ("files/<path>" or "logs").
func parseResourceURI(uri string) (id, rest string, err error) {
	s, ok := strings.CutPrefix(uri, uriPrefix)
	if !ok {
		return "", "", fmt.Errorf("%q is not a lizard sandbox resource", uri)
	}
	id, rest, ok = strings.Cut(s, "/")
	if !ok || id == "" {
		return "", "", fmt.Errorf("%q names no sandbox", uri)
	}
	if id, err = url.PathUnescape(id); err != nil {
		return "", "", fmt.Errorf("%q: %w", uri, err)
	}
	return id, rest, nil
}

// filePath is the absolute path a file resource names.
func filePath(rest string) (string, error) {
	p, ok := strings.CutPrefix(rest, "files/")
	if !ok || p == "" {
		return "", errors.New("no file path after /files/")
	}
	p, err := url.PathUnescape(p)
	if err != nil {
		return "", err
	}
	return path.Clean("/" + p), nil
}

// notFound is a resource read's answer for what the API does not find:
// MCP's resource-not-found error with the API's message.
func notFound(err error) error {
	var ae *apiclient.Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return &jsonrpc.Error{Code: sdk.CodeResourceNotFound, Message: ae.Error()}
	}
	return err
}

// notFoundURI is the resource-not-found error of a URI that names nothing.
func notFoundURI(uri string) error {
	return &jsonrpc.Error{Code: sdk.CodeResourceNotFound, Message: fmt.Sprintf("%s: no such resource", uri)}
}

func (t *tools) readFileResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	id, rest, err := parseResourceURI(uri)
	if err != nil {
		return nil, err
	}
	p, err := filePath(rest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", uri, err)
	}
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	b, err := readSandboxFile(ctx, c, id, p, "", maxReadFile)
	if err != nil {
		return nil, notFound(err)
	}
	mt := mime.TypeByExtension(path.Ext(p))
	content := &sdk.ResourceContents{URI: uri, MIMEType: mt}
	switch {
	case len(b) == 0:
		// A content has text or a blob; an empty text would be left out.
		if mt == "" {
			content.MIMEType = "text/plain"
		}
		content.Blob = []byte{}
	case utf8.Valid(b) && (mt == "" || textual(mt)):
		if mt == "" {
			content.MIMEType = "text/plain"
		}
		content.Text = string(b)
	default:
		if mt == "" {
			content.MIMEType = "application/octet-stream"
		}
		content.Blob = b
	}
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{content}}, nil
}

// textual says whether a MIME type is text.
func textual(mt string) bool {
	mt, _, _ = strings.Cut(mt, ";")
	return strings.HasPrefix(mt, "text/") || strings.HasSuffix(mt, "json") || strings.HasSuffix(mt, "xml") ||
		strings.HasSuffix(mt, "javascript") || strings.HasSuffix(mt, "yaml") || strings.HasSuffix(mt, "toml")
}

func (t *tools) readLogResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	id, rest, err := parseResourceURI(uri)
	if err != nil {
		return nil, err
	}
	if rest != "logs" {
		return nil, notFoundURI(uri)
	}
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	var text strings.Builder
	q := fmt.Sprintf("/logs?tail=%d&follow=false", logResourceLines)
	err = c.Events(ctx, http.MethodGet, apiclient.SandboxPath(id, q), nil, func(data []byte) error {
		var l apiclient.LogLine
		if err := json.Unmarshal(data, &l); err != nil {
			return fmt.Errorf("decoding a log line: %w", err)
		}
		fmt.Fprintf(&text, "%s %-9s", l.Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"), l.Type)
		if l.Pid != 0 {
			fmt.Fprintf(&text, " [%d]", l.Pid)
		}
		fmt.Fprintf(&text, " %s\n", l.Message)
		return nil
	})
	if err != nil {
		return nil, notFound(err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: text.String()}}}, nil
}
