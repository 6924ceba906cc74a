package cluster

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef-test")

func newTestSigner(t *testing.T, node string, secret []byte) *Signer {
	t.Helper()
	s, err := NewSigner(node, secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSignerRefusesShortSecret(t *testing.T) {
	if _, err := NewSigner("a", make([]byte, MinSecretBytes-1)); err == nil {
		t.Fatal("a secret of 31 bytes was accepted")
	}
	if _, err := NewSigner("", testSecret); err == nil {
		t.Fatal("an empty node name was accepted")
	}
}

// countingHandler counts the requests that reach it.
type countingHandler struct{ n atomic.Int64 }

func (h *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.n.Add(1)
	w.Write([]byte("reached"))
}

// TestInternalRefusesUnsigned: every path, for every way a signature can
// be wrong, answers the same 401 and reaches neither the API, the proxy
// nor the lists.
func TestInternalRefusesUnsigned(t *testing.T) {
	apiH, proxyH := &countingHandler{}, &countingHandler{}
	local := &fakeLocal{}
	recv := newTestSigner(t, "b", testSecret)
	srv := httptest.NewServer(InternalHandler(InternalConfig{Signer: recv, API: apiH, Proxy: proxyH, Local: local}))
	defer srv.Close()

	good := newTestSigner(t, "a", testSecret)
	other := newTestSigner(t, "a", []byte("another secret of at least 32 bytes!!"))
	stale := newTestSigner(t, "a", testSecret)
	stale.now = func() time.Time { return time.Now().Add(-MaxSkew - 5*time.Second) }
	future := newTestSigner(t, "a", testSecret)
	future.now = func() time.Time { return time.Now().Add(MaxSkew + 5*time.Second) }

	paths := []string{"/api/sandboxes/sbx1/exec", "/api/sandboxes", "/internal/v1/sandboxes?project=p", "/internal/v1/volumes?project=p",
		"/", "/sandboxes/x/connect", "/healthz", "/internal/v1/nothing"}
	kinds := []string{kindAPI, kindProxy, kindInternal}
	cases := map[string]func(r *http.Request, kind string){
		"missing": func(*http.Request, string) {},
		"other secret": func(r *http.Request, kind string) {
			other.sign(r, kind)
		},
		"stale":  func(r *http.Request, kind string) { stale.sign(r, kind) },
		"future": func(r *http.Request, kind string) { future.sign(r, kind) },
		"bad hex": func(r *http.Request, kind string) {
			good.sign(r, kind)
			r.Header.Set(headerSig, "zz"+r.Header.Get(headerSig)[2:])
		},
		"bad time": func(r *http.Request, kind string) {
			good.sign(r, kind)
			r.Header.Set(headerTime, "yesterday")
		},
		"other node named": func(r *http.Request, kind string) {
			good.sign(r, kind)
			r.Header.Set(headerNode, "c")
		},
		"other kind": func(r *http.Request, kind string) {
			good.sign(r, kind)
			if kind == kindAPI {
				r.Header.Set(headerKind, kindProxy)
			} else {
				r.Header.Set(headerKind, kindAPI)
			}
		},
		"other path": func(r *http.Request, kind string) {
			u := *r.URL
			u.Path = "/signed/elsewhere"
			good.sign(&http.Request{Method: r.Method, URL: &u, Host: r.Host, Header: r.Header}, kind)
		},
		"other query": func(r *http.Request, kind string) {
			u := *r.URL
			u.RawQuery = "project=someone-else"
			good.sign(&http.Request{Method: r.Method, URL: &u, Host: r.Host, Header: r.Header}, kind)
		},
		"other host": func(r *http.Request, kind string) {
			good.sign(&http.Request{Method: r.Method, URL: r.URL, Host: "x-8080.sandbox.localhost", Header: r.Header}, kind)
		},
		"other method": func(r *http.Request, kind string) {
			good.sign(&http.Request{Method: http.MethodDelete, URL: r.URL, Host: r.Host, Header: r.Header}, kind)
		},
	}
	var want []byte
	for name, spoil := range cases {
		for _, path := range paths {
			for _, kind := range kinds {
				req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				spoil(req, kind)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s, %s %s: status %d, want 401", name, kind, path, resp.StatusCode)
				}
				if want == nil {
					want = body
				} else if !bytes.Equal(body, want) {
					t.Errorf("%s, %s %s: body %q differs from %q", name, kind, path, body, want)
				}
			}
		}
	}
	if n := apiH.n.Load() + proxyH.n.Load() + local.calls.Load(); n != 0 {
		t.Fatalf("%d refused requests reached a handler", n)
	}

	// The same requests signed right do reach them.
	for _, tc := range []struct {
		kind, path string
		reached    func() int64
	}{
		{kindAPI, "/api/sandboxes/sbx1/exec", apiH.n.Load},
		{kindProxy, "/", proxyH.n.Load},
		{kindInternal, "/internal/v1/sandboxes?project=p", local.calls.Load},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		good.sign(req, tc.kind)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || tc.reached() != 1 {
			t.Errorf("signed %s %s: status %d, reached %d times", tc.kind, tc.path, resp.StatusCode, tc.reached())
		}
	}
}

// TestInternalMarksForwarded: what the internal listener serves is marked
// forwarded (never forwarded again) with the sender's name, and the
// signature headers do not reach the handler.
func TestInternalMarksForwarded(t *testing.T) {
	var got []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, strconv.FormatBool(Forwarded(r.Context())), r.Header.Get(headerSig), r.Header.Get("X-Api-Key"))
	})
	srv := httptest.NewServer(InternalHandler(InternalConfig{Signer: newTestSigner(t, "b", testSecret), API: h}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/sandboxes/x/exec", strings.NewReader("{}"))
	req.Header.Set("X-API-Key", "the client's key")
	newTestSigner(t, "a", testSecret).sign(req, kindAPI)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if strings.Join(got, "|") != "true||the client's key" {
		t.Fatalf("handler saw forwarded|signature|key = %q", strings.Join(got, "|"))
	}
}
