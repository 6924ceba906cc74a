package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestEgressProxy drives the egress proxy through the Lizard API (network
// on create, GET/PUT …/network, the egress log, the sandbox's trust store)
// and through the unmodified e2b SDKs 2.50 and 2.51
// (js/egress/*.test.mjs): names decided on the wire, transforms, splices,
// denyOut with allowOut, updateNetwork, egressProxy and httpsPorts, against
// a fake internet of the test's own (egressNet).
func TestEgressProxy(t *testing.T) {
	n := startEgressNet(t)
	// A secrets key and an issuer at the API's address: transforms name
	// secrets and workload tokens.
	addr := freeAddr(t)
	s := startServer(t, "", "--dns-upstream", n.dnsAddr, "--egress-ca-file", n.caFile,
		"--listen", addr, "--secrets-key-file", secretsKeyFile(t), "--oidc-issuer", "http://"+addr)
	t.Run("lizard API", func(t *testing.T) { egressLizardAPI(t, s, n) })
	files := jsFiles("js/egress/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no egress SDK test files")
	}
	s.runE2BSDKs(t, n.env(), files...)
	t.Run("metrics", func(t *testing.T) {
		res, err := http.Get(s.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		for _, want := range []string{`lizard_egress_connections_total{decision="spliced"}`, `lizard_egress_connections_total{decision="denied"}`,
			`lizard_egress_connections_total{decision="intercepted"}`, `lizard_egress_requests_total{outcome="forwarded"}`, `lizard_egress_bytes_total{direction="in"}`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("no %s in /metrics", want)
			}
		}
	})
	s.waitNoLeaks(t)
}

// networkView is a sandbox's network as the Lizard API shows it.
type networkView struct {
	AllowOut    []string                     `json:"allowOut"`
	DenyOut     []string                     `json:"denyOut"`
	Rules       map[string][]json.RawMessage `json:"rules"`
	EgressProxy *struct {
		Address  string `json:"address"`
		Username string `json:"username"`
		Password string `json:"password"`
	} `json:"egressProxy"`
	HTTPSPorts []int `json:"httpsPorts"`
}

// shell runs a shell command in a sandbox through the Lizard API and
// returns its whole result.
func (s *server) shell(t *testing.T, id, cmd string) execReply {
	t.Helper()
	var out execReply
	if code, raw := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": cmd, "timeout": 60}, &out); code != 200 {
		t.Fatalf("exec %q in %s: %d %s", cmd, id, code, raw)
	}
	return out
}

func egressLizardAPI(t *testing.T, s *server, n *egressNet) {
	deny := []string{"0.0.0.0/0"}
	body := map[string]any{"template": "base", "network": map[string]any{
		"allowOut": []string{"allowed.test"}, "denyOut": deny,
		"rules": map[string]any{"rules.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"X-Lizard-Rule": "v1"}}}}},
	}}
	var info struct {
		SandboxID      string      `json:"sandboxId"`
		InternetAccess bool        `json:"internetAccess"`
		AllowedHosts   []string    `json:"allowedHosts"`
		Network        networkView `json:"network"`
	}
	if code, raw := s.do("POST", "/api/sandboxes", body, &info); code != 201 {
		t.Fatalf("create: %d %s", code, raw)
	}
	id := info.SandboxID
	defer s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	if info.InternetAccess || strings.Join(info.AllowedHosts, ",") != "allowed.test" || strings.Join(info.Network.DenyOut, ",") != "0.0.0.0/0" || len(info.Network.Rules["rules.test"]) != 1 {
		t.Fatalf("created: %+v", info)
	}
	if code, raw := s.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/testca.pem", "content": string(n.caPEM)}, nil); code >= 300 {
		t.Fatalf("write the test CA: %d %s", code, raw)
	}
	// The upstream's own certificate: the connection is spliced.
	if r := s.shell(t, id, "curl -sS -m 10 --cacert /tmp/testca.pem https://allowed.test/"); r.ExitCode != 0 || !strings.Contains(r.Stdout, `"host":"allowed.test"`) {
		t.Fatalf("allowed.test: %+v", r)
	}
	// Rules grant nothing: rules.test is not allowed yet.
	if r := s.shell(t, id, "curl -sS -m 10 --resolve rules.test:443:"+n.web.String()+" https://rules.test/"); r.ExitCode == 0 {
		t.Fatalf("rules.test without allowOut: %+v", r)
	}
	// Bad input: 400s naming the field.
	for _, tt := range []struct {
		body any
		want string
	}{
		{map[string]any{"denyOut": []string{"example.com"}}, `network.denyOut[0] "example.com"`},
		{map[string]any{"allowOut": []string{"*"}}, "network.allowOut[0]"},
		{map[string]any{"rules": map[string]any{"a.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Bad Name": "x"}}}}}}, "not an HTTP token"},
		{map[string]any{"rules": manyRuleHosts(65)}, "network.rules: 65 hosts, at most 64"},
		{map[string]any{"rules": map[string]any{"a.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"X": "${e2b.secrets.nope}"}}}}}}, "network.rules"},
	} {
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		code, raw := s.do("PUT", "/api/sandboxes/"+id+"/network", tt.body, nil)
		json.Unmarshal(raw, &e)
		if code != 400 || !strings.Contains(e.Message, tt.want) {
			t.Errorf("PUT %v: %d %s, want 400 with %q", tt.body, code, raw, tt.want)
		}
	}
	// Now rules.test too, transformed: the sandbox trusts the node's CA
	// in curl (the system bundle) and in Python (SSL_CERT_FILE).
	var updated networkView
	if code, raw := s.do("PUT", "/api/sandboxes/"+id+"/network", map[string]any{"allowOut": []string{"allowed.test", "rules.test"}, "denyOut": deny,
		"rules": body["network"].(map[string]any)["rules"]}, &updated); code != 200 || len(updated.AllowOut) != 2 {
		t.Fatalf("PUT network: %d %s", code, raw)
	}
	r := s.shell(t, id, "curl -sS -m 10 https://rules.test/probe/lizard-api")
	var echo echoReply
	if r.ExitCode != 0 || json.Unmarshal([]byte(r.Stdout), &echo) != nil || echo.Headers["X-Lizard-Rule"] != "v1" || echo.Proto != "HTTP/2.0" {
		t.Fatalf("rules.test through curl: %+v (%+v)", r, echo)
	}
	r = s.shell(t, id, `python3 -c "import json, urllib.request; print(json.load(urllib.request.urlopen('https://rules.test/'))['headers']['X-Lizard-Rule'])"`)
	if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "v1" {
		t.Fatalf("rules.test through Python: %+v", r)
	}
	if r := s.shell(t, id, `echo "$NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE $PIP_CERT $CURL_CA_BUNDLE $SSL_CERT_FILE"`); strings.TrimSpace(r.Stdout) !=
		"/.lizard/egress-ca.pem /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt" {
		t.Fatalf("the trust variables: %q", r.Stdout)
	}
	// A denied name on the allowed address, by SNI and by Host.
	if r := s.shell(t, id, "curl -sS -m 10 --cacert /tmp/testca.pem --resolve denied.test:443:"+n.web.String()+" https://denied.test/"); r.ExitCode == 0 {
		t.Fatalf("denied.test by SNI: %+v", r)
	}
	if r := s.shell(t, id, "curl -sS -m 10 -o /dev/null -w '%{http_code}' --resolve denied.test:80:"+n.web.String()+" http://denied.test/"); strings.TrimSpace(r.Stdout) != "403" {
		t.Fatalf("denied.test by Host: %+v", r)
	}
	var got networkView
	if code, _ := s.do("GET", "/api/sandboxes/"+id+"/network", nil, &got); code != 200 || len(got.AllowOut) != 2 || len(got.Rules) != 1 {
		t.Fatalf("GET network: %d %+v", code, got)
	}
	var log struct {
		Entries []struct {
			Host     string `json:"host"`
			Decision string `json:"decision"`
			Via      string `json:"via"`
			Rule     string `json:"rule"`
			BytesIn  int64  `json:"bytesIn"`
		} `json:"entries"`
	}
	if code, raw := s.do("GET", "/api/sandboxes/"+id+"/network/log", nil, &log); code != 200 {
		t.Fatalf("log: %d %s", code, raw)
	}
	var sawRule, sawDenied, sawSplice bool
	for _, e := range log.Entries {
		sawRule = sawRule || e.Host == "rules.test" && e.Rule == "rules.test" && e.Decision == "allowed" && e.Via == "intercepted" && e.BytesIn > 0
		sawDenied = sawDenied || e.Host == "denied.test" && e.Decision == "denied"
		sawSplice = sawSplice || e.Host == "allowed.test" && e.Via == "spliced" && e.BytesIn > 0
	}
	if !sawRule || !sawDenied || !sawSplice {
		t.Fatalf("log %+v", log.Entries)
	}
	// The dashboard shows the same (its Network tab, in a browser).
	ctx, cancel := context.WithTimeout(context.Background(), budget(3*time.Minute))
	defer cancel()
	if err := s.runNodeEnv(ctx, []string{"LIZARD_EGRESS_SANDBOX=" + id}, "js/egress/dashboard.e2e.mjs"); err != nil {
		t.Fatalf("the dashboard's Network tab: %v", err)
	}
	// The configuration outlives a restart of the server (the record, the
	// runtime's state, the firewall and the proxy rebuilt from them).
	s.stop()
	s.start()
	for deadline := time.Now().Add(budget(60 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		var st struct {
			Status string `json:"status"`
		}
		if code, _ := s.do("GET", "/api/sandboxes/"+id, nil, &st); code == 200 && st.Status == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox was not reattached after the restart")
		}
	}
	r = s.shell(t, id, "curl -sS -m 10 https://rules.test/")
	if r.ExitCode != 0 || json.Unmarshal([]byte(r.Stdout), &echo) != nil || echo.Headers["X-Lizard-Rule"] != "v1" {
		t.Fatalf("rules.test after a restart: %+v", r)
	}
	// Node reads NODE_EXTRA_CA_CERTS (the node template).
	var nodeBox struct {
		SandboxID string `json:"sandboxId"`
	}
	if code, raw := s.do("POST", "/api/sandboxes", map[string]any{"template": "node", "network": map[string]any{
		"rules": body["network"].(map[string]any)["rules"]}}, &nodeBox); code != 201 {
		t.Fatalf("create node: %d %s", code, raw)
	}
	defer s.do("DELETE", "/api/sandboxes/"+nodeBox.SandboxID, nil, nil)
	r = s.shell(t, nodeBox.SandboxID, `node -e "fetch('https://rules.test/').then(r => r.json()).then(j => console.log(j.headers['X-Lizard-Rule']))"`)
	if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "v1" {
		t.Fatalf("rules.test through Node: %+v", r)
	}
}

func manyRuleHosts(k int) map[string]any {
	out := map[string]any{}
	for i := range k {
		out[fmt.Sprintf("h%d.test", i)] = []any{}
	}
	return out
}
