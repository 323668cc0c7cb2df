package chart

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestChartShards: sharding.shards installs a controller Deployment per
// shard, reconciling the objects labelled sharding.fluxcd.io/key=<shard>
// under its own lease, with a Service its runners are pointed at, a
// PodDisruptionBudget and a NetworkPolicy of its own; the main Deployment
// takes the unlabelled ones. No Service, budget or Deployment selects
// another controller's pods: a shard's runners must reach their own
// shard's servers, and two Deployments selecting the same pods would fight
// over them.
func TestChartShards(t *testing.T) {
	objs := render(t, map[string]any{"sharding": map[string]any{"shards": []any{"shard1", "shard2"}}})
	deployments := map[string]*appsv1.Deployment{}
	services := map[string]*corev1.Service{}
	budgets := map[string]*policyv1.PodDisruptionBudget{}
	policies := map[string]*networkingv1.NetworkPolicy{}
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			deployments[o.GetName()] = convert[appsv1.Deployment](t, o)
		case "Service":
			services[o.GetName()] = convert[corev1.Service](t, o)
		case "PodDisruptionBudget":
			budgets[o.GetName()] = convert[policyv1.PodDisruptionBudget](t, o)
		case "NetworkPolicy":
			policies[o.GetName()] = convert[networkingv1.NetworkPolicy](t, o)
		}
	}
	want := map[string][]string{
		"terrace-controller":        {"--watch-label-selector=!sharding.fluxcd.io/key"},
		"terrace-controller-shard1": {"--watch-label-selector=sharding.fluxcd.io/key=shard1", "--service-name=terrace-controller-shard1"},
		"terrace-controller-shard2": {"--watch-label-selector=sharding.fluxcd.io/key=shard2", "--service-name=terrace-controller-shard2"},
	}
	if len(deployments) != len(want) {
		t.Fatalf("Deployments %v, want %v", mapKeys(deployments), mapKeys(want))
	}
	for name, args := range want {
		d := deployments[name]
		if d == nil {
			t.Fatalf("no Deployment %s", name)
		}
		got := d.Spec.Template.Spec.Containers[0].Args
		for _, a := range args {
			if !slices.Contains(got, a) {
				t.Errorf("%s: args %v lack %s", name, got, a)
			}
		}
		if name == "terrace-controller" && slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "--service-name") }) {
			t.Errorf("the main controller's runners must keep the Service terrace-controller: %v", got)
		}
		if services[name] == nil || budgets[name] == nil || policies[name] == nil {
			t.Errorf("%s: Service %v, PodDisruptionBudget %v, NetworkPolicy %v: want one of each", name, services[name] != nil, budgets[name] != nil, policies[name] != nil)
		}
	}
	// Every selector picks its own Deployment's pods and no other's.
	for name, d := range deployments {
		pods := labels.Set(d.Spec.Template.Labels)
		for other, od := range deployments {
			selectors := map[string]labels.Selector{"Deployment": mustSelector(t, od.Spec.Selector.MatchLabels)}
			if s := services[other]; s != nil {
				selectors["Service"] = labels.SelectorFromSet(s.Spec.Selector)
			}
			if b := budgets[other]; b != nil {
				selectors["PodDisruptionBudget"] = mustSelector(t, b.Spec.Selector.MatchLabels)
			}
			if p := policies[other]; p != nil {
				selectors["NetworkPolicy"] = mustSelector(t, p.Spec.PodSelector.MatchLabels)
			}
			for kind, sel := range selectors {
				if got := sel.Matches(pods); got != (name == other) {
					t.Errorf("%s %s selects the pods of %s: %v", kind, other, name, got)
				}
			}
		}
	}

	// A name that cannot name a Deployment and Service is refused.
	install := action.NewInstall(&action.Configuration{})
	install.DryRun, install.ClientOnly, install.ReleaseName, install.Namespace = true, true, "terrace", namespace
	_, err := install.Run(loadChart(t), map[string]any{"sharding": map[string]any{"shards": []any{"Shard_1"}}})
	if err == nil || !strings.Contains(err.Error(), "sharding.shards") {
		t.Errorf("shard name Shard_1: %v, want a refusal naming sharding.shards", err)
	}
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustSelector(t *testing.T, m map[string]string) labels.Selector {
	t.Helper()
	if len(m) == 0 {
		t.Fatal("an empty selector selects every pod")
	}
	return labels.SelectorFromSet(m)
}

func mapKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
