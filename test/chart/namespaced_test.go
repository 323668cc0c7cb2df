package chart

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// The controller's ServiceAccount as the chart installs it.
var controllerSubject = rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "terrace-controller", Namespace: namespace}

// controllerRBAC is what a render grants the controller: the ClusterRoles
// bound to it cluster-wide, the namespaces where the ClusterRole
// terrace-controller is bound by a RoleBinding, every ClusterRole by name,
// and the controller's arguments.
type controllerRBAC struct {
	clusterWide  []string // roleRef names of ClusterRoleBindings to the controller
	namespacedIn []string // namespaces of RoleBindings to ClusterRole terrace-controller
	clusterRoles map[string]rbacv1.ClusterRole
	args         []string
}

func readControllerRBAC(t *testing.T, objs []*unstructured.Unstructured) controllerRBAC {
	t.Helper()
	out := controllerRBAC{clusterRoles: map[string]rbacv1.ClusterRole{}}
	convert := func(o *unstructured.Unstructured, into any) {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			convert(o, &r)
			out.clusterRoles[r.Name] = r
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			convert(o, &b)
			if slices.Contains(b.Subjects, controllerSubject) {
				out.clusterWide = append(out.clusterWide, b.RoleRef.Name)
			}
		case "RoleBinding":
			var b rbacv1.RoleBinding
			convert(o, &b)
			if slices.Contains(b.Subjects, controllerSubject) && b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == "terrace-controller" {
				out.namespacedIn = append(out.namespacedIn, b.Namespace)
			}
		case "Deployment":
			var d appsv1.Deployment
			convert(o, &d)
			out.args = d.Spec.Template.Spec.Containers[0].Args
		}
	}
	slices.Sort(out.clusterWide)
	slices.Sort(out.namespacedIn)
	return out
}

// watchFlags are the controller's --watch-namespaces arguments.
func (r controllerRBAC) watchFlags() []string {
	var out []string
	for _, a := range r.args {
		if strings.HasPrefix(a, "--watch-namespaces") {
			out = append(out, a)
		}
	}
	return out
}

// TestChartNamespacedMode: with rbac.namespaced the controller's write role
// (terrace-controller: Secrets, pods, Roles...) is bound in exactly the
// release namespace and the listed ones, never cluster-wide; what stays
// cluster-wide holds only cluster-scoped reviews; the controller is told
// to watch exactly those namespaces. The default stays the all-namespaces
// mode of before.
func TestChartNamespacedMode(t *testing.T) {
	defaults := readControllerRBAC(t, render(t, nil))
	if want := []string{"terrace-controller", "terrace-controller-cluster"}; !slices.Equal(defaults.clusterWide, want) {
		t.Errorf("all-namespaces mode binds cluster-wide %v, want %v", defaults.clusterWide, want)
	}
	if len(defaults.namespacedIn) != 0 || len(defaults.watchFlags()) != 0 {
		t.Errorf("all-namespaces mode: RoleBindings in %v, flags %v", defaults.namespacedIn, defaults.watchFlags())
	}

	got := readControllerRBAC(t, render(t, map[string]any{
		"rbac":            map[string]any{"namespaced": true},
		"watchNamespaces": []any{"team-b", "team-a", "team-b", namespace},
	}))
	if want := []string{"terrace-controller-cluster"}; !slices.Equal(got.clusterWide, want) {
		t.Errorf("namespaced mode binds cluster-wide %v, want only %v", got.clusterWide, want)
	}
	for _, name := range got.clusterWide {
		for _, rule := range got.clusterRoles[name].Rules {
			for _, res := range rule.Resources {
				if res != "tokenreviews" && res != "subjectaccessreviews" {
					t.Errorf("ClusterRole %s, bound cluster-wide in the namespaced mode, grants %v on %s", name, rule.Verbs, res)
				}
			}
		}
	}
	if want := []string{"team-a", "team-b", namespace}; !slices.Equal(got.namespacedIn, want) {
		t.Errorf("terrace-controller bound in %v, want exactly %v", got.namespacedIn, want)
	}
	if flags, want := got.watchFlags(), "--watch-namespaces="+namespace+",team-b,team-a"; len(flags) != 1 || flags[0] != want {
		t.Errorf("controller flags %v, want [%s]", flags, want)
	}

	// With no namespace listed the controller still gets a list (its own
	// namespace), never the empty flag that means every namespace.
	alone := readControllerRBAC(t, render(t, map[string]any{"rbac": map[string]any{"namespaced": true}}))
	if flags := alone.watchFlags(); len(flags) != 1 || flags[0] != "--watch-namespaces="+namespace || !slices.Equal(alone.namespacedIn, []string{namespace}) {
		t.Errorf("namespaced mode without watchNamespaces: flags %v, bound in %v", flags, alone.namespacedIn)
	}
}

// TestChartRefusesNamespacedValuesItCannotKeep: a system namespace in the
// list or as the release namespace, a name no namespace has, and a list
// without the namespaced mode are refused at render time with the value to
// change, as the controller would refuse them at its start.
func TestChartRefusesNamespacedValuesItCannotKeep(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string
		vals      map[string]any
		want      string
	}{
		{"kube-system listed", namespace, map[string]any{"rbac": map[string]any{"namespaced": true}, "watchNamespaces": []any{"team-a", "kube-system"}}, "kube-system is a system namespace"},
		{"kube-node-lease listed", namespace, map[string]any{"rbac": map[string]any{"namespaced": true}, "watchNamespaces": []any{"kube-node-lease"}}, "kube-node-lease is a system namespace"},
		{"released into kube-system", "kube-system", map[string]any{"rbac": map[string]any{"namespaced": true}}, "release namespace kube-system is a system namespace"},
		{"not a name", namespace, map[string]any{"rbac": map[string]any{"namespaced": true}, "watchNamespaces": []any{"Team_A"}}, "is not a namespace name"},
		{"a list without the mode", namespace, map[string]any{"watchNamespaces": []any{"team-a"}}, "rbac.namespaced is false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			install := action.NewInstall(&action.Configuration{})
			install.DryRun, install.ClientOnly, install.ReleaseName, install.Namespace = true, true, "terrace", tc.namespace
			_, err := install.Run(loadChart(t), tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
