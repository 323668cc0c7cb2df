package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/testenv"
)

// TestMain stops the envtest API server the namespaced-mode tests share,
// if one of them started it.
func TestMain(m *testing.M) {
	code := m.Run()
	if rbacEnv != nil {
		_ = rbacEnv.Stop()
	}
	os.Exit(code)
}

var (
	rbacEnvOnce sync.Once
	rbacEnv     *testenv.Env
	rbacEnvErr  error
)

// sharedRBACEnv starts, on first use, the API server (with RBAC, as
// envtest runs it) of the namespaced-mode tests.
func sharedRBACEnv(t *testing.T) *testenv.Env {
	t.Helper()
	rbacEnvOnce.Do(func() { rbacEnv, rbacEnvErr = testenv.Start() })
	if rbacEnvErr != nil {
		t.Fatal(rbacEnvErr)
	}
	return rbacEnv
}

// The namespaces config/namespaced names: the operator's and the one it opts in.
const (
	overlayOperatorNamespace = "terrace-system"
	overlayWatchedNamespace  = "team-a"
	// unwatchedNamespace is a tenant namespace the overlay does not opt in.
	unwatchedNamespace = "team-b"
)

// TestNamespacedModeConfinesTheController installs config/namespaced's
// ServiceAccount, roles and bindings, unchanged, on a real API server and
// runs the real controller as that ServiceAccount (its own token, no
// impersonation) with the overlay's --watch-namespaces.
//
// The attack: whoever holds the controller's token (a compromised
// controller, or someone who read its projected token) reads the cluster's
// own credentials in kube-system. In the all-namespaces mode the
// ClusterRoleBinding lets them; here the API server refuses, and
// SubjectAccessReviews show that no write right of the controller reaches
// kube-system or an unwatched tenant namespace.
//
// The controller still works where it was let in: a Program in the watched
// namespace gets its artifact, a Stack there is reconciled, a TerraceConfig
// there gets its API server's Deployment, Role and RoleBinding (created with
// the per-namespace rights alone). A Stack, Program and TerraceConfig in an
// unwatched namespace, created before the controller starts, are never
// touched. Every watch the controller makes must be allowed by the
// per-namespace bindings, or its caches would not sync and nothing would be
// reconciled.
func TestNamespacedModeConfinesTheController(t *testing.T) {
	env := sharedRBACEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{overlayOperatorNamespace, overlayWatchedNamespace, unwatchedNamespace} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	// The install: every RBAC object and the ServiceAccount of the overlay,
	// and the controller's arguments from its Deployment.
	var args []string
	var sa *corev1.ServiceAccount
	for _, o := range kustomizeConfig(t, "namespaced") {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding":
			if o.GetKind() == "ServiceAccount" {
				sa = &corev1.ServiceAccount{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, sa); err != nil {
					t.Fatal(err)
				}
			}
			if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("failed to install %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			args = d.Spec.Template.Spec.Containers[0].Args
		}
	}
	if sa == nil || sa.Namespace != overlayOperatorNamespace {
		t.Fatalf("config/namespaced installs no ServiceAccount in %s", overlayOperatorNamespace)
	}
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name

	// What the attacker wants, and what the controller needs.
	if err := env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "cluster-credentials"},
		StringData: map[string]string{"token": "the cluster's own"},
	}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token, err := cs.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	asController := rest.AnonymousClientConfig(env.Config)
	asController.BearerToken = token.Status.Token
	refused := &refusedRequests{}
	asController.Wrap(func(rt http.RoundTripper) http.RoundTripper { refused.next = rt; return refused })
	controllerCS, err := kubernetes.NewForConfig(asController)
	if err != nil {
		t.Fatal(err)
	}

	// The attack, with the controller's own token (its refusals are not the
	// controller's: the log starts with the controller).
	if _, err := controllerCS.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, "cluster-credentials", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller's token read a Secret in kube-system: %v, want Forbidden", err)
	}
	if _, err := controllerCS.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller's token listed Secrets cluster-wide: %v, want Forbidden", err)
	}
	// What the API server's authorizer says of the controller's user.
	for _, tc := range []struct {
		ns, verb, group, resource string
		allowed                   bool
	}{
		{metav1.NamespaceSystem, "get", "", "secrets", false},
		{metav1.NamespaceSystem, "list", "", "secrets", false},
		{metav1.NamespaceSystem, "create", "", "pods", false},
		{metav1.NamespaceSystem, "create", "rbac.authorization.k8s.io", "rolebindings", false},
		{metav1.NamespaceSystem, "create", "", "serviceaccounts", false},
		{"kube-public", "create", "", "secrets", false},
		{"kube-node-lease", "update", "", "secrets", false},
		{metav1.NamespaceAll, "list", "", "secrets", false},
		{unwatchedNamespace, "get", "", "secrets", false},
		{unwatchedNamespace, "create", "", "pods", false},
		{unwatchedNamespace, "update", "terrace.dev", "stacks", false},
		{unwatchedNamespace, "create", "apps", "deployments", false},
		// The rights it keeps, where it was let in.
		{overlayWatchedNamespace, "get", "", "secrets", true},
		{overlayWatchedNamespace, "create", "", "pods", true},
		{overlayWatchedNamespace, "update", "terrace.dev", "stacks", true},
		{overlayOperatorNamespace, "create", "", "secrets", true},
		{overlayOperatorNamespace, "update", "coordination.k8s.io", "leases", true},
	} {
		review, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: tc.ns, Verb: tc.verb, Group: tc.group, Resource: tc.resource,
			},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != tc.allowed {
			t.Errorf("SubjectAccessReview: %s %s.%s in %q allowed=%v, want %v (%s)", tc.verb, tc.resource, tc.group, tc.ns, review.Status.Allowed, tc.allowed, review.Status.Reason)
		}
	}

	// Objects of a tenant the overlay did not opt in, there before the
	// controller starts: its first lists would hold them if it watched
	// their namespace.
	ignored := tenantObjects(unwatchedNamespace)
	for _, o := range ignored {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// The controller, as the ServiceAccount, with the overlay's flags.
	opts := LocalOptions(overlayOperatorNamespace, "127.0.0.1:0", "127.0.0.1:0")
	opts.LeaderElection = true // the Lease through the Role in terrace-system
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	opts.BindFlags(fs)
	for _, a := range args {
		if strings.HasPrefix(a, "--watch-namespaces") {
			if err := fs.Parse([]string{a}); err != nil {
				t.Fatal(err)
			}
		}
	}
	watched, err := opts.WatchedNamespaces()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{overlayWatchedNamespace, overlayOperatorNamespace}; !slices.Equal(watched, want) {
		t.Fatalf("config/namespaced's controller watches %v, want %v", watched, want)
	}
	refused.reset()
	mgr, err := NewManager(asController, opts)
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the controller stopped with an error: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the controller did not stop within a minute")
		}
	})

	served := tenantObjects(overlayWatchedNamespace)
	for _, o := range served {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	program, stack := served[0].(*terracev1.Program), served[1].(*terracev1.Stack)
	eventually(ctx, t, "the Program in the watched namespace got its artifact", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(program), program); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(program.Status.Conditions, "Ready") && program.Status.Artifact != nil, nil
	})
	eventually(ctx, t, "the Stack in the watched namespace was reconciled (waiting for its Program)", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(stack), stack); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(stack.Status.Conditions, "Ready")
		return ready != nil && ready.Reason == "SourceNotFound", nil
	})
	for _, obj := range []client.Object{&appsv1.Deployment{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}} {
		eventually(ctx, t, fmt.Sprintf("the watched namespace's API server got its %T", obj), func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: overlayWatchedNamespace, Name: "terrace-api"}, obj)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		})
	}

	// Nothing the controller did needed a right outside its namespaces: a
	// watch made cluster-wide (the runner pod caches, any informer) would
	// be refused here, retried for ever and leave its cache unsynced.
	if calls := refused.calls(); len(calls) > 0 {
		t.Errorf("the API server refused %d requests of the controller:\n%s", len(calls), strings.Join(calls, "\n"))
	}

	// The unwatched tenant's objects: as they were created.
	for _, o := range ignored {
		now := o.DeepCopyObject().(client.Object)
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), now); err != nil {
			t.Fatal(err)
		}
		if now.GetResourceVersion() != o.GetResourceVersion() || len(now.GetFinalizers()) > 0 {
			t.Errorf("%T %s/%s in the unwatched namespace was changed (resourceVersion %s -> %s, finalizers %v)",
				o, o.GetNamespace(), o.GetName(), o.GetResourceVersion(), now.GetResourceVersion(), now.GetFinalizers())
		}
	}
	var made corev1.SecretList
	if err := env.Client.List(ctx, &made, client.InNamespace(unwatchedNamespace)); err != nil {
		t.Fatal(err)
	}
	if len(made.Items) > 0 {
		t.Errorf("the controller made %d Secrets in the unwatched namespace", len(made.Items))
	}
	for _, obj := range []client.Object{&appsv1.Deployment{}, &rbacv1.Role{}} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: unwatchedNamespace, Name: "terrace-api"}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("the unwatched namespace's TerraceConfig got an API server %T: %v", obj, err)
		}
	}
	// And its cache cannot hold them.
	if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(ignored[1]), &terracev1.Stack{}); err == nil {
		t.Error("the controller's cache holds a Stack of the unwatched namespace")
	}
}

// refusedRequests records the requests the API server answers 403.
type refusedRequests struct {
	next http.RoundTripper
	mu   sync.Mutex
	log  []string
}

func (r *refusedRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusForbidden {
		r.mu.Lock()
		r.log = append(r.log, req.Method+" "+req.URL.RequestURI())
		r.mu.Unlock()
	}
	return resp, err
}

func (r *refusedRequests) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = nil
}

func (r *refusedRequests) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// tenantObjects are a Program, a Stack (whose Program does not exist, so it
// waits without a runner) and a TerraceConfig asking for an API server.
func tenantObjects(ns string) []client.Object {
	return []client.Object{
		&terracev1.Program{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "net"},
			Spec:       terracev1.ProgramSpec{Files: map[string]terracev1.ProgramFile{"main.tf": `output "x" { value = 1 }`}},
		},
		&terracev1.Stack{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
			Spec:       terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "not-yet"}}},
		},
		&terracev1.TerraceConfig{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
			Spec:       terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}},
		},
	}
}

// TestControllerRolesSplitByScope: the generated ClusterRole
// terrace-controller, which the namespaced mode binds per namespace, holds
// only namespaced resources, and terrace-controller-cluster, bound
// cluster-wide in both modes, only cluster-scoped ones, as the API server's
// discovery says. A new marker of a cluster-scoped resource without
// roleName=terrace-controller-cluster (a right no RoleBinding can grant, so
// the namespaced mode would lack it) or a namespaced one with it (granted in
// every namespace, kube-system included) fails here.
func TestControllerRolesSplitByScope(t *testing.T) {
	env := sharedRBACEnv(t)
	lists, err := discovery.NewDiscoveryClientForConfigOrDie(env.Config).ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	namespaced := map[string]bool{} // "group/resource"
	for _, list := range lists {
		gv, err := parseGroup(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			namespaced[gv+"/"+r.Name] = r.Namespaced
		}
	}
	// Flux's source kinds, read when installed, are namespaced; their CRDs
	// are not installed here.
	for _, r := range []string{"gitrepositories", "ocirepositories", "buckets"} {
		namespaced["source.toolkit.fluxcd.io/"+r] = true
	}

	roles := generatedClusterRoles(t)
	for name, wantNamespaced := range map[string]bool{NamespacedRole: true, ClusterScopeRole: false} {
		role, ok := roles[name]
		if !ok {
			t.Fatalf("config/rbac/role.yaml has no ClusterRole %s: run make generate", name)
		}
		if len(role.Rules) == 0 {
			t.Errorf("ClusterRole %s has no rules", name)
		}
		for _, rule := range role.Rules {
			if len(rule.NonResourceURLs) > 0 {
				t.Errorf("ClusterRole %s grants non-resource URLs %v", name, rule.NonResourceURLs)
			}
			for _, group := range rule.APIGroups {
				for _, res := range rule.Resources {
					base, _, _ := strings.Cut(res, "/")
					isNamespaced, known := namespaced[group+"/"+base]
					switch {
					case !known:
						t.Errorf("ClusterRole %s: the API server does not serve %s in group %q; say here whether it is namespaced", name, base, group)
					case isNamespaced != wantNamespaced:
						t.Errorf("ClusterRole %s grants %v on %s.%s, which is namespaced=%v: its marker wants roleName=%s", name, rule.Verbs, res, group, isNamespaced, map[bool]string{true: NamespacedRole, false: ClusterScopeRole}[isNamespaced])
					}
				}
			}
		}
	}
	for name := range roles {
		if name != NamespacedRole && name != ClusterScopeRole {
			t.Errorf("config/rbac/role.yaml has a ClusterRole %s that no install binds", name)
		}
	}
}

func parseGroup(groupVersion string) (string, error) {
	if !strings.Contains(groupVersion, "/") {
		return "", nil // the core group: "v1"
	}
	group, _, _ := strings.Cut(groupVersion, "/")
	if group == "" {
		return "", fmt.Errorf("bad group version %q", groupVersion)
	}
	return group, nil
}

// generatedClusterRoles are the ClusterRoles of config/rbac/role.yaml.
func generatedClusterRoles(t *testing.T) map[string]rbacv1.ClusterRole {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]rbacv1.ClusterRole{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
			t.Fatal(err)
		}
		if role.Kind == "ClusterRole" {
			out[role.Name] = role
		}
	}
	return out
}

// kustomizeConfig renders config/<dir> as `kubectl kustomize` does.
func kustomizeConfig(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resources, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), "config", dir))
	if err != nil {
		t.Fatalf("failed to render config/%s: %v", dir, err)
	}
	data, err := resources.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("failed to decode config/%s: %v", dir, err)
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
	return out
}

func eventually(ctx context.Context, t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, cond); err != nil {
		t.Fatalf("%s: not within 90s: %v", what, err)
	}
}
