package content

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// The operations of a Request.
const (
	OpStat       = "stat"
	OpList       = "list"
	OpMakeDir    = "mkdir"
	OpSetAttrs   = "setattrs"
	OpRemove     = "remove"
	OpCheckRead  = "checkread"
	OpCheckWrite = "checkwrite"
	OpCommit     = "commit"
)

// Request is one operation on a volume's files, as `lizard volume-content
// ROOT REQUEST` takes it in the sandbox that holds the volume (REQUEST is
// this as JSON). The file contents themselves go through the agent's own
// file reads and writes, between a checkwrite and a commit.
type Request struct {
	Op     string `json:"op"`
	Path   string `json:"path"`
	Depth  int    `json:"depth,omitempty"`  // list
	Force  bool   `json:"force,omitempty"`  // mkdir, checkwrite, commit
	Upload string `json:"upload,omitempty"` // commit: CheckWrite's upload file
	Attrs         // mkdir, setattrs, commit
}

// Reply is the answer to a Request: what the operation gives, or its
// error with its class.
type Reply struct {
	Entry   *Entry      `json:"entry,omitempty"`
	Entries []Entry     `json:"entries,omitempty"`
	Upload  string      `json:"upload,omitempty"`
	Error   *ReplyError `json:"error,omitempty"`
}

// ReplyError is an error as it travels: its errdefs class name, its code
// (errdefs.WithCode, "" for none) and its client message.
type ReplyError struct {
	Class   string `json:"class"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// Err is the reply's error, classed as it was, or nil.
func (r Reply) Err() error {
	if r.Error == nil {
		return nil
	}
	class := errdefs.ClassNamed(r.Error.Class)
	if class == nil {
		class = errdefs.ErrUnavailable
	}
	err := fmt.Errorf("%s: %w", r.Error.Message, class)
	if r.Error.Code != "" {
		err = errdefs.WithCode(r.Error.Code, err)
	}
	return err
}

// Do runs req on f.
func (f *FS) Do(req Request) Reply {
	var (
		rep Reply
		e   Entry
		err error
	)
	switch req.Op {
	case OpStat:
		e, err = f.Stat(req.Path)
	case OpList:
		rep.Entries, err = f.List(req.Path, req.Depth)
		if rep.Entries == nil {
			rep.Entries = []Entry{}
		}
	case OpMakeDir:
		e, err = f.MakeDir(req.Path, req.Attrs, req.Force)
	case OpSetAttrs:
		e, err = f.SetAttrs(req.Path, req.Attrs)
	case OpRemove:
		err = f.Remove(req.Path)
	case OpCheckRead:
		e, err = f.CheckRead(req.Path)
	case OpCheckWrite:
		rep.Upload, err = f.CheckWrite(req.Path, req.Force)
	case OpCommit:
		e, err = f.Commit(req.Upload, req.Path, req.Attrs, req.Force)
	default:
		err = invalid("op %q: unknown", req.Op)
	}
	if err != nil {
		return Reply{Error: &ReplyError{Class: errdefs.ClassName(err), Code: errdefs.Code(err), Message: errdefs.ClientMessage(err)}}
	}
	if e.Path != "" {
		rep.Entry = &e
	}
	return rep
}

// Command is the argv that runs req over the volume at root in a sandbox
// whose lizard CLI is at cli.
func Command(cli, root string, req Request) ([]string, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return []string{cli, "volume-content", root, string(b)}, nil
}

// Main is `lizard volume-content ROOT REQUEST`: it runs the request and
// writes its Reply, one line of JSON, to out. Its error is only for a
// command line it cannot run; the request's own error is in the reply.
func Main(args []string, out io.Writer) error {
	if len(args) != 2 {
		return errors.New("usage: lizard volume-content ROOT REQUEST (run by the server in the sandbox that holds a volume)")
	}
	var req Request
	if err := json.Unmarshal([]byte(args[1]), &req); err != nil {
		return fmt.Errorf("volume-content: request: %w", err)
	}
	var rep Reply
	f, err := Open(args[0])
	if err != nil {
		rep.Error = &ReplyError{Class: "unavailable", Message: "the volume's mount point cannot be opened in the sandbox"}
	} else {
		defer f.Close()
		rep = f.Do(req)
	}
	return json.NewEncoder(out).Encode(rep)
}
