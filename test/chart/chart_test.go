// Package chart tests the Helm chart charts/terrace with the Helm Go library:
// it lints, renders, and installs what config/default installs. It is a
// package of its own so that only it compiles Helm.
package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/terrace-dev/terrace/test/chart/chartrender"
)

const namespace = chartrender.Namespace

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "..", "..")
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := chartrender.Load(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// render renders the chart as `helm template -n terrace-system` does.
func render(t *testing.T, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := chartrender.Render(repoRoot(t), vals)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func decode(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := chartrender.Decode(manifest)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// kustomize renders config/<dir> as `kubectl kustomize` does.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), "config", dir))
	if err != nil {
		t.Fatalf("failed to render config/%s: %v", dir, err)
	}
	data, err := resources.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, string(data))
}

func TestChartLintsClean(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"defaults": nil,
		"everything on": {
			"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
			"runner":  map[string]any{"image": "registry.example.com/terrace:v1", "binary": "terraform"},
			"state":   map[string]any{"backend": "postgres", "postgres": map[string]any{"connectionSecretName": "pg"}, "encryptionKeySecretName": "key"},
			"api":     map[string]any{"enabled": true, "replicas": 2},
		},
		"namespaced": {
			"rbac":            map[string]any{"namespaced": true},
			"watchNamespaces": []any{"team-a", "team-b"},
		},
		"sharded": {
			"sharding": map[string]any{"shards": []any{"shard1", "shard2"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Namespace = namespace
			result := lint.Run([]string{filepath.Join(repoRoot(t), "charts", "terrace")}, vals)
			for _, msg := range result.Messages {
				if msg.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", msg)
				} else {
					t.Log(msg)
				}
			}
			for _, err := range result.Errors {
				t.Errorf("helm lint: %v", err)
			}
		})
	}
}

// key names an object for the comparison.
func key(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// TestChartInstallsWhatConfigDefaultInstalls: with default values the chart
// and config/default install the same objects with the same specs; only
// labels differ (the chart adds Helm's), and the chart leaves the namespace
// to `helm install --create-namespace`. So do the namespaced mode's values
// and config/namespaced, for the namespace that overlay opts in.
func TestChartInstallsWhatConfigDefaultInstalls(t *testing.T) {
	t.Run("all namespaces", func(t *testing.T) { sameAsKustomize(t, nil, "default") })
	t.Run("namespaced", func(t *testing.T) {
		sameAsKustomize(t, map[string]any{
			"rbac":            map[string]any{"namespaced": true},
			"watchNamespaces": []any{"team-a"},
		}, "namespaced")
	})
}

// sameAsKustomize compares the chart rendered with vals with config/<dir>.
func sameAsKustomize(t *testing.T, vals map[string]any, dir string) {
	t.Helper()
	chartObjs := map[string]*unstructured.Unstructured{}
	for _, o := range render(t, vals) {
		chartObjs[key(o)] = o
	}
	for _, crd := range loadChart(t).CRDObjects() {
		for _, o := range decode(t, string(crd.File.Data)) {
			chartObjs[key(o)] = o
		}
	}
	kustomized := map[string]*unstructured.Unstructured{}
	for _, o := range kustomize(t, dir) {
		if o.GetKind() != "Namespace" {
			kustomized[key(o)] = o
		}
	}
	if a, b := keys(chartObjs), keys(kustomized); a != b {
		t.Fatalf("the chart installs\n  %s\nconfig/%s installs\n  %s", a, dir, b)
	}
	for k, want := range kustomized {
		got := chartObjs[k]
		var same bool
		switch want.GetKind() {
		case "Deployment":
			same = sameSpec[appsv1.Deployment](t, got, want, func(d *appsv1.Deployment) any {
				d.Spec.Template.Labels, d.Spec.Template.Annotations = nil, nil
				for i := range d.Spec.Template.Spec.Containers {
					if c := &d.Spec.Template.Spec.Containers[i]; c.ImagePullPolicy == "" {
						c.ImagePullPolicy = corev1.PullIfNotPresent // the API server's default for a tag other than latest
					}
				}
				return d.Spec
			})
		case "Service":
			same = sameSpec[corev1.Service](t, got, want, func(s *corev1.Service) any { return s.Spec })
		case "PodDisruptionBudget":
			same = sameSpec[policyv1.PodDisruptionBudget](t, got, want, func(p *policyv1.PodDisruptionBudget) any { return p.Spec })
		case "ClusterRole", "Role":
			same = sameSpec[rbacv1.ClusterRole](t, got, want, func(r *rbacv1.ClusterRole) any { return r.Rules })
		case "ClusterRoleBinding", "RoleBinding":
			same = sameSpec[rbacv1.ClusterRoleBinding](t, got, want, func(b *rbacv1.ClusterRoleBinding) any {
				return []any{b.RoleRef, b.Subjects}
			})
		case "CustomResourceDefinition":
			same = equality.Semantic.DeepEqual(got.Object["spec"], want.Object["spec"])
		default:
			same = true // ServiceAccount: name and namespace are the whole of it
		}
		if !same {
			a, _ := yaml.Marshal(got.Object)
			b, _ := yaml.Marshal(want.Object)
			t.Errorf("%s differs: run make generate after changing config/, and change the chart with it\nchart:\n%s\nconfig/%s:\n%s", k, a, dir, b)
		}
	}
}

func keys(m map[string]*unstructured.Unstructured) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, "\n  ")
}

func sameSpec[T any](t *testing.T, a, b *unstructured.Unstructured, part func(*T) any) bool {
	t.Helper()
	var x, y T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(a.Object, &x); err != nil {
		t.Fatal(err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(b.Object, &y); err != nil {
		t.Fatal(err)
	}
	return equality.Semantic.DeepEqual(part(&x), part(&y))
}

// TestChartValues: the values a user sets reach the objects.
func TestChartValues(t *testing.T) {
	objs := render(t, map[string]any{
		"image":               map[string]any{"repository": "registry.example.com/terrace", "digest": "sha256:" + strings.Repeat("ab", 32)},
		"replicaCount":        3,
		"runner":              map[string]any{"image": "registry.example.com/runner:v2"},
		"state":               map[string]any{"backend": "postgres", "postgres": map[string]any{"connectionSecretName": "pg"}},
		"metrics":             map[string]any{"serviceMonitor": map[string]any{"enabled": true}},
		"podDisruptionBudget": map[string]any{"enabled": false},
	})
	byKind := map[string][]*unstructured.Unstructured{}
	for _, o := range objs {
		byKind[o.GetKind()] = append(byKind[o.GetKind()], o)
	}
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(byKind["Deployment"][0].Object, &d); err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example.com/terrace@sha256:"+strings.Repeat("ab", 32) || *d.Spec.Replicas != 3 {
		t.Errorf("image %s replicas %d", c.Image, *d.Spec.Replicas)
	}
	if !strings.Contains(strings.Join(c.Args, " "), "--runner-image=registry.example.com/runner:v2") {
		t.Errorf("args %v lack the runner image", c.Args)
	}
	if len(byKind["ServiceMonitor"]) != 1 || len(byKind["PodDisruptionBudget"]) != 0 || len(byKind["TerraceConfig"]) != 1 {
		t.Errorf("kinds rendered: %v", keys(func() map[string]*unstructured.Unstructured {
			m := map[string]*unstructured.Unstructured{}
			for _, o := range objs {
				m[key(o)] = o
			}
			return m
		}()))
	}
	cfg, _ := yaml.Marshal(byKind["TerraceConfig"][0].Object["spec"])
	if !bytes.Contains(cfg, []byte("backend: postgres")) || !bytes.Contains(cfg, []byte("name: pg")) {
		t.Errorf("TerraceConfig spec:\n%s", cfg)
	}

	// postgres without its Secret is refused with the value to set.
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.ReleaseName, install.Namespace = true, true, "terrace", namespace
	_, err := install.Run(loadChart(t), map[string]any{"state": map[string]any{"backend": "postgres"}})
	if err == nil || !strings.Contains(err.Error(), "state.postgres.connectionSecretName") {
		t.Errorf("postgres without a Secret: %v", err)
	}
}

// TestChartMetricsNeedAToken: the metrics are scraped over HTTPS with a
// bearer token (Prometheus's own unless a Secret is named), the reader role
// is installed, and it is bound only to the subjects the values list.
func TestChartMetricsNeedAToken(t *testing.T) {
	find := func(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
		for _, o := range objs {
			if o.GetKind() == kind && o.GetName() == name {
				return o
			}
		}
		return nil
	}
	defaults := render(t, nil)
	if find(defaults, "ClusterRole", "terrace-metrics-reader") == nil {
		t.Error("the chart does not install the ClusterRole terrace-metrics-reader")
	}
	if find(defaults, "ClusterRoleBinding", "terrace-metrics-reader") != nil {
		t.Error("terrace-metrics-reader is bound to someone by default")
	}

	reader := map[string]any{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
	objs := render(t, map[string]any{"metrics": map[string]any{
		"readers":        []any{reader},
		"serviceMonitor": map[string]any{"enabled": true},
	}})
	binding := find(objs, "ClusterRoleBinding", "terrace-metrics-reader")
	if binding == nil {
		t.Fatal("no ClusterRoleBinding terrace-metrics-reader for metrics.readers")
	}
	var b rbacv1.ClusterRoleBinding
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(binding.Object, &b); err != nil {
		t.Fatal(err)
	}
	if b.RoleRef.Name != "terrace-metrics-reader" || len(b.Subjects) != 1 || b.Subjects[0].Name != "prometheus-k8s" || b.Subjects[0].Namespace != "monitoring" {
		t.Errorf("binding: %+v", b)
	}
	monitor := find(objs, "ServiceMonitor", "terrace-controller")
	if monitor == nil {
		t.Fatal("no ServiceMonitor")
	}
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("endpoints: %v", endpoints)
	}
	ep := endpoints[0].(map[string]any)
	if ep["scheme"] != "https" || ep["port"] != "https" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || ep["tlsConfig"] == nil {
		t.Errorf("endpoint: %v", ep)
	}
	svc := find(objs, "Service", "terrace-controller-metrics")
	if svc == nil {
		t.Fatal("no metrics Service")
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 1 || ports[0].(map[string]any)["name"] != "https" || ports[0].(map[string]any)["targetPort"] != "metrics" {
		t.Errorf("metrics Service ports: %v", ports)
	}

	// A token from a Secret instead of Prometheus's own.
	objs = render(t, map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{
		"enabled":       true,
		"authorization": map[string]any{"type": "Bearer", "credentials": map[string]any{"name": "scraper-token", "key": "token"}},
	}}})
	endpoints, _, _ = unstructured.NestedSlice(find(objs, "ServiceMonitor", "terrace-controller").Object, "spec", "endpoints")
	ep = endpoints[0].(map[string]any)
	if _, ok := ep["bearerTokenFile"]; ok {
		t.Errorf("bearerTokenFile beside authorization: %v", ep)
	}
	if name, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name"); name != "scraper-token" {
		t.Errorf("authorization: %v", ep)
	}
}
