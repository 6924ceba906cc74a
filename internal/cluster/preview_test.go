package cluster

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/store"
)

// previews is b's sandbox service as its proxy sees it: sandbox sbx1's
// port 8080 is app, behind token tok (Lizard form) and public (E2B form).
type previews struct {
	app     string
	touched atomic.Int64
}

func (p *previews) PreviewToken(id string, port int) (string, error) {
	if id == "sbx1" && port == 8080 {
		return "tok", nil
	}
	return "", fmt.Errorf("%s:%d: %w", id, port, errdefs.ErrNotFound)
}

func (p *previews) PreviewAddr(ctx context.Context, id string, port int) (string, error) {
	p.touched.Add(1)
	return p.app, nil
}

func (p *previews) E2BTarget(id string, port int) (proxy.E2BTarget, error) {
	if id != "sbx1" || port != 8080 {
		return proxy.E2BTarget{}, fmt.Errorf("%s:%d: %w", id, port, errdefs.ErrNotFound)
	}
	p.touched.Add(1)
	return proxy.E2BTarget{Addr: p.app}, nil
}

// notHere is a's sandbox service: it has no sandbox.
type notHere struct{}

func (notHere) PreviewToken(id string, port int) (string, error) {
	return "", fmt.Errorf("%s: %w", id, errdefs.ErrNotFound)
}
func (notHere) PreviewAddr(ctx context.Context, id string, port int) (string, error) {
	return "", fmt.Errorf("%s: %w", id, errdefs.ErrNotFound)
}
func (notHere) E2BTarget(id string, port int) (proxy.E2BTarget, error) {
	return proxy.E2BTarget{}, fmt.Errorf("%s: %w", id, errdefs.ErrNotFound)
}

const domain = "sandbox.localhost"

// previewNodes: a's preview proxy, with the router, in front of b's,
// which serves sbx1's app (echoing the host, path and whether it is a
// WebSocket).
func previewNodes(t *testing.T) (a *httptest.Server, b *previews) {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			echoWebSocket(w, r, "app: ")
			return
		}
		fmt.Fprintf(w, "app %s %s token=%q", r.Host, r.URL.Path, r.Header.Get(proxy.TokenHeader))
	}))
	t.Cleanup(app.Close)
	b = &previews{app: strings.TrimPrefix(app.URL, "http://")}
	bProxy := proxy.Handler(proxy.Config{Domain: domain, Previews: b, E2B: b, Logger: quiet()})
	bSrv := peer(t, "b", nil, bProxy, nil)
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: "b", ProjectID: "p1"}},
		nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(bSrv))}}
	rt := newTestRouter(t, "a", fc, nil, nil)
	a = httptest.NewServer(proxy.Handler(proxy.Config{Domain: domain, Previews: notHere{}, E2B: notHere{}, Cluster: rt, Logger: quiet()}))
	t.Cleanup(a.Close)
	return a, b
}

func previewGet(t *testing.T, url, host string, header http.Header) (int, string) {
	t.Helper()
	resp, body := send(t, http.MethodGet, url, host, header, nil)
	return resp.StatusCode, body
}

func TestPreviewForwarded(t *testing.T) {
	a, b := previewNodes(t)
	port := a.URL[strings.LastIndexByte(a.URL, ':'):]

	// Lizard's host order: b checks the token; the app sees the host.
	host := "sbx1-8080." + domain + port
	if status, body := previewGet(t, a.URL+"/x", host, http.Header{proxy.TokenHeader: {"tok"}}); status != 200 || body != `app `+host+` /x token=""` {
		t.Fatalf("lizard host: %d %q", status, body)
	}
	// Without the token: b's refusal, and nothing resumed.
	touched := b.touched.Load()
	if status, _ := previewGet(t, a.URL+"/x", host, nil); status != http.StatusUnauthorized || b.touched.Load() != touched {
		t.Fatalf("no token: %d, touched %d", status, b.touched.Load()-touched)
	}
	// E2B's host order and its routing headers.
	e2bHost := "8080-sbx1." + domain + port
	if status, body := previewGet(t, a.URL+"/y", e2bHost, nil); status != 200 || body != `app `+e2bHost+` /y token=""` {
		t.Fatalf("e2b host: %d %q", status, body)
	}
	if status, body := previewGet(t, a.URL+"/z", strings.TrimPrefix(a.URL, "http://"),
		http.Header{proxy.E2BSandboxIDHeader: {"sbx1"}, proxy.E2BSandboxPortHeader: {"8080"}}); status != 200 || !strings.HasSuffix(body, ` /z token=""`) {
		t.Fatalf("e2b headers: %d %q", status, body)
	}
	// A sandbox nobody has: a's own refusal.
	if status, _ := previewGet(t, a.URL+"/x", "nope-8080."+domain+port, http.Header{proxy.TokenHeader: {"tok"}}); status != http.StatusUnauthorized {
		t.Fatalf("unknown: %d", status)
	}
}

func TestPreviewWebSocketForwarded(t *testing.T) {
	a, _ := previewNodes(t)
	port := a.URL[strings.LastIndexByte(a.URL, ':'):]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		host   string
		header http.Header
	}{
		{"sbx1-8080." + domain + port, http.Header{proxy.TokenHeader: {"tok"}}},
		{"8080-sbx1." + domain + port, nil},
	} {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.URL, "http")+"/ws", &websocket.DialOptions{Host: tc.host, HTTPHeader: tc.header})
		if err != nil {
			t.Fatalf("%s: %v", tc.host, err)
		}
		if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		_, msg, err := c.Read(ctx)
		if err != nil || string(msg) != "app: hi" {
			t.Fatalf("%s: %q %v", tc.host, msg, err)
		}
		c.Close(websocket.StatusNormalClosure, "")
	}
}
