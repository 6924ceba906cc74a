package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/agent"
	fspb "github.com/lizard-build/lizard/internal/envd/filesystem"
	"github.com/lizard-build/lizard/internal/envd/filesystem/filesystemconnect"
	pb "github.com/lizard-build/lizard/internal/envd/process"
	"github.com/lizard-build/lizard/internal/envd/process/processconnect"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// envdHeaders adds what the proxy adds to E2B traffic, and what an E2B
// client adds (access token, Basic auth user).
type envdHeaders struct {
	next  http.RoundTripper
	token string
	user  string
}

func (h *envdHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(agent.EnvdHeader, "1")
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	if h.user != "" {
		r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(h.user+":")))
	}
	return h.next.RoundTrip(r)
}

type envdEnv struct {
	ts    *httptest.Server
	agent *agent.Client
	http  *http.Client // envd traffic, no access token
}

func newEnvd(t *testing.T) *envdEnv {
	ts := newTestServer(t)
	return &envdEnv{
		ts:    ts,
		agent: agent.NewClient(ts.URL, testToken, ts.Client()),
		http:  &http.Client{Transport: &envdHeaders{next: ts.Client().Transport}},
	}
}

func (e *envdEnv) client(token, user string) *http.Client {
	return &http.Client{Transport: &envdHeaders{next: e.ts.Client().Transport, token: token, user: user}}
}

func (e *envdEnv) process(hc *http.Client) processconnect.ProcessClient {
	return processconnect.NewProcessClient(hc, e.ts.URL, connect.WithProtoJSON())
}

func (e *envdEnv) fs(hc *http.Client) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(hc, e.ts.URL, connect.WithProtoJSON())
}

// procRun is what a Start or Connect stream carried.
type procRun struct {
	pid    uint32
	stdout string
	stderr string
	pty    string
	end    *pb.ProcessEvent_EndEvent
	first  string // the first event's kind
}

func (r *procRun) add(ev *pb.ProcessEvent) {
	kind := ""
	switch e := ev.Event.(type) {
	case *pb.ProcessEvent_Start:
		kind, r.pid = "start", e.Start.Pid
	case *pb.ProcessEvent_Data:
		kind = "data"
		r.stdout += string(e.Data.GetStdout())
		r.stderr += string(e.Data.GetStderr())
		r.pty += string(e.Data.GetPty())
	case *pb.ProcessEvent_End:
		kind, r.end = "end", e.End
	case *pb.ProcessEvent_Keepalive:
		kind = "keepalive"
	}
	if r.first == "" {
		r.first = kind
	}
}

func startReq(cmd string) *connect.Request[pb.StartRequest] {
	return connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}})
}

// runToEnd reads a whole Start stream.
func runToEnd(t *testing.T, st *connect.ServerStreamForClient[pb.StartResponse]) *procRun {
	t.Helper()
	r := &procRun{}
	for st.Receive() {
		r.add(st.Msg().Event)
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if r.first != "start" || r.end == nil {
		t.Fatalf("stream: first event %q, end %v; want start first and an end", r.first, r.end)
	}
	return r
}

func TestEnvdProcessRun(t *testing.T) {
	e := newEnvd(t)
	dir := testDir(t)
	pc := e.process(e.http)
	ctx := testContext(t)

	req := startReq(`echo "out $FOO $(pwd)"; echo err >&2; exit 3`)
	req.Msg.Process.Envs = map[string]string{"FOO": "bar"}
	req.Msg.Process.Cwd = &dir
	st, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r := runToEnd(t, st)
	if want := "out bar " + dir + "\n"; r.stdout != want || r.stderr != "err\n" {
		t.Errorf("stdout %q stderr %q, want %q and %q", r.stdout, r.stderr, want, "err\n")
	}
	if r.end.ExitCode != 3 || !r.end.Exited || r.end.Status != "exit status 3" {
		t.Errorf("end = %v, want exit 3, exited, \"exit status 3\"", r.end)
	}

	// The sandbox's envs under the request's; the default user and workdir.
	if err := e.agent.SetEnvd(ctx, agent.EnvdRequest{User: "nobody", Workdir: dir, Env: map[string]string{"A": "sandbox", "B": "sandbox"}}); err != nil {
		t.Fatal(err)
	}
	req = startReq(`echo "$A $B $(id -un) $(pwd)"`)
	req.Msg.Process.Envs = map[string]string{"B": "request"}
	r = runToEnd(t, must(pc.Start(ctx, req)))
	if want := "sandbox request nobody " + dir + "\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	// A Basic auth user runs as themself, in their home.
	r = runToEnd(t, must(e.process(e.client("", "root")).Start(ctx, startReq(`echo "$(id -un) $(pwd)"`))))
	if r.stdout != "root /root\n" {
		t.Errorf("as root: stdout %q, want %q", r.stdout, "root /root\n")
	}
	// Bad input is a Connect error, not a stream.
	_, err = e.process(e.client("", "no-such-user")).Start(ctx, startReq("true"))
	if err == nil {
		st := must(e.process(e.client("", "no-such-user")).Start(ctx, startReq("true")))
		st.Receive()
		err = st.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown user: %v, want invalid_argument", err)
	}
}

// must returns v, or panics (failing the test with its stack) when a call
// the test is not about fails.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestEnvdProcessStdinConnectListSignal(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	pc := e.process(e.http)

	tag := "cat-1"
	req := startReq("cat")
	req.Msg.Tag = &tag
	st, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().Event.GetStart().GetPid()
	killAtEnd(t, int(pid))
	// A second client attaches by tag and sees what comes next.
	cst, err := pc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !cst.Receive() || cst.Msg().Event.GetStart().GetPid() != pid {
		t.Fatalf("connect: first event %v (%v), want start{%d}", cst.Msg(), cst.Err(), pid)
	}
	list := must(pc.List(ctx, connect.NewRequest(&pb.ListRequest{})))
	found := false
	for _, p := range list.Msg.Processes {
		if p.Pid == pid && p.GetTag() == tag && p.Config.Cmd == "/bin/bash" {
			found = true
		}
	}
	if !found {
		t.Errorf("List has no pid %d tagged %q: %v", pid, tag, list.Msg.Processes)
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r := &procRun{first: "start"}
	for st.Receive() {
		r.add(st.Msg().Event)
	}
	c := &procRun{first: "start"}
	for cst.Receive() {
		c.add(cst.Msg().Event)
	}
	if r.stdout != "hello\n" || r.end.GetExitCode() != 0 || c.stdout != "hello\n" || c.end == nil {
		t.Errorf("start stream %q end %v; connect stream %q end %v; want hello and exit 0 on both", r.stdout, r.end, c.stdout, c.end)
	}

	// SIGKILL ends a process as Go's os.ProcessState says.
	st = must(pc.Start(ctx, startReq("sleep 600")))
	st.Receive()
	pid = st.Msg().Event.GetStart().GetPid()
	killAtEnd(t, int(pid))
	sel = &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r = &procRun{first: "start"}
	for st.Receive() {
		r.add(st.Msg().Event)
	}
	if r.end.GetExitCode() != -1 || r.end.GetExited() || r.end.GetStatus() != "signal: killed" {
		t.Errorf("killed: end %v, want -1, not exited, signal: killed", r.end)
	}
	_, err = pc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("signal of an unknown pid: %v, want not_found", err)
	}
}

func TestEnvdProcessTimeoutAndDisconnect(t *testing.T) {
	e := newEnvd(t)
	pc := e.process(e.http)

	// The client's deadline (Connect-Timeout-Ms) bounds the process.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	st, err := pc.Start(ctx, startReq("sleep 600"))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := int(st.Msg().Event.GetStart().GetPid())
	killAtEnd(t, pid)
	for st.Receive() {
	}
	waitGone(t, pid)

	// A client that leaves does not end the process.
	ctx2, cancel2 := context.WithCancel(context.Background())
	st, err = pc.Start(ctx2, startReq("read line; echo got $line"))
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid = int(st.Msg().Event.GetStart().GetPid())
	killAtEnd(t, pid)
	cancel2()
	st.Close()
	ctx3 := testContext(t)
	cst := must(pc.Connect(ctx3, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: uint32(pid)}}})))
	cst.Receive()
	if _, err := pc.SendInput(ctx3, connect.NewRequest(&pb.SendInputRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: uint32(pid)}}, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x\n")}}})); err != nil {
		t.Fatalf("input after the first client left: %v", err)
	}
	r := &procRun{first: "start"}
	for cst.Receive() {
		r.add(cst.Msg().Event)
	}
	if r.stdout != "got x\n" || r.end.GetExitCode() != 0 {
		t.Errorf("after disconnect: stdout %q end %v, want \"got x\" and exit 0", r.stdout, r.end)
	}
}

func TestEnvdPty(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	pc := e.process(e.http)
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: map[string]string{"PS1": "$ "}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	})
	st, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	st.Receive()
	pid := st.Msg().Event.GetStart().GetPid()
	killAtEnd(t, int(pid))
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := pc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 101, Rows: 33}}})); err != nil {
		t.Fatal(err)
	}
	input := func(s string) {
		if _, err := pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	input("stty size; echo $((6*7))x\n")
	input("exit 5\n")
	r := &procRun{first: "start"}
	for st.Receive() {
		r.add(st.Msg().Event)
	}
	if !strings.Contains(r.pty, "33 101") || !strings.Contains(r.pty, "42x") || r.end.GetExitCode() != 5 {
		t.Errorf("pty output %q end %v: want the new size, 42x and exit 5", r.pty, r.end)
	}
	_, err = pc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
	if err == nil {
		t.Errorf("CloseStdin of an exited pty process succeeded")
	}
}

func TestEnvdFilesystem(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	fc := e.fs(e.http)
	dir := testDir(t)

	md := must(fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir + "/a/b"})))
	if md.Msg.Entry.Type != fspb.FileType_FILE_TYPE_DIRECTORY || md.Msg.Entry.Path != dir+"/a/b" {
		t.Errorf("MakeDir entry %v", md.Msg.Entry)
	}
	_, err := fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: dir + "/a/b"}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("MakeDir again: %v, want already_exists", err)
	}
	if err := os.WriteFile(dir+"/a/b/f.txt", []byte("12345"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b/f.txt", dir+"/a/link"); err != nil {
		t.Fatal(err)
	}
	st := must(fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/a/b/f.txt"})))
	if en := st.Msg.Entry; en.Name != "f.txt" || en.Size != 5 || en.Mode != 0o640 || en.Permissions != "-rw-r-----" || en.Owner != "root" || en.Type != fspb.FileType_FILE_TYPE_FILE || en.ModifiedTime.AsTime().IsZero() {
		t.Errorf("Stat = %v", en)
	}
	// A symlink's target is absolute, a relative one (dangling or not)
	// taken from the link's directory.
	if err := os.Symlink("../../dangling", dir+"/a/b/up"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", dir+"/a/abs"); err != nil {
		t.Fatal(err)
	}
	for link, want := range map[string]string{"a/link": dir + "/a/b/f.txt", "a/b/up": dir + "/dangling", "a/abs": "/etc/hostname"} {
		st = must(fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: dir + "/" + link})))
		if st.Msg.Entry.Type != fspb.FileType_FILE_TYPE_SYMLINK || st.Msg.Entry.GetSymlinkTarget() != want {
			t.Errorf("Stat of symlink %s = %v, want target %s", link, st.Msg.Entry, want)
		}
	}
	if err := os.Remove(dir + "/a/b/up"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir + "/a/abs"); err != nil {
		t.Fatal(err)
	}
	names := func(depth uint32) []string {
		l := must(fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: depth})))
		var out []string
		for _, en := range l.Msg.Entries {
			out = append(out, strings.TrimPrefix(en.Path, dir+"/"))
		}
		return out
	}
	if got := fmt.Sprint(names(1)); got != "[a]" {
		t.Errorf("ListDir depth 1 = %s", got)
	}
	if got := fmt.Sprint(names(3)); got != "[a a/b a/b/f.txt a/link]" {
		t.Errorf("ListDir depth 3 = %s", got)
	}
	l := must(fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir + "/a"})))
	for _, en := range l.Msg.Entries {
		if en.Name == "link" && en.GetSymlinkTarget() != dir+"/a/b/f.txt" {
			t.Errorf("ListDir's symlink entry %v, want target %s", en, dir+"/a/b/f.txt")
		}
	}
	mv := must(fc.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: dir + "/a/b/f.txt", Destination: dir + "/g.txt"})))
	if mv.Msg.Entry.Path != dir+"/g.txt" || mv.Msg.Entry.Size != 5 {
		t.Errorf("Move entry %v", mv.Msg.Entry)
	}
	if _, err := fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/a"})); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir + "/a", dir + "/a/b/f.txt"} {
		_, err = fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: p}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("Stat %s after removal: %v, want not_found", p, err)
		}
	}
	// Removing what is not there succeeds, as in E2B's envd; what the
	// user may not remove is still refused.
	for _, p := range []string{dir + "/a", dir + "/no/such/dir"} {
		if _, err := fc.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: p})); err != nil {
			t.Errorf("Remove of missing %s: %v, want success", p, err)
		}
	}
	_, err = e.fs(e.client("", "nobody")).Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: dir + "/g.txt"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("Remove as nobody of root's file: %v, want permission_denied", err)
	}
	_, err = fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir + "/g.txt"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("ListDir of a file: %v, want invalid_argument", err)
	}

	// Relative paths are the user's home's.
	rel := fmt.Sprintf("lizard-envd-test-%d", time.Now().UnixNano())
	t.Cleanup(func() { os.RemoveAll("/root/" + rel) })
	md = must(fc.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: rel})))
	if md.Msg.Entry.Path != "/root/"+rel {
		t.Errorf("MakeDir %q made %s, want it in /root", rel, md.Msg.Entry.Path)
	}

	// As another user, the kernel's permission checks apply.
	_, err = e.fs(e.client("", "nobody")).MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "/root/" + rel + "/x"}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("MakeDir as nobody in /root: %v, want permission_denied", err)
	}
}

func TestEnvdWatch(t *testing.T) {
	e := newEnvd(t)
	fc := e.fs(e.http)
	dir := testDir(t)
	if err := os.Mkdir(dir+"/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	ws, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !ws.Receive() || ws.Msg().GetStart() == nil {
		t.Fatalf("first WatchDir event %v (%v), want start", ws.Msg(), ws.Err())
	}
	if err := os.WriteFile(dir+"/sub/new.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for ws.Receive() {
		if ev := ws.Msg().GetFilesystem(); ev != nil && ev.Name == "sub/new.txt" && ev.Type == fspb.EventType_EVENT_TYPE_CREATE {
			break
		}
	}
	if err := ws.Err(); err != nil {
		t.Fatalf("WatchDir: %v", err)
	}

	// The polled trio.
	cw := must(fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir})))
	id := cw.Msg.WatcherId
	if err := os.Remove(dir + "/sub/new.txt"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/top.txt", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for len(got) == 0 && time.Now().Before(deadline) {
		evs := must(fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id})))
		for _, ev := range evs.Msg.Events {
			got = append(got, ev.Type.String()+" "+ev.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Not recursive: sub/new.txt's removal is not reported.
	if len(got) == 0 || got[0] != "EVENT_TYPE_CREATE top.txt" {
		t.Errorf("watcher events %q, want a create of top.txt first", got)
	}
	if _, err := fc.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("events of a removed watcher: %v, want not_found", err)
	}
	_, err = fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir + "/missing"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("watching a missing path: %v, want not_found", err)
	}
	// Only directories are watched, as by E2B's envd.
	_, err = fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir + "/top.txt"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("CreateWatcher of a file: %v, want invalid_argument, not a directory", err)
	}
	for path, want := range map[string]connect.Code{dir + "/top.txt": connect.CodeInvalidArgument, dir + "/missing": connect.CodeNotFound} {
		if err := watchDirErr(ctx, fc, path); connect.CodeOf(err) != want {
			t.Errorf("WatchDir of %s: %v, want %v", path, err, want)
		}
	}
}

// watchDirErr is the error a WatchDir of path fails with (nil when it
// starts).
func watchDirErr(ctx context.Context, fc filesystemconnect.FilesystemClient, path string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ws, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: path}))
	if err != nil {
		return err
	}
	defer ws.Close()
	if !ws.Receive() {
		return ws.Err()
	}
	return nil
}

func TestEnvdWatchEntries(t *testing.T) {
	e := newEnvd(t)
	fc := e.fs(e.http)
	dir := testDir(t)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	// include_entry: creates, writes and chmods carry what is at the path;
	// removes do not. allow_network_mounts changes nothing on a local disk.
	ws, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, IncludeEntry: true, AllowNetworkMounts: true}))
	if err != nil {
		t.Fatal(err)
	}
	if !ws.Receive() || ws.Msg().GetStart() == nil {
		t.Fatalf("first WatchDir event %v (%v), want start", ws.Msg(), ws.Err())
	}
	cw := must(fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir, IncludeEntry: true})))
	plain := must(fc.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir})))
	if err := os.WriteFile(dir+"/f.txt", []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir + "/f.txt"); err != nil {
		t.Fatal(err)
	}
	check := func(from string, ev *fspb.FilesystemEvent) (removed bool) {
		switch ev.Type {
		case fspb.EventType_EVENT_TYPE_REMOVE:
			if ev.Entry != nil {
				t.Errorf("%s: remove event with an entry %v", from, ev.Entry)
			}
			return true
		case fspb.EventType_EVENT_TYPE_CREATE, fspb.EventType_EVENT_TYPE_WRITE:
			// The file may be gone by the time the event is handled.
			if en := ev.Entry; en != nil && (en.Path != dir+"/"+ev.Name || en.Name != ev.Name || en.Type != fspb.FileType_FILE_TYPE_FILE) {
				t.Errorf("%s: %v event of %s has the entry %v, want that file's", from, ev.Type, ev.Name, en)
			}
		}
		return false
	}
	for ws.Receive() {
		if ev := ws.Msg().GetFilesystem(); ev != nil && check("WatchDir", ev) {
			break
		}
	}
	if err := ws.Err(); err != nil {
		t.Fatal(err)
	}
	// Polled: the file stays, so its create carries an entry.
	if err := os.WriteFile(dir+"/g.txt", []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	var withEntry, plainEntries int
	deadline := time.Now().Add(10 * time.Second)
	for withEntry == 0 && time.Now().Before(deadline) {
		for _, ev := range must(fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: cw.Msg.WatcherId}))).Msg.Events {
			check("GetWatcherEvents", ev)
			if ev.Name == "g.txt" && ev.Entry != nil && ev.Entry.Size == 2 {
				withEntry++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if withEntry == 0 {
		t.Errorf("no event of g.txt carried its entry")
	}
	for _, ev := range must(fc.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: plain.Msg.WatcherId}))).Msg.Events {
		if ev.Entry != nil {
			plainEntries++
		}
	}
	if plainEntries != 0 {
		t.Errorf("a watcher without include_entry got %d entries", plainEntries)
	}
}

// filesURL is GET or POST /files's URL.
func (e *envdEnv) filesURL(q url.Values) string { return e.ts.URL + "/files?" + q.Encode() }

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEnvdFilesUpDownload(t *testing.T) {
	e := newEnvd(t)
	dir := testDir(t)

	// Multipart: files named by their part's filename (full paths).
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, data := range map[string]string{dir + "/m/one.txt": "one", dir + "/m/two.txt": "two"} {
		pw := must(mw.CreateFormFile("file", name))
		io.WriteString(pw, data)
	}
	mw.Close()
	resp := must(e.http.Post(e.filesURL(url.Values{}), mw.FormDataContentType(), &buf))
	body := readBody(t, resp)
	var entries []struct{ Name, Type, Path string }
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &entries) != nil || len(entries) != 2 {
		t.Fatalf("multipart upload: %d %s", resp.StatusCode, body)
	}
	for _, n := range []string{"one", "two"} {
		if b, err := os.ReadFile(dir + "/m/" + n + ".txt"); err != nil || string(b) != n {
			t.Errorf("%s.txt = %q, %v", n, b, err)
		}
	}

	// Octet-stream, gzip, as another user: the file is theirs.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	payload := bytes.Repeat([]byte("lizard "), 100000)
	zw.Write(payload)
	zw.Close()
	req := must(http.NewRequest("POST", e.filesURL(url.Values{"path": {dir + "/z.bin"}, "username": {"nobody"}}), &gz))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	resp = must(e.http.Do(req))
	if body := readBody(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"path":"`+dir+`/z.bin"`) {
		t.Fatalf("gzip upload: %d %s", resp.StatusCode, body)
	}
	resp = must(e.client("", "nobody").Get(e.filesURL(url.Values{"path": {dir + "/z.bin"}})))
	if got := readBody(t, resp); resp.StatusCode != 200 || got != string(payload) {
		t.Errorf("download: %d, %d bytes, want %d", resp.StatusCode, len(got), len(payload))
	}
	if out := runExec(t, e.agent, agent.ExecRequest{Cmd: []string{"stat", "-c", "%U", dir + "/z.bin"}}); out.out() != "nobody" {
		t.Errorf("owner of the upload = %q, want nobody", out.out())
	}

	// Errors are E2B's {code, message}.
	resp = must(e.http.Get(e.filesURL(url.Values{"path": {dir + "/missing"}})))
	var eb struct {
		Code    int
		Message string
	}
	if body := readBody(t, resp); resp.StatusCode != 404 || json.Unmarshal([]byte(body), &eb) != nil || eb.Code != 404 || eb.Message == "" {
		t.Errorf("missing file: %d %s, want 404 {code: 404, message}", resp.StatusCode, body)
	}
	req = must(http.NewRequest("POST", e.filesURL(url.Values{}), strings.NewReader("x")))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp = must(e.http.Do(req))
	if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, "path") {
		t.Errorf("octet-stream upload without path: %d %s, want 400 naming path", resp.StatusCode, body)
	}
}

// sign computes a signed URL's parameters as E2B's SDK does.
func sign(path, op, user, token string, exp int64) url.Values {
	raw := path + ":" + op + ":" + user + ":" + token
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
		q.Set("signature_expiration", strconv.FormatInt(exp, 10))
	}
	sum := sha256.Sum256([]byte(raw))
	q.Set("signature", "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	return q
}

func TestEnvdAuth(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	dir := testDir(t)
	if err := os.WriteFile(dir+"/f", []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	const token = "0123456789abcdef0123456789abcdef"

	// Not secure: no token needed.
	if _, err := e.process(e.http).List(ctx, connect.NewRequest(&pb.ListRequest{})); err != nil {
		t.Fatalf("List without token on a non-secure envd: %v", err)
	}
	if err := e.agent.SetEnvdToken(ctx, token, true); err != nil {
		t.Fatal(err)
	}
	_, err := e.process(e.http).List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("List without token: %v, want unauthenticated", err)
	}
	_, err = e.process(e.client("wrong-token-wrong-token", "")).List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("List with a wrong token: %v, want unauthenticated", err)
	}
	if _, err := e.process(e.client(token, "")).List(ctx, connect.NewRequest(&pb.ListRequest{})); err != nil {
		t.Errorf("List with the token: %v", err)
	}
	resp := must(e.http.Get(e.ts.URL + "/health"))
	if readBody(t, resp); resp.StatusCode != 204 {
		t.Errorf("/health: %d, want 204", resp.StatusCode)
	}

	// Signed URLs.
	get := func(q url.Values) int {
		resp := must(e.http.Get(e.filesURL(q)))
		readBody(t, resp)
		return resp.StatusCode
	}
	if c := get(sign(dir+"/f", "read", "", token, 0)); c != 200 {
		t.Errorf("signed download: %d", c)
	}
	if c := get(sign(dir+"/f", "read", "root", token, time.Now().Unix()+60)); c != 200 {
		t.Errorf("signed download with user and expiration: %d", c)
	}
	for name, q := range map[string]url.Values{
		"expired":     sign(dir+"/f", "read", "", token, time.Now().Unix()-1),
		"write op":    sign(dir+"/f", "write", "", token, 0),
		"other token": sign(dir+"/f", "read", "", token+"x", 0),
		"unsigned":    {"path": {dir + "/f"}},
		"other path":  func() url.Values { q := sign(dir+"/g", "read", "", token, 0); q.Set("path", dir+"/f"); return q }(),
		"other user":  func() url.Values { q := sign(dir+"/f", "read", "", token, 0); q.Set("username", "root"); return q }(),
		"moved expires": func() url.Values {
			q := sign(dir+"/f", "read", "", token, 100)
			q.Set("signature_expiration", "99999999999")
			return q
		}(),
	} {
		if c := get(q); c != 401 {
			t.Errorf("%s: %d, want 401", name, c)
		}
	}
	up := sign(dir+"/up", "write", "", token, 0)
	resp = must(e.http.Post(e.filesURL(up), "application/octet-stream", strings.NewReader("via signed url")))
	if readBody(t, resp); resp.StatusCode != 200 {
		t.Errorf("signed upload: %d", resp.StatusCode)
	}
	if b, _ := os.ReadFile(dir + "/up"); string(b) != "via signed url" {
		t.Errorf("signed upload wrote %q", b)
	}

	// The agent's own routes are never envd's, and envd's config needs the
	// agent token.
	resp = must(e.client(token, "").Get(e.ts.URL + "/processes"))
	if body := readBody(t, resp); resp.StatusCode != 404 {
		t.Errorf("agent route through envd: %d %s, want 404", resp.StatusCode, body)
	}
	resp = must(http.Post(e.ts.URL+"/envd/token", "application/json", strings.NewReader(`{"secure":false}`)))
	if readBody(t, resp); resp.StatusCode != 401 {
		t.Errorf("POST /envd/token without the agent token: %d, want 401", resp.StatusCode)
	}
	err = e.agent.SetEnvd(ctx, agent.EnvdRequest{Secure: true, Token: "short"})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a short secure token: %v, want invalid", err)
	}
	// Not secure again: no token needed.
	if err := e.agent.SetEnvdToken(ctx, "", false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.process(e.http).List(ctx, connect.NewRequest(&pb.ListRequest{})); err != nil {
		t.Errorf("List after secure was turned off: %v", err)
	}
}

func TestEnvdStreamInputAndKeepalive(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	pc := e.process(e.http)

	// Keepalives come at the client's interval while the process is quiet.
	req := startReq("read line; echo got $line")
	stdin := true
	req.Msg.Stdin = &stdin
	req.Header().Set("Keepalive-Ping-Interval", "1")
	st, err := pc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() {
		t.Fatalf("no start event: %v", st.Err())
	}
	pid := st.Msg().Event.GetStart().GetPid()
	killAtEnd(t, int(pid))
	if !st.Receive() || st.Msg().Event.GetKeepalive() == nil {
		t.Fatalf("second event of a quiet process: %v (%v), want a keepalive", st.Msg(), st.Err())
	}

	// StreamInput: a start event names the process, data events follow.
	in := pc.StreamInput(ctx)
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if err := in.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}}); err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{"stre", "amed\n"} {
		ev := &pb.StreamInputRequest{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(part)}}}}}
		if err := in.Send(ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("StreamInput: %v", err)
	}
	r := &procRun{first: "start"}
	for st.Receive() {
		r.add(st.Msg().Event)
	}
	if r.stdout != "got streamed\n" || r.end.GetExitCode() != 0 {
		t.Errorf("stdout %q end %v, want \"got streamed\" and exit 0", r.stdout, r.end)
	}

	// Data before a start event is refused.
	in = pc.StreamInput(ctx)
	_ = in.Send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}}})
	if _, err := in.CloseAndReceive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("StreamInput data before start: %v, want invalid_argument", err)
	}
}

// upload POSTs data to /files as octet-stream (multipart when multi),
// with headers, and returns the status and body.
func (e *envdEnv) upload(t *testing.T, hc *http.Client, path, data string, multi bool, headers map[string]string) (int, string) {
	t.Helper()
	var body io.Reader = strings.NewReader(data)
	ctype := "application/octet-stream"
	q := url.Values{"path": {path}}
	if multi {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		pw := must(mw.CreateFormFile("file", path))
		io.WriteString(pw, data)
		mw.Close()
		body, ctype, q = &buf, mw.FormDataContentType(), url.Values{}
	}
	req := must(http.NewRequest("POST", e.filesURL(q), body))
	req.Header.Set("Content-Type", ctype)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp := must(hc.Do(req))
	return resp.StatusCode, readBody(t, resp)
}

func TestEnvdFileMetadata(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	dir := testDir(t)
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	fc := e.fs(e.http)
	entryMD := func(p string) map[string]string {
		return must(fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: p}))).Msg.Entry.Metadata
	}
	md := map[string]string{"X-Metadata-Author": "mish", "x-metadata-purpose": "up load"}
	want := map[string]string{"author": "mish", "purpose": "up load"}
	for _, tt := range []struct {
		name  string
		hc    *http.Client
		multi bool
	}{
		{"root, octet-stream", e.http, false},
		{"nobody, multipart", e.client("", "nobody"), true},
	} {
		p := dir + "/" + strings.ReplaceAll(tt.name, ", ", "-")
		code, body := e.upload(t, tt.hc, p, "data", tt.multi, md)
		var got []struct{ Metadata map[string]string }
		if code != 200 || json.Unmarshal([]byte(body), &got) != nil || len(got) != 1 || fmt.Sprint(got[0].Metadata) != fmt.Sprint(want) {
			t.Errorf("%s: upload %d %s, want 200 with metadata %v", tt.name, code, body, want)
		}
		if got := entryMD(p); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: Stat metadata %v, want %v", tt.name, got, want)
		}
	}
	p := dir + "/root-octet-stream"
	l := must(fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: dir})))
	for _, en := range l.Msg.Entries {
		if fmt.Sprint(en.Metadata) != fmt.Sprint(want) {
			t.Errorf("ListDir entry %s has metadata %v, want %v", en.Name, en.Metadata, want)
		}
	}
	mv := must(fc.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: p, Destination: dir + "/moved"})))
	if fmt.Sprint(mv.Msg.Entry.Metadata) != fmt.Sprint(want) {
		t.Errorf("Move entry metadata %v, want %v", mv.Msg.Entry.Metadata, want)
	}
	// Overwriting replaces the metadata: none given, none left.
	if code, body := e.upload(t, e.http, dir+"/moved", "new", false, nil); code != 200 || strings.Contains(body, "metadata") {
		t.Errorf("overwrite without metadata: %d %s, want 200 without metadata", code, body)
	}
	if got := entryMD(dir + "/moved"); got != nil {
		t.Errorf("metadata after an overwrite without any: %v", got)
	}
	// Attributes set in the sandbox are metadata too; others are not.
	if err := unix.Setxattr(dir+"/moved", "user.e2b.tool", []byte("setfattr"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(dir+"/moved", "user.other", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if got := entryMD(dir + "/moved"); fmt.Sprint(got) != "map[tool:setfattr]" {
		t.Errorf("metadata set by setxattr: %v, want map[tool:setfattr]", got)
	}

	// Bad metadata is a 400 naming the problem, and writes nothing.
	for name, tt := range map[string]struct {
		headers map[string]string
		want    string
	}{
		"empty key":           {map[string]string{"X-Metadata-": "v"}, "empty"},
		"tab in a value":      {map[string]string{"X-Metadata-K": "a\tb"}, "printable"},
		"non-ASCII value":     {map[string]string{"X-Metadata-K": "caf\xc3\xa9"}, "printable"},
		"too much":            {map[string]string{"X-Metadata-K": strings.Repeat("v", 4100)}, "4096"},
		"a key too long":      {map[string]string{"X-Metadata-" + strings.Repeat("k", 250): "v"}, "246"},
		"two values of a key": {nil, "once"},
	} {
		p := dir + "/bad"
		var code int
		var body string
		if tt.headers == nil {
			req := must(http.NewRequest("POST", e.filesURL(url.Values{"path": {p}}), strings.NewReader("x")))
			req.Header.Set("Content-Type", "application/octet-stream")
			req.Header.Add("X-Metadata-K", "1")
			req.Header.Add("X-Metadata-K", "2")
			resp := must(e.http.Do(req))
			code, body = resp.StatusCode, readBody(t, resp)
		} else {
			code, body = e.upload(t, e.http, p, "x", false, tt.headers)
		}
		if code != 400 || !strings.Contains(body, tt.want) {
			t.Errorf("%s: %d %s, want 400 mentioning %q", name, code, body, tt.want)
		}
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s: the refused upload wrote %s", name, p)
		}
	}
}

func TestEnvdListShowsConfigEnvs(t *testing.T) {
	e := newEnvd(t)
	ctx := testContext(t)
	pc := e.process(e.http)
	// The sandbox's envs are beneath every command, not part of its config.
	if err := e.agent.SetEnvd(ctx, agent.EnvdRequest{Env: map[string]string{"SANDBOX": "1"}}); err != nil {
		t.Fatal(err)
	}
	stdin := true
	start := func(envs map[string]string) uint32 {
		req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "cat"}, Envs: envs}, Stdin: &stdin})
		st := must(pc.Start(ctx, req))
		t.Cleanup(func() { st.Close() })
		if !st.Receive() {
			t.Fatalf("no start event: %v", st.Err())
		}
		pid := st.Msg().Event.GetStart().GetPid()
		killAtEnd(t, int(pid))
		return pid
	}
	with := start(map[string]string{"GREETING": "hi", "EMPTY": ""})
	without := start(nil)
	got := map[uint32]string{}
	for _, p := range must(pc.List(ctx, connect.NewRequest(&pb.ListRequest{}))).Msg.Processes {
		got[p.Pid] = fmt.Sprint(p.Config.Envs)
	}
	if got[with] != "map[EMPTY: GREETING:hi]" || got[without] != "map[]" {
		t.Errorf("List envs: %q for %d, %q for %d; want map[EMPTY: GREETING:hi] and map[]", got[with], with, got[without], without)
	}
}
