// Package helm_test renders the lizard chart (deploy/helm/lizard) with
// Helm's own library for several value sets and decodes every object
// strictly into the Kubernetes API types: an unknown or misplaced field, a
// duplicate key or a wrong type fails the test. It is a package of its own
// so that nothing the server links imports Helm.
package helm_test

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/scheme"
)

const (
	release   = "lizard"
	namespace = "sandboxes"
)

// minimal is the least a user must give: the database and the object store.
func minimal() map[string]any {
	return map[string]any{
		"database":    map[string]any{"url": "postgres://lizard:pw@db.example.internal:5432/lizard"},
		"objectStore": map[string]any{"url": "s3://lizard?endpoint=s3.example.internal:9000&region=us-east-1", "accessKeyId": "AKID", "secretAccessKey": "SECRET"},
	}
}

// with returns base with the dotted keys set (maps are created on the way).
func with(base map[string]any, kv ...any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		path := strings.Split(kv[i].(string), ".")
		m := base
		for _, k := range path[:len(path)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[path[len(path)-1]] = kv[i+1]
	}
	return base
}

// rendered is one render of the chart: its objects by kind and name, and
// NOTES.txt.
type rendered struct {
	objects map[string]runtime.Object // "Kind/name"
	notes   string
}

func (r rendered) daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	return get[*appsv1.DaemonSet](t, r, "DaemonSet/lizard")
}

func (r rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := r.daemonSet(t).Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "lizard" {
		t.Fatalf("containers: want one named lizard, got %d", len(cs))
	}
	return cs[0]
}

func get[T runtime.Object](t *testing.T, r rendered, key string) T {
	t.Helper()
	o, ok := r.objects[key]
	if !ok {
		t.Fatalf("no %s among %v", key, r.keys())
	}
	v, ok := o.(T)
	if !ok {
		t.Fatalf("%s is a %T", key, o)
	}
	return v
}

func (r rendered) keys() []string {
	var ks []string
	for k := range r.objects {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load("lizard")
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the chart as `helm install` (or upgrade, with existing
// objects the lookup function finds) would, and decodes every object.
func render(t *testing.T, vals map[string]any, existing ...runtime.Object) (rendered, error) {
	t.Helper()
	c := loadChart(t)
	opts := chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: len(existing) == 0, IsUpgrade: len(existing) > 0}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}
	values, err := chartutil.ToRenderValues(c, vals, opts, caps)
	if err != nil {
		return rendered{}, err
	}
	files, err := engine.RenderWithClientProvider(c, values, clients{dynfake.NewSimpleDynamicClient(scheme.Scheme, existing...)})
	if err != nil {
		return rendered{}, err
	}
	r := rendered{objects: map[string]runtime.Object{}}
	for name, text := range files {
		switch {
		case strings.HasSuffix(name, "/NOTES.txt"):
			r.notes = text
			continue
		case !strings.HasSuffix(name, ".yaml"):
			t.Fatalf("%s: a template that is neither YAML nor NOTES.txt", name)
		}
		for i, doc := range documents(text) {
			obj := decodeStrict(t, fmt.Sprintf("%s (document %d)", name, i), doc)
			m, err := meta.Accessor(obj)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			key := obj.GetObjectKind().GroupVersionKind().Kind + "/" + m.GetName()
			if _, dup := r.objects[key]; dup {
				t.Fatalf("%s rendered twice", key)
			}
			if m.GetNamespace() != "" {
				t.Errorf("%s sets its namespace; helm install -n decides it", key)
			}
			if m.GetLabels()["app.kubernetes.io/instance"] != release {
				t.Errorf("%s: no app.kubernetes.io/instance label", key)
			}
			r.objects[key] = obj
		}
	}
	checkReferences(t, r)
	return r, nil
}

// documents splits a rendered file into its YAML documents, without those
// holding only comments or whitespace.
func documents(text string) []string {
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(text, -1) {
		sc := bufio.NewScanner(strings.NewReader(d))
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, d)
				break
			}
		}
	}
	return docs
}

// decodeStrict decodes one object into its Kubernetes API type, refusing
// unknown and duplicate fields.
func decodeStrict(t *testing.T, what, doc string) runtime.Object {
	t.Helper()
	s := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	obj, _, err := s.Decode([]byte(doc), nil, nil)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, doc)
	}
	return obj
}

// clients gives Helm's lookup a fake API server holding the objects of an
// earlier release.
type clients struct{ dynamic.Interface }

func (c clients) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, false, err
	}
	if gv != corev1.SchemeGroupVersion || kind != "Secret" {
		return nil, false, fmt.Errorf("the chart looks up %s %s: the test serves Secrets only", apiVersion, kind)
	}
	return c.Resource(gv.WithResource("secrets")), true, nil
}

// checkReferences holds for every render: what the pods, Services and
// Ingress name exists in the same render (or is a Secret the user gave).
func checkReferences(t *testing.T, r rendered) {
	t.Helper()
	ds := r.daemonSet(t)
	pod := ds.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("the DaemonSet's selector %v does not match its pods' labels %v", sel, pod.Labels)
	}
	c := r.container(t)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, o := range r.objects {
		svc, ok := o.(*corev1.Service)
		if !ok {
			continue
		}
		for k, v := range svc.Spec.Selector {
			if pod.Labels[k] != v {
				t.Errorf("%s selects %s=%s, which the pods do not carry", name, k, v)
			}
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("%s: target port %q is no port of the container (%v)", name, p.TargetPort.String(), ports)
			}
		}
	}
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("probes: want startup, readiness and liveness over HTTP, got %+v", p)
		}
		if ports[p.HTTPGet.Port.StrVal] != ports["api"] {
			t.Errorf("probe %s on port %q, not the API's", p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
	}
	// Secrets the chart makes must hold the keys the pod reads.
	secretKey := func(name, key string) {
		s, ok := r.objects["Secret/"+name].(*corev1.Secret)
		if !ok {
			return // a Secret the user made (the tests check which one is named)
		}
		if _, ok := s.StringData[key]; !ok {
			if _, ok := s.Data[key]; !ok {
				t.Errorf("the pod reads key %q of Secret %s, which does not hold it", key, name)
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secretKey(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
		if v.Secret != nil {
			for _, it := range v.Secret.Items {
				secretKey(v.Secret.SecretName, it.Key)
			}
		}
		if v.ConfigMap != nil {
			if _, ok := r.objects["ConfigMap/"+v.ConfigMap.Name]; !ok {
				t.Errorf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
		}
	}
	for _, m := range c.VolumeMounts {
		if _, ok := vols[m.Name]; !ok {
			t.Errorf("mount %s at %s: no such volume", m.Name, m.MountPath)
		}
	}
	if np, ok := r.objects["NetworkPolicy/lizard"].(*networkingv1.NetworkPolicy); ok {
		podSel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !podSel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("the NetworkPolicy selects %v, not the pods (%v)", podSel, err)
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port.StrVal != "" {
					if _, ok := ports[p.Port.StrVal]; !ok {
						t.Errorf("the NetworkPolicy opens port %q, which the container does not name", p.Port.StrVal)
					}
				}
			}
		}
	}
	// Files the server and the hooks read are where the volumes put them.
	files := []string{"/etc/lizard/lizard.toml"}
	for _, k := range []string{"cluster-secret-file", "tls-cert", "tls-key"} {
		if p, ok := config(t, r)[k].(string); ok {
			files = append(files, p)
		}
	}
	for _, f := range files {
		checkFile(t, r, c.VolumeMounts, vols, f)
	}
	if ing, ok := r.objects["Ingress/lizard"].(*networkingv1.Ingress); ok {
		for _, rule := range ing.Spec.Rules {
			for _, p := range rule.HTTP.Paths {
				b := p.Backend.Service
				svc, ok := r.objects["Service/"+b.Name].(*corev1.Service)
				if !ok {
					t.Errorf("Ingress host %s: no Service %s", rule.Host, b.Name)
					continue
				}
				if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == b.Port.Name }) {
					t.Errorf("Ingress host %s: Service %s has no port %q", rule.Host, b.Name, b.Port.Name)
				}
			}
		}
	}
}

// checkFile fails unless file is a key of the ConfigMap or Secret mounted
// over it (a Secret the user gave is taken to hold the keys named).
func checkFile(t *testing.T, r rendered, mounts []corev1.VolumeMount, vols map[string]corev1.Volume, file string) {
	t.Helper()
	var m *corev1.VolumeMount
	for i, vm := range mounts {
		if strings.HasPrefix(file, vm.MountPath+"/") && (m == nil || len(vm.MountPath) > len(m.MountPath)) {
			m = &mounts[i]
		}
	}
	if m == nil {
		t.Errorf("%s: on no volume of the pod", file)
		return
	}
	rel := strings.TrimPrefix(file, m.MountPath+"/")
	key, items := rel, []corev1.KeyToPath(nil)
	v := vols[m.Name]
	var data map[string]bool
	switch {
	case v.ConfigMap != nil:
		items = v.ConfigMap.Items
		if cm, ok := r.objects["ConfigMap/"+v.ConfigMap.Name].(*corev1.ConfigMap); ok {
			data = map[string]bool{}
			for k := range cm.Data {
				data[k] = true
			}
		}
	case v.Secret != nil:
		items = v.Secret.Items
		if s, ok := r.objects["Secret/"+v.Secret.SecretName].(*corev1.Secret); ok {
			data = map[string]bool{}
			for k := range s.Data {
				data[k] = true
			}
			for k := range s.StringData {
				data[k] = true
			}
		}
	default:
		t.Errorf("%s: on volume %s, neither a ConfigMap nor a Secret", file, m.Name)
		return
	}
	if items != nil {
		key = ""
		for _, it := range items {
			if it.Path == rel {
				key = it.Key
			}
		}
		if key == "" {
			t.Errorf("%s: volume %s projects no %s", file, m.Name, rel)
			return
		}
	}
	if data != nil && !data[key] {
		t.Errorf("%s: volume %s has no key %q", file, m.Name, key)
	}
}

func mustRender(t *testing.T, vals map[string]any, existing ...runtime.Object) rendered {
	t.Helper()
	r, err := render(t, vals, existing...)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

func env(t *testing.T, c corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("no %s in the container's environment", name)
	return corev1.EnvVar{}
}

func hasEnv(c corev1.Container, name string) bool {
	return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

// config is the node's lizard.toml as the ConfigMap holds it, decoded.
func config(t *testing.T, r rendered) map[string]any {
	t.Helper()
	cm := get[*corev1.ConfigMap](t, r, "ConfigMap/lizard")
	var m map[string]any
	if err := toml.Unmarshal([]byte(cm.Data["lizard.toml"]), &m); err != nil {
		t.Fatalf("lizard.toml: %v\n%s", err, cm.Data["lizard.toml"])
	}
	return m
}

func TestDefaultsNeedDatabaseAndObjectStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"defaults", map[string]any{}, "database.url or database.existingSecret is required"},
		{"no object store", with(minimal(), "objectStore.url", ""), "objectStore.url is required"},
		{"not postgres", with(minimal(), "database.url", "mysql://x/y"), `database.url "mysql://x/y": must be a postgres://`},
		{"not s3", with(minimal(), "objectStore.url", "gs://b"), `objectStore.url "gs://b": must be an s3:// URL`},
		{"half the S3 credentials", with(minimal(), "objectStore.secretAccessKey", ""), "objectStore.accessKeyId and objectStore.secretAccessKey go together"},
		{"short cluster secret", with(minimal(), "clusterSecret.value", "short"), "clusterSecret.value: must be at least 32 bytes"},
		{"no preview domain", with(minimal(), "preview.domain", ""), "preview.domain is required"},
		{"ingress with nothing to route", with(minimal(), "ingress.enabled", true, "ingress.previews", false), "set ingress.apiHost, ingress.previews or both"},
		// values.schema.json
		{"misspelt value", with(minimal(), "databse.url", "postgres://x/y"), "databse"},
		{"misspelt nested value", with(minimal(), "node.leese", "10s"), "leese"},
		{"lease without a unit", with(minimal(), "node.lease", "10"), "lease"},
		{"unknown service type", with(minimal(), "service.api.type", "Nodeport"), "type"},
		{"port out of range", with(minimal(), "ports.internal", 70000), "internal"},
		{"ingress in front of a TLS proxy", with(minimal(), "ingress.enabled", true, "preview.tlsSecret", "wild"), "the preview proxy serves TLS itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: want an error saying %q, got %v", tc.want, err)
			}
		})
	}
}

func TestMinimal(t *testing.T) {
	r := mustRender(t, minimal())
	want := []string{"ConfigMap/lizard", "DaemonSet/lizard", "NetworkPolicy/lizard", "Secret/lizard-cluster", "Secret/lizard-credentials", "Service/lizard-api", "Service/lizard-preview"}
	if got := r.keys(); !slices.Equal(got, want) {
		t.Fatalf("objects: got %v, want %v", got, want)
	}

	pod := r.daemonSet(t).Spec.Template.Spec
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("host namespaces: network %v, pid %v, ipc %v; the node needs none", pod.HostNetwork, pod.HostPID, pod.HostIPC)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; lizard never calls the Kubernetes API")
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Error("service links are on: they put LIZARD_* variables in the environment lizard reads its configuration from")
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds < 300 {
		t.Errorf("terminationGracePeriodSeconds %v: too short for a drain --move", pod.TerminationGracePeriodSeconds)
	}

	c := r.container(t)
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the container is not privileged: runsc, the sandbox network and loop devices need it")
	}
	if nn := env(t, c, "LIZARD_NODE_NAME").ValueFrom; nn == nil || nn.FieldRef == nil || nn.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("LIZARD_NODE_NAME: want the pod's spec.nodeName, got %+v", nn)
	}
	if ip := env(t, c, "POD_IP").ValueFrom; ip == nil || ip.FieldRef == nil || ip.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("POD_IP: want the pod's status.podIP, got %+v", ip)
	}
	if a := env(t, c, "LIZARD_ADVERTISE").Value; a != "$(POD_IP):7070" {
		t.Errorf("LIZARD_ADVERTISE %q: want the pod IP and the internal port", a)
	}
	if ref := env(t, c, "LIZARD_DATABASE").ValueFrom.SecretKeyRef; ref.Name != "lizard-credentials" || ref.Key != "database-url" {
		t.Errorf("LIZARD_DATABASE from %s/%s", ref.Name, ref.Key)
	}
	creds := get[*corev1.Secret](t, r, "Secret/lizard-credentials")
	if creds.StringData["database-url"] != "postgres://lizard:pw@db.example.internal:5432/lizard" || creds.StringData["AWS_SECRET_ACCESS_KEY"] != "SECRET" {
		t.Errorf("credentials Secret: %v", creds.StringData)
	}
	if hasEnv(c, "LIZARD_API_KEY") {
		t.Error("LIZARD_API_KEY set without bootstrapApiKey")
	}
	if got := []string{c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path, c.StartupProbe.HTTPGet.Path}; !slices.Equal(got, []string{"/readyz", "/healthz", "/healthz"}) {
		t.Errorf("probe paths (readiness, liveness, startup): %v", got)
	}
	pre, post := c.Lifecycle.PreStop.Exec.Command, c.Lifecycle.PostStart.Exec.Command
	if want := []string{"/usr/lib/lizard/node-hook", "stop"}; !slices.Equal(pre, want) {
		t.Errorf("preStop %q, want %q", pre, want)
	}
	if want := []string{"sh", "-c", "exec /usr/lib/lizard/node-hook start 300 2>>/proc/1/fd/2"}; !slices.Equal(post, want) {
		t.Errorf("postStart %q, want %q", post, want)
	}

	var data *corev1.Volume
	for i, v := range pod.Volumes {
		if v.Name == "data" {
			data = &pod.Volumes[i]
		}
	}
	if data == nil || data.HostPath == nil || data.HostPath.Path != "/var/lib/lizard" {
		t.Fatalf("data volume: want hostPath /var/lib/lizard, got %+v", data)
	}

	var dev *corev1.Volume
	for i, v := range pod.Volumes {
		if v.Name == "dev" {
			dev = &pod.Volumes[i]
		}
	}
	if dev == nil || dev.HostPath == nil || dev.HostPath.Path != "/dev" || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "dev" && m.MountPath == "/dev" }) {
		t.Errorf("the host's /dev is not the container's (loop devices for volumes): %+v", dev)
	}
	if strings.HasPrefix(c.TerminationMessagePath, "/dev/") || c.TerminationMessagePath == "" {
		t.Errorf("terminationMessagePath %q: the kubelet would make it in the host's /dev", c.TerminationMessagePath)
	}

	cfg := config(t, r)
	for k, want := range map[string]any{
		"listen": "0.0.0.0:8080", "proxy-listen": "0.0.0.0:80", "internal-listen": "0.0.0.0:7070",
		"data-dir": "/var/lib/lizard", "domain": "sandbox.example.com", "cluster-secret-file": "/etc/lizard-secrets/cluster/secret",
		"object-store": "s3://lizard?endpoint=s3.example.internal:9000&region=us-east-1", "cgroup-parent": "lizard",
		"node-lease": "10s", "node-dead-after": "60s",
	} {
		if cfg[k] != want {
			t.Errorf("lizard.toml %s = %v, want %v", k, cfg[k], want)
		}
	}
	for _, k := range []string{"database", "tls-cert", "dns-upstream"} {
		if _, ok := cfg[k]; ok {
			t.Errorf("lizard.toml sets %s", k)
		}
	}

	// A cluster secret of 64 random characters, generated on install.
	cs := get[*corev1.Secret](t, r, "Secret/lizard-cluster")
	if len(cs.Data["secret"]) != 64 {
		t.Errorf("generated cluster secret: %d bytes, want 64", len(cs.Data["secret"]))
	}
	if other := mustRender(t, minimal()); string(get[*corev1.Secret](t, other, "Secret/lizard-cluster").Data["secret"]) == string(cs.Data["secret"]) {
		t.Error("two installs generated the same cluster secret")
	}
	if !strings.Contains(r.notes, "lizard nodes ls") {
		t.Errorf("NOTES.txt:\n%s", r.notes)
	}
}

// The internal listener takes connections from the other nodes only; the
// API and the previews from anyone.
func TestNetworkPolicy(t *testing.T) {
	r := mustRender(t, with(minimal(), "networkPolicy.extraIngress", []any{map[string]any{"ports": []any{map[string]any{"port": 9090}}}}))
	np := get[*networkingv1.NetworkPolicy](t, r, "NetworkPolicy/lizard")
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v: want Ingress only (sandboxes' egress is lizard's firewall's)", np.Spec.PolicyTypes)
	}
	from := map[string]string{}
	for _, rule := range np.Spec.Ingress {
		who := "anyone"
		if len(rule.From) > 0 {
			sel, _ := metav1.LabelSelectorAsSelector(rule.From[0].PodSelector)
			who = sel.String()
		}
		for _, p := range rule.Ports {
			from[p.Port.String()] = who
		}
	}
	want := map[string]string{"api": "anyone", "preview": "anyone", "9090": "anyone",
		"internal": "app.kubernetes.io/instance=lizard,app.kubernetes.io/name=lizard"}
	if fmt.Sprint(from) != fmt.Sprint(want) {
		t.Errorf("ingress by port: %v, want %v", from, want)
	}

	r = mustRender(t, with(minimal(), "networkPolicy.enabled", false))
	if _, ok := r.objects["NetworkPolicy/lizard"]; ok {
		t.Error("a NetworkPolicy although networkPolicy.enabled is false")
	}
}

// An upgrade keeps the cluster secret the install generated: nodes of the
// old and the new release must trust each other while the DaemonSet rolls.
func TestUpgradeKeepsClusterSecret(t *testing.T) {
	const kept = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ01"
	old := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "lizard-cluster", Namespace: namespace},
		Data:       map[string][]byte{"secret": []byte(kept)},
	}
	r := mustRender(t, minimal(), old)
	if got := string(get[*corev1.Secret](t, r, "Secret/lizard-cluster").Data["secret"]); got != kept {
		t.Errorf("cluster secret after upgrade: %q, want the one kept %q", got, kept)
	}

	// A value given replaces it.
	given := strings.Repeat("s", 40)
	r = mustRender(t, with(minimal(), "clusterSecret.value", given), old)
	if got := string(get[*corev1.Secret](t, r, "Secret/lizard-cluster").Data["secret"]); got != given {
		t.Errorf("cluster secret from clusterSecret.value: %q", got)
	}
}

func TestExternalSecrets(t *testing.T) {
	r := mustRender(t, map[string]any{
		"database":        map[string]any{"existingSecret": "pg", "existingSecretKey": "dsn"},
		"objectStore":     map[string]any{"url": "s3://b?endpoint=minio:9000&insecure=true", "existingSecret": "s3-creds"},
		"clusterSecret":   map[string]any{"existingSecret": "peers", "existingSecretKey": "hmac"},
		"bootstrapApiKey": map[string]any{"existingSecret": "first-key"},
	})
	for _, k := range r.keys() {
		if strings.HasPrefix(k, "Secret/") {
			t.Errorf("%s rendered although every secret is external", k)
		}
	}
	c := r.container(t)
	for name, want := range map[string]string{
		"LIZARD_DATABASE":       "pg/dsn",
		"AWS_ACCESS_KEY_ID":     "s3-creds/AWS_ACCESS_KEY_ID",
		"AWS_SECRET_ACCESS_KEY": "s3-creds/AWS_SECRET_ACCESS_KEY",
		"LIZARD_API_KEY":        "first-key/key",
	} {
		ref := env(t, c, name).ValueFrom.SecretKeyRef
		if got := ref.Name + "/" + ref.Key; got != want {
			t.Errorf("%s from %s, want %s", name, got, want)
		}
	}
	for _, v := range r.daemonSet(t).Spec.Template.Spec.Volumes {
		if v.Name == "cluster-secret" {
			if v.Secret.SecretName != "peers" || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "hmac" || v.Secret.Items[0].Path != "secret" {
				t.Errorf("cluster secret volume: %+v", v.Secret)
			}
		}
	}
}

// Without credentials the S3 client finds its own (e.g. a role of the
// node): no AWS_* variables then.
func TestObjectStoreWithoutKeys(t *testing.T) {
	r := mustRender(t, with(minimal(), "objectStore.accessKeyId", "", "objectStore.secretAccessKey", ""))
	c := r.container(t)
	if hasEnv(c, "AWS_ACCESS_KEY_ID") || hasEnv(c, "AWS_SECRET_ACCESS_KEY") {
		t.Error("AWS credentials in the environment although none were given")
	}
	if _, ok := get[*corev1.Secret](t, r, "Secret/lizard-credentials").StringData["AWS_ACCESS_KEY_ID"]; ok {
		t.Error("the credentials Secret holds an empty access key")
	}
}

func TestIngress(t *testing.T) {
	r := mustRender(t, with(minimal(),
		"ingress.enabled", true, "ingress.className", "nginx", "ingress.apiHost", "lizard.example.com",
		"ingress.annotations", map[string]any{"nginx.ingress.kubernetes.io/proxy-body-size": "0"},
		"ingress.tls", []any{map[string]any{"hosts": []any{"lizard.example.com", "*.sandbox.example.com"}, "secretName": "lizard-tls"}},
	))
	ing := get[*networkingv1.Ingress](t, r, "Ingress/lizard")
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" {
		t.Errorf("ingressClassName: %v", ing.Spec.IngressClassName)
	}
	hosts := map[string]string{}
	for _, rule := range ing.Spec.Rules {
		hosts[rule.Host] = rule.HTTP.Paths[0].Backend.Service.Name
	}
	if want := map[string]string{"lizard.example.com": "lizard-api", "*.sandbox.example.com": "lizard-preview"}; fmt.Sprint(hosts) != fmt.Sprint(want) {
		t.Errorf("Ingress rules: %v, want %v", hosts, want)
	}
	if len(ing.Spec.TLS) != 1 || ing.Spec.TLS[0].SecretName != "lizard-tls" {
		t.Errorf("Ingress TLS: %+v", ing.Spec.TLS)
	}

	// Previews only, through the Ingress; the API stays in the cluster.
	r = mustRender(t, with(minimal(), "ingress.enabled", true))
	ing = get[*networkingv1.Ingress](t, r, "Ingress/lizard")
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != "*.sandbox.example.com" {
		t.Errorf("Ingress rules: %+v", ing.Spec.Rules)
	}
}

func TestPreviewTLS(t *testing.T) {
	r := mustRender(t, with(minimal(), "preview.tlsSecret", "wildcard-cert", "preview.domain", "run.example.org",
		"service.preview.type", "LoadBalancer"))
	cfg := config(t, r)
	if cfg["proxy-listen"] != "0.0.0.0:443" || cfg["tls-cert"] != "/etc/lizard-secrets/tls/tls.crt" || cfg["tls-key"] != "/etc/lizard-secrets/tls/tls.key" || cfg["domain"] != "run.example.org" {
		t.Errorf("lizard.toml: %v", cfg)
	}
	svc := get[*corev1.Service](t, r, "Service/lizard-preview")
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("preview Service: %s port %d", svc.Spec.Type, svc.Spec.Ports[0].Port)
	}
	found := false
	for _, v := range r.daemonSet(t).Spec.Template.Spec.Volumes {
		found = found || (v.Secret != nil && v.Secret.SecretName == "wildcard-cert")
	}
	if !found {
		t.Error("the TLS Secret is not mounted")
	}
}

func TestResourcesAndPlacement(t *testing.T) {
	r := mustRender(t, with(minimal(),
		"resources", map[string]any{"requests": map[string]any{"cpu": "500m", "memory": "1Gi"}, "limits": map[string]any{"memory": "4Gi"}},
		"nodeSelector", map[string]any{"lizard.build/sandboxes": "true"},
		"tolerations", []any{map[string]any{"key": "sandboxes", "operator": "Exists", "effect": "NoSchedule"}},
		"priorityClassName", "system-node-critical",
		"extraArgs", []any{"--max-sandboxes=200"},
		"extraEnv", []any{map[string]any{"name": "LIZARD_LOG_LEVEL", "value": "debug"}},
		"node.dnsUpstream", "1.1.1.1:53", "node.undrainTimeoutSeconds", 60, "node.dataDir", "/srv/lizard", "node.hostDev", false,
		"podAnnotations", map[string]any{"prometheus.io/scrape": "true"},
	))
	c := r.container(t)
	if got := c.Resources.Requests.Cpu().String() + " " + c.Resources.Requests.Memory().String() + " " + c.Resources.Limits.Memory().String(); got != "500m 1Gi 4Gi" {
		t.Errorf("resources: %s", got)
	}
	pod := r.daemonSet(t).Spec.Template
	if pod.Spec.NodeSelector["lizard.build/sandboxes"] != "true" || len(pod.Spec.Tolerations) != 1 || pod.Spec.PriorityClassName != "system-node-critical" {
		t.Errorf("placement: %v %v %q", pod.Spec.NodeSelector, pod.Spec.Tolerations, pod.Spec.PriorityClassName)
	}
	if !slices.Equal(c.Args, []string{"--max-sandboxes=200"}) || env(t, c, "LIZARD_LOG_LEVEL").Value != "debug" {
		t.Errorf("extra args %v / env", c.Args)
	}
	if config(t, r)["dns-upstream"] != "1.1.1.1:53" {
		t.Error("node.dnsUpstream not in lizard.toml")
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "dev" {
			t.Error("the host's /dev is mounted although node.hostDev is false")
		}
	}
	if post := c.Lifecycle.PostStart.Exec.Command; !strings.Contains(post[len(post)-1], "node-hook start 60 ") {
		t.Errorf("postStart %q: want node.undrainTimeoutSeconds passed on", post)
	}
	if pod.Annotations["prometheus.io/scrape"] != "true" || pod.Annotations["checksum/config"] == "" {
		t.Errorf("pod annotations: %v", pod.Annotations)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "data" && v.HostPath.Path != "/srv/lizard" {
			t.Errorf("data hostPath %s, want /srv/lizard", v.HostPath.Path)
		}
	}
}

// Every key of the rendered lizard.toml must be a flag of `lizard serve`:
// serve refuses a file with an unknown key, so a typo would keep every node
// from starting. deploy/lizard.toml lists them all (generated from the flag
// set; cmd/lizard's tests keep it current).
func TestConfigKeysAreServeFlags(t *testing.T) {
	known := map[string]bool{}
	b, err := os.ReadFile("../lizard.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^#([a-z0-9-]+) = `).FindAllStringSubmatch(string(b), -1) {
		known[m[1]] = true
	}
	if len(known) < 20 {
		t.Fatalf("read only %d keys from deploy/lizard.toml", len(known))
	}
	if !known["internal-listen"] || !known["object-store"] {
		t.Fatal("deploy/lizard.toml has no cluster or object-store flags: run go generate ./cmd/lizard")
	}
	r := mustRender(t, with(minimal(), "preview.tlsSecret", "c", "node.dnsUpstream", "1.1.1.1:53"))
	for k := range config(t, r) {
		if !known[k] {
			t.Errorf("lizard.toml key %q is not a flag of lizard serve", k)
		}
	}
	// The per-pod settings come as LIZARD_* variables, and so do those of
	// a plain host's cluster.env: they must be flags too.
	vars := map[string]string{}
	for _, e := range r.container(t).Env {
		vars[e.Name] = "the chart's container"
	}
	env, err := os.ReadFile("../systemd/cluster.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^#?(LIZARD_[A-Z0-9_]+)=`).FindAllStringSubmatch(string(env), -1) {
		vars[m[1]] = "deploy/systemd/cluster.env"
	}
	for v, where := range vars {
		if name, ok := strings.CutPrefix(v, "LIZARD_"); ok && v != "LIZARD_API_KEY" {
			if k := strings.ToLower(strings.ReplaceAll(name, "_", "-")); !known[k] {
				t.Errorf("%s (%s) is no flag of lizard serve (--%s)", v, where, k)
			}
		}
	}
}

// helm lint's rules (Chart.yaml, templates, deprecated APIs for the
// Kubernetes version) find nothing above information.
func TestLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"minimal": minimal(),
		"ingress": with(minimal(), "ingress.enabled", true, "ingress.apiHost", "lizard.example.com"),
	} {
		t.Run(name, func(t *testing.T) {
			l := lint.AllWithKubeVersion("lizard", vals, namespace, &chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"})
			for _, m := range l.Messages {
				if m.Severity > support.InfoSev {
					t.Error(m)
				} else {
					t.Log(m)
				}
			}
		})
	}
}
