package server

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/lizard-build/lizard/internal/agent"
)

// FileOpCommand is the hidden argv[1] with which the agent re-executes
// itself to do one file operation as a sandbox user. The program's main (and
// a test binary's TestMain) must hand such an invocation to FileOpMain
// before anything else.
//
// The child runs with the user's uid, gid and groups, so the kernel checks
// permissions and new files belong to the user. Its protocol:
//
//	argv[2]  the operation, JSON fileOp
//	fd 3     the result, JSON fileResult, then closed; for a read it is
//	         sent (and fd 3 closed) before the data
//	stdin    for a write: the data in frames of a 4-byte big-endian length
//	         and that many bytes, ended by a zero length; without that end
//	         marker the upload counts as aborted and nothing is replaced
//	stdout   for a read: the raw bytes of the file
const FileOpCommand = "__fileop"

const (
	// selfExe re-executes the running binary without needing search
	// permission on the directories it lives in.
	selfExe  = "/proc/self/exe"
	resultFD = 3
	// frameSize is the payload of one upload frame; maxFrame is what a
	// child accepts.
	frameSize = 256 << 10
	maxFrame  = 1 << 20
)

// The operations of fileOp.Op.
const (
	opRead   = "read"
	opWrite  = "write"
	opRemove = "remove"
	opList   = "list"
	opStat   = "stat"
	opMove   = "move"
	opAccess = "access"
	// opMkdir, opTree and opEntry serve envd (envd_fs.go).
	opMkdir = "mkdir"
	opTree  = "tree"
	opEntry = "entry"
)

// fileOp is one file operation for the child.
type fileOp struct {
	Op   string `json:"op"`
	Path string `json:"path"`
	To   string `json:"to,omitempty"`
	// Depth is how many levels opTree lists (1: the directory's entries).
	Depth int `json:"depth,omitempty"`
	// Metadata is what opWrite gives the file (envd_metadata.go).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// fileResult is the child's answer; Status 0 means success.
type fileResult struct {
	Status  int               `json:"status,omitempty"`
	Code    string            `json:"code,omitempty"`
	Message string            `json:"message,omitempty"`
	Stat    *agent.FileStat   `json:"stat,omitempty"`
	List    []agent.FileEntry `json:"list,omitempty"`
	Entry   *entryStat        `json:"entry,omitempty"`
	Tree    []entryStat       `json:"tree,omitempty"`
}

func (r *fileResult) err() error {
	if r.Status == 0 {
		return nil
	}
	return &apiError{r.Status, r.Code, r.Message}
}

func failedResult(err error) fileResult {
	ae := toAPIError(err)
	return fileResult{Status: ae.status, Code: ae.code, Message: ae.msg}
}

var errUploadAborted = errors.New("upload ended without its end marker")

// FileOpMain is the whole program of the __fileop child; args are the
// arguments after FileOpCommand. It returns the exit code.
func FileOpMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "usage: lizard-agent %s OPERATION-JSON\n", FileOpCommand)
		return 2
	}
	var op fileOp
	if err := json.Unmarshal([]byte(args[0]), &op); err != nil {
		fmt.Fprintf(os.Stderr, "lizard-agent %s: bad operation: %v\n", FileOpCommand, err)
		return 2
	}
	if err := runChildOp(op, os.NewFile(resultFD, "result")); err != nil {
		fmt.Fprintf(os.Stderr, "lizard-agent %s %s %s: %v\n", FileOpCommand, op.Op, op.Path, err)
		return 1
	}
	return 0
}

func runChildOp(op fileOp, result *os.File) error {
	switch op.Op {
	case opRead:
		return childRead(op.Path, result)
	case opWrite:
		err := writeFile(op.Path, newFrameReader(os.Stdin), op.Metadata)
		if err != nil {
			return sendResult(result, failedResult(err))
		}
		return sendResult(result, fileResult{})
	}
	res, err := simpleOp(op)
	if err != nil {
		res = failedResult(err)
	}
	return sendResult(result, res)
}

func childRead(p string, result *os.File) error {
	f, err := openRegular(p)
	if err != nil {
		return sendResult(result, failedResult(err))
	}
	defer f.Close()
	if err := sendResult(result, fileResult{}); err != nil {
		return err
	}
	_, err = io.Copy(os.Stdout, f)
	return err
}

// simpleOp runs an operation that moves no file data, in this process.
func simpleOp(op fileOp) (fileResult, error) {
	switch op.Op {
	case opRemove:
		return fileResult{}, removePath(op.Path)
	case opMove:
		return fileResult{}, movePath(op.Path, op.To)
	case opStat:
		st, err := statPath(op.Path)
		return fileResult{Stat: &st}, err
	case opList:
		l, err := listDir(op.Path)
		return fileResult{List: l}, err
	case opAccess:
		return fileResult{}, checkReadable(op.Path)
	case opMkdir:
		return fileResult{}, makeDir(op.Path)
	case opTree:
		t, err := listTree(op.Path, op.Depth)
		return fileResult{Tree: t}, err
	case opEntry:
		e, err := statEntry(op.Path)
		return fileResult{Entry: &e}, err
	}
	return fileResult{}, fmt.Errorf("unknown file operation %q", op.Op)
}

func sendResult(f *os.File, res fileResult) error {
	err := json.NewEncoder(f).Encode(res)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// opChild is a running __fileop child, seen from the agent.
type opChild struct {
	status <-chan syscall.WaitStatus
	result *os.File // read end of the child's fd 3
	stdin  *os.File // write end of the child's stdin, for writes
	stdout *os.File // read end of the child's stdout, for reads
}

// startFileOp starts a child doing op as acct. Its exit is collected by the
// reaper like every other child's.
func (s *Server) startFileOp(acct *account, op fileOp) (*opChild, error) {
	spec, err := json.Marshal(op)
	if err != nil {
		return nil, fmt.Errorf("encoding file operation: %w", err)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
	}
	defer devnull.Close()
	c := &opChild{}
	files := []*os.File{devnull, devnull, os.Stderr, nil}
	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	pipes := []struct {
		slot   int
		parent **os.File
		toKid  bool // the child reads this pipe
		wanted bool
	}{
		{3, &c.result, false, true},
		{0, &c.stdin, true, op.Op == opWrite},
		{1, &c.stdout, false, op.Op == opRead},
	}
	for _, p := range pipes {
		if !p.wanted {
			continue
		}
		r, w, err := os.Pipe()
		if err != nil {
			c.close()
			return nil, fmt.Errorf("creating pipe: %w", err)
		}
		kid, parent := w, r
		if p.toKid {
			kid, parent = r, w
		}
		files[p.slot] = kid
		childEnds = append(childEnds, kid)
		*p.parent = parent
	}
	attr := &os.ProcAttr{
		Dir:   "/",
		Env:   []string{}, // nothing of the agent's environment
		Files: files,
		Sys:   &syscall.SysProcAttr{Credential: acct.credential()},
	}
	_, status, err := s.reaper.startProcess(selfExe, []string{"lizard-agent", FileOpCommand, string(spec)}, attr)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("starting %s child: %w", FileOpCommand, err)
	}
	c.status = status
	return c, nil
}

func (c *opChild) close() {
	for _, f := range []*os.File{c.result, c.stdin, c.stdout} {
		if f != nil {
			f.Close()
		}
	}
}

// readResult reads the child's result; it returns once the child has closed
// fd 3 (or exited).
func (c *opChild) readResult() (fileResult, error) {
	defer c.result.Close()
	b, err := io.ReadAll(c.result)
	if err != nil {
		return fileResult{}, fmt.Errorf("reading %s result: %w", FileOpCommand, err)
	}
	var res fileResult
	if len(b) == 0 {
		return res, fmt.Errorf("%s child ended without a result", FileOpCommand)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("decoding %s result: %w", FileOpCommand, err)
	}
	return res, nil
}

// runFileOp runs a child for an operation that moves no file data.
func (s *Server) runFileOp(acct *account, op fileOp) (fileResult, error) {
	c, err := s.startFileOp(acct, op)
	if err != nil {
		return fileResult{}, err
	}
	res, err := c.readResult()
	ws := <-c.status
	if err != nil {
		return res, fmt.Errorf("%w (child exit code %d)", err, exitCode(ws))
	}
	return res, res.err()
}

// writeFrames copies src to dst in upload frames and ends with the end
// marker, unless reading src fails: then the child sees no marker and
// discards what it got.
func writeFrames(dst io.Writer, src io.Reader) error {
	buf := make([]byte, 4+frameSize)
	for {
		n, rerr := src.Read(buf[4:])
		if n > 0 {
			binary.BigEndian.PutUint32(buf[:4], uint32(n))
			if _, err := dst.Write(buf[:4+n]); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			binary.BigEndian.PutUint32(buf[:4], 0)
			_, err := dst.Write(buf[:4])
			return err
		}
		if rerr != nil {
			return rerr
		}
	}
}

// frameReader reads the payload of upload frames; a missing end marker is
// an error, not EOF.
type frameReader struct {
	r    *bufio.Reader
	left int
	done bool
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, frameSize+4)}
}

func (f *frameReader) Read(p []byte) (int, error) {
	for f.left == 0 {
		if f.done {
			return 0, io.EOF
		}
		var hdr [4]byte
		if _, err := io.ReadFull(f.r, hdr[:]); err != nil {
			return 0, errUploadAborted
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			f.done = true
			return 0, io.EOF
		}
		if n > maxFrame {
			return 0, fmt.Errorf("upload frame of %d bytes is larger than %d", n, maxFrame)
		}
		f.left = int(n)
	}
	if len(p) > f.left {
		p = p[:f.left]
	}
	n, err := f.r.Read(p)
	f.left -= n
	if errors.Is(err, io.EOF) {
		err = errUploadAborted
	}
	if n > 0 && err == errUploadAborted {
		// Hand over the bytes; the next Read reports the abort.
		err = nil
	}
	return n, err
}
