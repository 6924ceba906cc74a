package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lizard-build/lizard/internal/tracing/otlptest"
)

// startOTLPReceiver starts an OTLP/HTTP trace receiver on host (the
// cluster's bridge) for the test's length.
func startOTLPReceiver(t *testing.T, host string) (*otlptest.Receiver, string) {
	t.Helper()
	rcv, url, stop, err := otlptest.Start(net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return rcv, url
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return anyString(kv.Value)
		}
	}
	return ""
}

func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	}
	return v.String()
}

// TestClusterTrace: with --otlp-endpoint, a create sent to a node that
// does not place it (a, draining) is one trace at an OTLP receiver: a's
// server span, its forward span, and b's server span a child of that
// forward span, with b's lifecycle steps (admission, network, runtime
// create) under it carrying the sandbox's id. An exec through a is
// forwarded to b the same way (Router.Forward). No span carries the API
// key or a value of the create's envs.
func TestClusterTrace(t *testing.T) {
	c := newTestCluster(t)
	rcv, rcvURL := startOTLPReceiver(t, clusterNet+".1")
	c.startNodes(2, "--otlp-endpoint", rcvURL)
	a := c.node("a")
	c.nodesCLI("drain", "a")

	secret := "envsecret-" + hex.EncodeToString([]byte(rand.Text()))[:16]
	var sb struct {
		SandboxID string `json:"sandboxID"`
		Node      string `json:"node"`
	}
	if code, body := a.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000, "envs": map[string]string{"TRACE_SECRET": secret}}, &sb); code != http.StatusCreated || sb.Node != "b" {
		t.Fatalf("create through a: %d %s (want it placed on b)", code, body)
	}
	defer a.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	var out struct{ Stdout string }
	if code, body := a.do("POST", "/api/sandboxes/"+sb.SandboxID+"/exec", map[string]any{"cmd": "echo $TRACE_SECRET"}, &out); code != 200 || out.Stdout != secret+"\n" {
		t.Fatalf("exec through a: %d %s", code, body)
	}

	// findChain looks for a server span named route whose child is a
	// forward span named fwd, itself the parent of another server span
	// named route (the owner's), all in one trace.
	type chain struct{ front, forward, owner *tracepb.Span }
	findChain := func(spans []*tracepb.Span, route, fwd string) (chain, bool) {
		for _, f := range spans {
			if f.Name != fwd || f.Kind != tracepb.Span_SPAN_KIND_CLIENT {
				continue
			}
			var ch chain
			ch.forward = f
			for _, s := range spans {
				if s.Name != route || s.Kind != tracepb.Span_SPAN_KIND_SERVER || !bytes.Equal(s.TraceId, f.TraceId) {
					continue
				}
				switch {
				case bytes.Equal(s.SpanId, f.ParentSpanId):
					ch.front = s
				case bytes.Equal(s.ParentSpanId, f.SpanId):
					ch.owner = s
				}
			}
			if ch.front != nil && ch.owner != nil {
				return ch, true
			}
		}
		return chain{}, false
	}
	// under reports whether a span named name (with the sandbox's id,
	// when withID) is in the trace of s, below s.
	under := func(spans []*tracepb.Span, s *tracepb.Span, name string, withID bool) bool {
		parents := map[string]string{}
		for _, x := range spans {
			parents[string(x.SpanId)] = string(x.ParentSpanId)
		}
		for _, x := range spans {
			if x.Name != name || !bytes.Equal(x.TraceId, s.TraceId) || (withID && spanAttr(x, "lizard.sandbox.id") != sb.SandboxID) {
				continue
			}
			for p := string(x.ParentSpanId); p != ""; p = parents[p] {
				if p == string(s.SpanId) {
					return true
				}
			}
		}
		return false
	}

	var (
		spans        []*tracepb.Span
		raw          [][]byte
		create, exec chain
		okC, okE     bool
	)
	// The batcher exports every 5 s.
	deadline := time.Now().Add(budget(30 * time.Second))
	for {
		spans, raw = rcv.Snapshot()
		create, okC = findChain(spans, "POST /api/sandboxes", "forward create")
		exec, okE = findChain(spans, "POST /api/sandboxes/{id}/exec", "forward api")
		if okC && okE && under(spans, create.owner, "runtime create", true) && under(spans, exec.owner, "agent POST /exec", false) {
			break
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range spans {
				names = append(names, s.Name+"("+s.Kind.String()+")")
			}
			t.Fatalf("no complete traces after %v (create chain %v, exec chain %v); spans: %s", budget(30*time.Second), okC, okE, strings.Join(names, ", "))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, name := range []string{"admission", "network setup", "runtime create", "runsc run"} {
		if !under(spans, create.owner, name, true) {
			t.Errorf("the create's trace has no %q span with the sandbox's id under b's server span", name)
		}
	}
	if got := spanAttr(create.owner, "lizard.project.id"); got == "" {
		t.Error("b's server span of the create has no lizard.project.id")
	}
	if got := spanAttr(exec.owner, "lizard.sandbox.id"); got != sb.SandboxID {
		t.Errorf("b's server span of the exec: lizard.sandbox.id %q, want %q", got, sb.SandboxID)
	}
	if got := spanAttr(exec.front, "http.route"); got != "/api/sandboxes/{id}/exec" {
		t.Errorf("a's exec span: http.route %q", got)
	}
	if !bytes.Equal(create.front.TraceId, create.owner.TraceId) || create.front.TraceId == nil {
		t.Error("the create is not one trace")
	}

	// Nothing exported carries the API key or the env's value, in any
	// span, attribute, event or resource: the raw exports are searched.
	for _, b := range raw {
		for _, s := range []string{a.key, secret} {
			if bytes.Contains(b, []byte(s)) {
				t.Fatalf("an exported trace holds %q", s)
			}
		}
	}
}
