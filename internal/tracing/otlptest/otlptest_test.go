package otlptest

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestReceiver: plain and gzip exports are decoded and kept; anything
// that is not an export is refused and keeps nothing.
func TestReceiver(t *testing.T) {
	r, url, stop, err := Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	export := func(name string) []byte {
		b, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
			ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{Name: name}}}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	post := func(path, ctype, enc string, body []byte) int {
		req, _ := http.NewRequest("POST", url+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if code := post("/v1/traces", "application/x-protobuf", "", export("plain")); code != 200 {
		t.Fatalf("plain export: %d", code)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(export("zipped"))
	zw.Close()
	if code := post("/v1/traces", "application/x-protobuf", "gzip", zb.Bytes()); code != 200 {
		t.Fatalf("gzip export: %d", code)
	}
	for _, bad := range []struct{ path, ctype string }{{"/v1/metrics", "application/x-protobuf"}, {"/v1/traces", "application/json"}} {
		if code := post(bad.path, bad.ctype, "", export("bad")); code != 400 {
			t.Fatalf("%s %s: %d, want 400", bad.path, bad.ctype, code)
		}
	}
	if code := post("/v1/traces", "application/x-protobuf", "", []byte{0xff, 0xff}); code != 400 {
		t.Fatalf("garbage: %d, want 400", code)
	}
	spans, raw := r.Snapshot()
	if len(spans) != 2 || spans[0].Name != "plain" || spans[1].Name != "zipped" || len(raw) != 2 {
		t.Fatalf("kept %d spans (%v) and %d bodies", len(spans), spans, len(raw))
	}
}
