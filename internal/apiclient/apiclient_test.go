package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// inProcessClient is a client whose requests h serves in this process.
func inProcessClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	c, err := New("http://lizard.internal", "lz_key", &http.Client{Transport: InProcess(h)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "127.0.0.1:8080", "http://"} {
		if _, err := New(u, "k", nil); err == nil {
			t.Errorf("New(%q): no error", u)
		}
	}
	if _, err := New("http://x", "", nil); err == nil {
		t.Error("New without a key: no error")
	}
}

func TestInProcessRequestAsAServerSeesIt(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(map[string]string{
			"id": r.PathValue("id"), "key": r.Header.Get("X-API-Key"), "uri": r.RequestURI,
			"host": r.Host, "body": string(b), "ctype": r.Header.Get("Content-Type"),
		})
	})
	c := inProcessClient(t, mux)
	var got map[string]string
	if _, err := c.CallInto(context.Background(), "POST", SandboxPath("sb 1", "/exec?x=1"), map[string]string{"cmd": "ls"}, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"id": "sb 1", "key": "lz_key", "uri": "/api/sandboxes/sb%201/exec?x=1", "host": "lizard.internal",
		"body": `{"cmd":"ls"}`, "ctype": "application/json"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestInProcessErrorAnswer(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"error":"Not Found","code":"sandbox_not_found","message":"sandbox \"x\" not found"}`)
	})
	_, err := inProcessClient(t, h).Call(context.Background(), "GET", "/api/sandboxes/x", nil)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want an *Error", err)
	}
	if e.Status != 404 || e.Code != "sandbox_not_found" || e.Message != `sandbox "x" not found` {
		t.Fatalf("error = %+v", e)
	}
	if got := e.Error(); got != `sandbox "x" not found (404 sandbox_not_found)` {
		t.Fatalf("Error() = %q", got)
	}
}

// An answer streams: the client reads what the handler wrote before the
// handler writes more.
func TestInProcessStreams(t *testing.T) {
	next := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		http.NewResponseController(w).Flush()
		<-next
		fmt.Fprint(w, "data: {\"n\":2}\n\n")
	})
	var got []string
	err := inProcessClient(t, h).Events(context.Background(), "GET", "/stream", nil, func(data []byte) error {
		got = append(got, string(data))
		if len(got) == 1 {
			close(next) // only now may the second event come
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != `{"n":1} {"n":2}` {
		t.Fatalf("events %q", got)
	}
}

// The end of the request's context ends the handler's context and fails
// its writes, so a handler that streams forever stops.
func TestInProcessCancel(t *testing.T) {
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for {
			if _, err := fmt.Fprint(w, "data: {}\n\n"); err != nil {
				ended <- r.Context().Err()
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := inProcessClient(t, h).Events(ctx, "GET", "/stream", nil, func([]byte) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Events after cancel: %v", err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's context: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler is still writing")
	}
}

// A handler that panics cuts the answer short, as net/http does, and the
// process lives on.
func TestInProcessPanic(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "partial")
		panic(http.ErrAbortHandler)
	})
	resp, err := inProcessClient(t, h).Request(context.Background(), "GET", "/", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil || string(b) != "partial" {
		t.Fatalf("body %q, err %v: want the partial body and an error", b, err)
	}
}
