package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/agent/server"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestMain also serves as the server's __fileop child (see server.FileOpCommand).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == server.FileOpCommand {
		os.Exit(server.FileOpMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// fake serves handler and returns a client for it.
func fake(t *testing.T, handler http.HandlerFunc) *agent.Client {
	t.Helper()
	ts := httptest.NewServer(handler)
	t.Cleanup(ts.Close)
	return agent.NewClient(ts.URL+"/", "tok", ts.Client())
}

func TestClientErrorClasses(t *testing.T) {
	tests := []struct {
		status int
		body   string
		want   error
		msg    string
	}{
		{400, `{"code":"invalid","message":"path \"x\" is not absolute"}`, errdefs.ErrInvalid, `path "x" is not absolute`},
		{404, `{"code":"not_found","message":"gone"}`, errdefs.ErrNotFound, "gone"},
		{403, `{"code":"permission","message":"open /root/x: permission denied"}`, errdefs.ErrPermission, "permission denied"},
		{409, `{"code":"conflict","message":"busy"}`, errdefs.ErrConflict, "busy"},
		{413, `{"code":"too_large","message":"big"}`, errdefs.ErrTooLarge, "big"},
		{401, `{"code":"unauthenticated","message":"who"}`, errdefs.ErrUnauthenticated, "who"},
		{500, `{"code":"internal","message":"boom"}`, errdefs.ErrUnavailable, "boom"},
		{418, `{"code":"teapot","message":"odd"}`, errdefs.ErrUnavailable, "odd"},
		{404, `not json`, errdefs.ErrNotFound, "not json"},
		{502, ``, errdefs.ErrUnavailable, "502"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d %s", tt.status, tt.want), func(t *testing.T) {
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			calls := map[string]error{
				"Health":  func() error { _, err := c.Health(testCtx(t)); return err }(),
				"Stat":    func() error { _, err := c.Stat(testCtx(t), "/x", ""); return err }(),
				"Remove":  c.Remove(testCtx(t), "/x", ""),
				"Watch":   func() error { _, err := c.Watch(testCtx(t), "/x", true, ""); return err }(),
				"Events":  func() error { _, err := c.WatchEvents(testCtx(t), "w1"); return err }(),
				"Unwatch": c.Unwatch(testCtx(t), "w1"),
				"Exec":    c.Exec(testCtx(t), agent.ExecRequest{Cmd: []string{"true"}}, func(agent.Event) error { return nil }),
			}
			for name, err := range calls {
				if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("%s: error %v, want %v with %q", name, err, tt.want, tt.msg)
				}
			}
		})
	}
}

func TestClientConnectionErrorIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := agent.NewClient("http://"+addr, "tok", nil)
	_, err = c.Health(testCtx(t))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("error %v, want ErrUnavailable", err)
	}
}

func TestClientSendsTokenAndQuery(t *testing.T) {
	var got *http.Request
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		io.WriteString(w, `[]`)
	})
	es, err := c.List(testCtx(t), "/a b/c&d", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if es == nil || len(es) != 0 {
		t.Errorf("List = %#v, want an empty non-nil list", es)
	}
	if got.Header.Get(agent.TokenHeader) != "tok" || got.URL.Path != "/files/list" ||
		got.URL.Query().Get("path") != "/a b/c&d" || got.URL.Query().Get("user") != "alice" {
		t.Errorf("request %s %v header %v", got.Method, got.URL, got.Header)
	}
}

func TestClientWatchRequests(t *testing.T) {
	var reqs []string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		reqs = append(reqs, r.Method+" "+r.URL.String()+" "+strings.TrimSpace(string(body)))
		switch r.Method {
		case http.MethodPost:
			io.WriteString(w, `{"watcherId":"w 1"}`)
		case http.MethodGet:
			io.WriteString(w, `null`)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	id, err := c.Watch(testCtx(t), "/app", true, "alice")
	if err != nil || id != "w 1" {
		t.Fatalf("Watch = %q, %v", id, err)
	}
	evs, err := c.WatchEvents(testCtx(t), id)
	if err != nil || evs == nil || len(evs) != 0 {
		t.Fatalf("WatchEvents = %#v, %v; want an empty non-nil list", evs, err)
	}
	if err := c.Unwatch(testCtx(t), id); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`POST /watch {"path":"/app","recursive":true,"user":"alice"}`,
		`GET /watch/events?watcherId=w+1 `,
		`DELETE /watch?watcherId=w+1 `,
	}
	if strings.Join(reqs, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(reqs, "\n"), strings.Join(want, "\n"))
	}
}

func TestClientExecStream(t *testing.T) {
	stream := `{"pid":7}` + "\n" + `{"stream":"stdout","line":"a"}` + "\n" +
		`{"stream":"stderr","line":"b"}` + "\n" + `{"exitCode":2}` + "\n"
	t.Run("all events in order", func(t *testing.T) {
		c := fake(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, stream) })
		var seen []string
		err := c.Exec(testCtx(t), agent.ExecRequest{Cmd: []string{"x"}}, func(ev agent.Event) error {
			switch {
			case ev.Pid != nil:
				seen = append(seen, fmt.Sprint("pid ", *ev.Pid))
			case ev.Line != nil:
				seen = append(seen, ev.Stream+" "+*ev.Line)
			case ev.ExitCode != nil:
				seen = append(seen, fmt.Sprint("exit ", *ev.ExitCode))
			}
			return nil
		})
		if err != nil || strings.Join(seen, ",") != "pid 7,stdout a,stderr b,exit 2" {
			t.Fatalf("events %q, err %v", seen, err)
		}
	})
	t.Run("callback error stops", func(t *testing.T) {
		c := fake(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, stream) })
		stop := errors.New("stop")
		n := 0
		err := c.Exec(testCtx(t), agent.ExecRequest{Cmd: []string{"x"}}, func(agent.Event) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("err %v after %d events, want the callback's error after 1", err, n)
		}
	})
	t.Run("stream without exit code", func(t *testing.T) {
		c := fake(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"pid":7}`+"\n") })
		err := c.Exec(testCtx(t), agent.ExecRequest{Cmd: []string{"x"}}, func(agent.Event) error { return nil })
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("err %v, want ErrUnavailable", err)
		}
	})
}

// realServer is the real agent server with token "secret"; it needs root.
func realServer(t *testing.T) *server.Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the agent server needs root (it runs commands and file operations as other users)")
	}
	srv, err := server.New(server.Config{Token: "secret", Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestClientAgainstServer drives the real server end to end.
func TestClientAgainstServer(t *testing.T) {
	srv := realServer(t)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	c := agent.NewClient(ts.URL, "secret", ts.Client())

	if h, err := c.Health(testCtx(t)); err != nil || !h.OK {
		t.Fatalf("Health = %+v, %v", h, err)
	}
	var out []string
	code := -1
	err := c.Exec(testCtx(t), agent.ExecRequest{Cmd: []string{"echo hi; exit 4"}, Shell: true}, func(ev agent.Event) error {
		if ev.Line != nil {
			out = append(out, *ev.Line)
		}
		if ev.ExitCode != nil {
			code = *ev.ExitCode
		}
		return nil
	})
	if err != nil || code != 4 || strings.Join(out, "|") != "hi" {
		t.Fatalf("Exec: out %q code %d err %v", out, code, err)
	}

	dir := t.TempDir()
	p := filepath.Join(dir, "f.bin")
	data := "\x00\x01binary\xff\n"
	if err := c.WriteFile(testCtx(t), p, "", strings.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ReadFile(testCtx(t), p, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != data {
		t.Fatalf("read back %q (%v), want %q", b, err, data)
	}
	if err := c.WriteFile(testCtx(t), "/root/lizard-client-test", "nobody", strings.NewReader("x")); !errors.Is(err, errdefs.ErrPermission) {
		t.Fatalf("nobody writing to /root: %v, want ErrPermission", err)
	}
	if _, err := c.Stat(testCtx(t), filepath.Join(dir, "missing"), ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat missing: %v, want ErrNotFound", err)
	}
	if ps, err := c.Processes(testCtx(t)); err != nil || ps == nil {
		t.Fatalf("Processes = %#v, %v", ps, err)
	}
	if err := c.Signal(testCtx(t), 999_999, "SIGTERM"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Signal unknown pid: %v, want ErrNotFound", err)
	}
}

// TestClientOlderAgent: an agent from before versions were reported (the
// one inside a sandbox paused by an older server) answers health without a
// version; the client takes it for version 1 and exec and files work.
func TestClientOlderAgent(t *testing.T) {
	srv := realServer(t)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			// A version 1 agent's answer.
			fmt.Fprintf(w, `{"ok":true,"pid":%d}`, os.Getpid())
			return
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	c := agent.NewClient(ts.URL, "secret", ts.Client())
	if c.Version() != 0 {
		t.Fatalf("Version before health = %d, want 0", c.Version())
	}
	if h, err := c.Health(testCtx(t)); err != nil || !h.OK || h.Version != 1 || c.Version() != 1 {
		t.Fatalf("Health = %+v, %v; Version %d, want 1", h, err, c.Version())
	}
	var out []string
	err := c.Exec(testCtx(t), agent.ExecRequest{Cmd: []string{"echo old"}, Shell: true}, func(ev agent.Event) error {
		if ev.Line != nil {
			out = append(out, *ev.Line)
		}
		return nil
	})
	if err != nil || strings.Join(out, "|") != "old" {
		t.Fatalf("Exec on an old agent: %q, %v", out, err)
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := c.WriteFile(testCtx(t), p, "", strings.NewReader("v1")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "v1" {
		t.Fatalf("file written through an old agent: %q, %v", b, err)
	}

	// The current agent reports the current version.
	ts2 := httptest.NewServer(srv)
	t.Cleanup(ts2.Close)
	current := agent.NewClient(ts2.URL, "secret", ts2.Client())
	if h, err := current.Health(testCtx(t)); err != nil || h.Version != agent.ProtocolVersion || current.Version() != agent.ProtocolVersion {
		t.Fatalf("Health of the current agent = %+v, %v, want version %d", h, err, agent.ProtocolVersion)
	}
}
