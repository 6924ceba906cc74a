package mcp

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
	"github.com/lizard-build/lizard/internal/codeinterp"
)

// The code tools talk to the code-interpreter server of code-interpreter-v1
// sandboxes (internal/codeinterp, port codeinterp.Port inside the sandbox)
// the way the API reaches anything inside a sandbox: a command run through
// the API's exec, here interpClient, which sends one request to the server
// on the sandbox's loopback and prints its answer. No port is exposed, no
// token leaves the sandbox (the client reads the server's token file when a
// secure sandbox has one), and cancelling the call kills the client, which
// makes the server interrupt the execution.

//go:embed interp_client.py
var interpClient string

// maxInlineRequest is the largest request passed to the client in its
// argv; a larger one (long code) goes through a file, since one argument
// of a command is limited (128 KiB on Linux).
const maxInlineRequest = 64 << 10

// codeLanguages are the languages of the code-interpreter server.
var codeLanguages = []string{"python", "javascript", "typescript", "bash", "r", "java"}

type codeIn struct {
	SandboxID      string            `json:"sandboxId" jsonschema:"the sandbox's id: a sandbox of the code-interpreter-v1 template"`
	Code           string            `json:"code" jsonschema:"the code to run"`
	Language       string            `json:"language,omitempty" jsonschema:"the language, when no contextId is given (default python); each language has a default context that keeps its state between calls"`
	ContextID      string            `json:"contextId,omitempty" jsonschema:"a context of create_code_context, whose language and state the code runs in"`
	Envs           map[string]string `json:"envs,omitempty" jsonschema:"environment variables for this run only"`
	TimeoutSeconds int               `json:"timeoutSeconds,omitempty" jsonschema:"the execution is interrupted after this many seconds"`
}

type contextIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id: a sandbox of the code-interpreter-v1 template"`
	Language  string `json:"language,omitempty" jsonschema:"the context's language"`
	Cwd       string `json:"cwd,omitempty" jsonschema:"the context's working directory (default /home/user)"`
}

func (t *tools) addCodeTools(s *sdk.Server) {
	addTool(s, "run_code", "Run code",
		fmt.Sprintf("Run Python, JavaScript, TypeScript, bash, R or Java in a stateful interpreter (a Jupyter-like context: variables and imports persist between calls) in a code-interpreter-v1 sandbox; returns stdout, stderr, results (charts as images) and any error (text capped at %d KiB a stream).", outputCap>>10),
		adds, func(p props) {
			sandboxIDs(p)
			p.nonEmpty("code")
			p.enum("language", codeLanguages...)
			p.rangeOf("timeoutSeconds", 1, maxCommandTimeout)
			p.byDefault("timeoutSeconds", defaultCommandTimeout)
		}, t.runCode)
	addTool(s, "create_code_context", "Create a code context",
		"Create a new interpreter context (its own variables and working directory) in a code-interpreter-v1 sandbox; pass its contextId to run_code.",
		adds, func(p props) {
			sandboxIDs(p)
			p.enum("language", codeLanguages...)
			p.byDefault("language", "python")
		}, t.createContext)
}

// interpRequest is one request to the code-interpreter server.
type interpRequest struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   any    `json:"body,omitempty"`
}

// interpRefusal is the client's "!" line.
type interpRefusal struct {
	Status  int    `json:"status"`
	Message string `json:"message"`
}

// interp sends r to the sandbox's code-interpreter server and calls fn with
// each JSON line of its answer. It returns the client's execution (exit
// code, stderr) for a caller that needs to tell how it ended.
func interp(ctx context.Context, c *apiclient.Client, id string, r interpRequest, timeout time.Duration, fn func(json.RawMessage) error) (*execution, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	arg := string(b)
	if len(b) > maxInlineRequest {
		rb := make([]byte, 8)
		rand.Read(rb)
		path := "/tmp/lizard-mcp-request-" + hex.EncodeToString(rb) + ".json"
		if _, err := c.Call(ctx, http.MethodPost, apiclient.SandboxPath(id, "/files"),
			map[string]string{"path": path, "content": arg, "user": "root"}); err != nil {
			return nil, err
		}
		arg = "@" + path
	}
	argv := []string{"python3", "-c", interpClient, strconv.Itoa(codeinterp.Port), codeinterp.TokenFile, arg}
	var part strings.Builder
	var refused *interpRefusal
	var lineErr error
	ex, err := execute(ctx, c, id, argv, execOpts{user: "root", timeout: timeout}, outputCap, func(stream, line string) {
		if stream != "stdout" || line == "" || lineErr != nil {
			return
		}
		switch line[0] {
		case '+':
			part.WriteString(line[1:])
		case '=':
			part.WriteString(line[1:])
			lineErr = fn(json.RawMessage(part.String()))
			part.Reset()
		case '!':
			refused = &interpRefusal{}
			if json.Unmarshal([]byte(line[1:]), refused) != nil {
				refused.Message = line[1:]
			}
		}
	})
	if err != nil {
		return nil, err
	}
	if lineErr != nil {
		return nil, lineErr
	}
	switch {
	case refused != nil && refused.Status == 0, refused == nil && ex.exitCode == 127:
		why := strings.TrimSpace(ex.stderr.String())
		if refused != nil {
			why = refused.Message
		}
		return nil, fmt.Errorf("sandbox %s runs no code interpreter (create the sandbox from the code-interpreter-v1 template): %s", id, why)
	case refused != nil:
		return nil, fmt.Errorf("the code interpreter refused: %s (%d)", refused.Message, refused.Status)
	}
	return ex, nil
}

// codeEvent is one NDJSON event of the code-interpreter server's /execute
// (E2B's code-interpreter protocol).
type codeEvent struct {
	Type           string `json:"type"`
	Text           string `json:"text"`
	Name           string `json:"name"`
	Value          string `json:"value"`
	Traceback      string `json:"traceback"`
	Message        string `json:"message"`
	ExecutionCount int    `json:"execution_count"`
	IsMainResult   bool   `json:"is_main_result"`
}

func (t *tools) runCode(ctx context.Context, req *sdk.CallToolRequest, in codeIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"code": in.Code}
	switch {
	case in.ContextID != "" && in.Language != "":
		return nil, errors.New("give contextId or language, not both: a context has its language")
	case in.ContextID != "":
		body["context_id"] = in.ContextID
	case in.Language != "":
		body["language"] = in.Language
	default:
		body["language"] = "python"
	}
	if len(in.Envs) > 0 {
		body["env_vars"] = in.Envs
	}
	stdout, stderr := newCapped(outputCap), newCapped(outputCap)
	var results []map[string]any
	var codeErr *codeEvent
	var count int
	ended := false
	p := startProgress(ctx, req, float64(in.TimeoutSeconds), "running code")
	timeout := time.Duration(in.TimeoutSeconds) * time.Second
	ex, err := interp(ctx, c, in.SandboxID, interpRequest{Method: http.MethodPost, Path: "/execute", Body: body}, timeout, func(raw json.RawMessage) error {
		var ev codeEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			return fmt.Errorf("decoding the code interpreter's answer: %w", err)
		}
		switch ev.Type {
		case "stdout":
			stdout.Write([]byte(ev.Text))
			p.say(clip(lastLine(ev.Text), 200))
		case "stderr":
			stderr.Write([]byte(ev.Text))
		case "result":
			var r map[string]any
			if err := json.Unmarshal(raw, &r); err != nil {
				return err
			}
			delete(r, "type")
			results = append(results, r)
		case "error":
			codeErr = &ev
		case "number_of_executions":
			count = ev.ExecutionCount
		case "end_of_execution":
			ended = true
		case "unexpected_end_of_execution":
			return fmt.Errorf("the execution ended unexpectedly: %s", ev.Message)
		}
		return nil
	})
	p.end()
	if err != nil {
		return nil, err
	}
	return codeResult(stdout, stderr, results, codeErr, count, ended, ex, in.TimeoutSeconds), nil
}

// imageFields are the result fields given to the model as images.
var imageFields = map[string]string{"png": "image/png", "jpeg": "image/jpeg"}

// textFields are the result fields given to the model as text, in order.
var textFields = []string{"text", "markdown", "html", "latex", "json", "svg", "javascript"}

// codeResult is run_code's answer: text for the model (output, each
// result's text, the error), the images as image content, and all of it
// but the images' bytes as structured content.
func codeResult(stdout, stderr *capped, results []map[string]any, codeErr *codeEvent, count int, ended bool, ex *execution, timeout int) *sdk.CallToolResult {
	var text strings.Builder
	res := &sdk.CallToolResult{}
	structured := map[string]any{"stdout": stdout.String(), "stderr": stderr.String(), "executionCount": count}
	if s := section("stdout", stdout); s != "" {
		text.WriteString(s)
	}
	if s := section("stderr", stderr); s != "" {
		text.WriteString(s)
	}
	var outs []map[string]any
	for i, r := range results {
		o := map[string]any{}
		fmt.Fprintf(&text, "--- result %d%s ---\n", i+1, map[bool]string{true: " (the last expression's value)"}[r["is_main_result"] == true])
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := r[k]
			if mime, ok := imageFields[k]; ok {
				if s, ok := v.(string); ok {
					if b, err := base64.StdEncoding.DecodeString(s); err == nil {
						res.Content = append(res.Content, &sdk.ImageContent{Data: b, MIMEType: mime})
						o[k] = fmt.Sprintf("(image %d, %d bytes)", len(res.Content), len(b))
						fmt.Fprintf(&text, "[%s image, %d bytes: image content %d]\n", mime, len(b), len(res.Content))
						continue
					}
				}
			}
			o[k] = v
		}
		for _, k := range textFields {
			if s, ok := r[k].(string); ok && s != "" {
				fmt.Fprintf(&text, "%s: %s\n", k, clip(s, outputCap))
				break // the richest text is enough for the model; all are in the structured content
			}
		}
		outs = append(outs, o)
	}
	if outs != nil {
		structured["results"] = outs
	}
	if codeErr != nil {
		structured["error"] = map[string]string{"name": codeErr.Name, "value": codeErr.Value, "traceback": codeErr.Traceback}
		fmt.Fprintf(&text, "--- error ---\n%s: %s\n%s\n", codeErr.Name, codeErr.Value, clip(stripANSI(codeErr.Traceback), outputCap))
	}
	if !ended {
		if ex.exitCode == 124 && ex.took >= time.Duration(timeout)*time.Second {
			fmt.Fprintf(&text, "[interrupted at the timeout of %d s]\n", timeout)
			structured["timedOut"] = true
		} else {
			fmt.Fprintf(&text, "[the execution did not finish: the client ended with exit code %d %s]\n", ex.exitCode, strings.TrimSpace(ex.stderr.String()))
		}
	}
	if text.Len() == 0 {
		text.WriteString("(no output)")
	}
	res.Content = append([]sdk.Content{&sdk.TextContent{Text: text.String()}}, res.Content...)
	res.StructuredContent = structured
	return res
}

// stripANSI removes terminal colours (IPython's tracebacks have them).
func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == ';') {
				j++
			}
			if j < len(s) {
				i = j
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (t *tools) createContext(ctx context.Context, req *sdk.CallToolRequest, in contextIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	body := map[string]string{"language": in.Language}
	if in.Cwd != "" {
		body["cwd"] = in.Cwd
	}
	var info struct {
		ID       string `json:"id"`
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	p := startProgress(ctx, req, 0, "starting a "+in.Language+" context")
	_, err = interp(ctx, c, in.SandboxID, interpRequest{Method: http.MethodPost, Path: "/contexts", Body: body}, 2*time.Minute, func(raw json.RawMessage) error {
		return json.Unmarshal(raw, &info)
	})
	p.end()
	if err != nil {
		return nil, err
	}
	if info.ID == "" {
		return nil, errors.New("the code interpreter made no context")
	}
	return textResult(fmt.Sprintf("context %s (%s, in %s)", info.ID, info.Language, info.Cwd),
		map[string]string{"contextId": info.ID, "language": info.Language, "cwd": info.Cwd}), nil
}
