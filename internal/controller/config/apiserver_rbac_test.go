package config

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// asAPIServer is a clientset and a client that authenticate as the API
// server's ServiceAccount of ns (impersonated by the suite's admin, with
// the groups a ServiceAccount token carries).
func asAPIServer(t *testing.T, ns string) (kubernetes.Interface, client.Client) {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + APIName,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cs, c
}

// waitForAPIRBAC waits until the API server's Role and RoleBinding of ns exist.
func waitForAPIRBAC(t *testing.T, ns string) {
	t.Helper()
	eventuallyObject(t, "the API Role", &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}, nil)
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	eventuallyObject(t, "the API RoleBinding of the Role", rb, func() error {
		if rb.RoleRef.Kind != "Role" {
			return fmt.Errorf("grants %+v", rb.RoleRef)
		}
		return nil
	})
}

// rulesIn is the ServiceAccount's effective rules in namespace, as the
// API server itself computes them (SelfSubjectRulesReview).
func rulesIn(t *testing.T, cs kubernetes.Interface, namespace string) []authorizationv1.ResourceRule {
	t.Helper()
	review, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(context.Background(),
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if review.Status.Incomplete {
		t.Fatalf("the rules review in %s is incomplete: %s", namespace, review.Status.EvaluationError)
	}
	return review.Status.ResourceRules
}

// TestAPIServerAccountHoldsOnlyItsConfig: the API server's ServiceAccount
// may get its namespace's TerraceConfig and nothing else of Terrace's or
// any Secret, in its namespace, in the operator's or in any other, and
// holds no cluster-wide right beyond what every authenticated user has.
func TestAPIServerAccountHoldsOnlyItsConfig(t *testing.T) {
	ns, other := env.Namespace(t), env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}})
	createConfig(t, other, terracev1.TerraceConfigSpec{})
	waitForAPIRBAC(t, ns)
	cs, c := asAPIServer(t, ns)

	own := rulesIn(t, cs, ns)
	t.Logf("effective rules of %s/%s in its namespace: %+v", ns, APIName, own)
	want := authorizationv1.ResourceRule{Verbs: []string{"get"}, APIGroups: []string{terracev1.GroupVersion.Group},
		Resources: []string{"terraceconfigs"}, ResourceNames: []string{terracev1.TerraceConfigName}}
	if terrace := rulesOfGroup(own, terracev1.GroupVersion.Group); len(terrace) != 1 || !reflect.DeepEqual(terrace[0], want) {
		t.Errorf("Terrace rules in its namespace: %+v, want only %+v", terrace, want)
	}
	for _, namespace := range []string{ns, other, opNS} {
		rules := rulesIn(t, cs, namespace)
		for _, r := range rules {
			for _, res := range r.Resources {
				if res == "*" || res == "secrets" || res == "stacks" || res == "programs" ||
					(namespace != ns && res == "terraceconfigs") || slices.Contains(r.Verbs, "*") {
					t.Errorf("in namespace %s it may %v %v of %v", namespace, r.Verbs, r.Resources, r.APIGroups)
				}
			}
		}
	}

	// Cluster-wide (namespace ""): none of it.
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Verb: "list", Group: terracev1.GroupVersion.Group, Resource: "terraceconfigs"},
		{Verb: "get", Group: terracev1.GroupVersion.Group, Resource: "terraceconfigs", Name: terracev1.TerraceConfigName},
		{Verb: "list", Group: terracev1.GroupVersion.Group, Resource: "stacks"},
		{Verb: "get", Resource: "secrets"},
		{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
		{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
		{Verb: "impersonate", Resource: "users"},
	} {
		review, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(),
			&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed {
			t.Errorf("cluster-wide it may %s %s.%s %s", attrs.Verb, attrs.Resource, attrs.Group, attrs.Name)
		}
	}

	// And as requests: its own config reads; nothing else does.
	ctx := context.Background()
	if err := c.Get(ctx, configKey(ns), &terracev1.TerraceConfig{}); err != nil {
		t.Errorf("it cannot read its own namespace's TerraceConfig: %v", err)
	}
	for what, read := range map[string]func() error{
		"another namespace's TerraceConfig": func() error { return c.Get(ctx, configKey(other), &terracev1.TerraceConfig{}) },
		"the operator's TerraceConfig":      func() error { return c.Get(ctx, configKey(opNS), &terracev1.TerraceConfig{}) },
		"its own certificate Secret": func() error {
			return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: APITLSSecretName}, &corev1.Secret{})
		},
		"the Stacks of its namespace": func() error { return c.List(ctx, &terracev1.StackList{}, client.InNamespace(ns)) },
		"Secrets anywhere":            func() error { return c.List(ctx, &corev1.SecretList{}) },
	} {
		if err := read(); !apierrors.IsForbidden(err) {
			t.Errorf("reading %s: %v, want Forbidden", what, err)
		}
	}
}

func rulesOfGroup(rules []authorizationv1.ResourceRule, group string) []authorizationv1.ResourceRule {
	var out []authorizationv1.ResourceRule
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*") {
			out = append(out, r)
		}
	}
	return out
}

// TestAPIServerRoleIsKeptInSync: a RoleBinding an earlier version made
// (granting the ClusterRole terrace-api) is replaced by one of the Role,
// and rights added to the Role by hand are taken away again.
func TestAPIServerRoleIsKeptInSync(t *testing.T) {
	ctx := context.Background()
	ns := env.Namespace(t)
	legacy := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "terrace-api"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: APIName, Namespace: ns}},
	}
	if err := env.Client.Create(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}})
	waitForAPIRBAC(t, ns)

	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(role), role); err != nil {
		t.Fatal(err)
	}
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
	if err := env.Client.Update(ctx, role); err != nil {
		t.Fatal(err)
	}
	eventuallyObject(t, "the Role restored", role, func() error {
		if !reflect.DeepEqual(role.Rules, APIServerRole(ns).Rules) {
			return fmt.Errorf("rules %+v", role.Rules)
		}
		return nil
	})
}

// TestAPIServerIsToldTheOperatorStateSettings: the API server reads no
// TerraceConfig outside its namespace, so the controller passes the
// operator namespace's spec.state to it, and a change there rolls it.
func TestAPIServerIsToldTheOperatorStateSettings(t *testing.T) {
	setOperatorConfig(t, func(c *terracev1.TerraceConfig) { c.Spec.State = &terracev1.StateConfig{History: ptr(int32(7))} })
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true}})
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	stateArg := func(want string) func() error {
		return func() error {
			args := dep.Spec.Template.Spec.Containers[0].Args
			if !slices.Contains(args, apiOperatorStateFlag+"="+want) {
				return fmt.Errorf("args %q, want %s=%s", strings.Join(args, " "), apiOperatorStateFlag, want)
			}
			return nil
		}
	}
	eventuallyObject(t, "the operator's state settings on the API server", dep, stateArg(`{"history":7}`))
	updateConfig(t, opNS, func(c *terracev1.TerraceConfig) { c.Spec.State.History = ptr(int32(9)) })
	eventuallyObject(t, "the API server following the operator's config", dep, stateArg(`{"history":9}`))
}

// setOperatorConfig makes the operator namespace's config as change says
// for the test: created and deleted again, or, when another test made it,
// borrowed and given its spec back.
func setOperatorConfig(t *testing.T, change func(*terracev1.TerraceConfig)) {
	t.Helper()
	op := &terracev1.TerraceConfig{}
	switch err := env.Client.Get(context.Background(), configKey(opNS), op); {
	case apierrors.IsNotFound(err):
		made := tcfg(opNS, terracev1.TerraceConfigSpec{})
		change(made)
		createConfig(t, opNS, made.Spec)
		t.Cleanup(func() {
			_ = env.Client.Delete(context.Background(), tcfg(opNS, terracev1.TerraceConfigSpec{}))
			eventuallyGone(t, "the operator config", tcfg(opNS, terracev1.TerraceConfigSpec{}))
		})
	case err != nil:
		t.Fatal(err)
	default:
		before := op.Spec.DeepCopy()
		updateConfig(t, opNS, change)
		t.Cleanup(func() { updateConfig(t, opNS, func(c *terracev1.TerraceConfig) { c.Spec = *before }) })
	}
}

// TestOnlyTheOperatorConfigRegistersClusters is the attack of issue 44
// item 3 at the controller: a namespace admin registers a cluster of their
// own in their TerraceConfig. The config is refused (APIServerReady=False,
// APIClustersNotAllowed, Stalled) naming the operator's config, the API
// server still runs but is told only the operator's clusters, and removing
// the namespace's clusters clears the refusal; a change of the operator's
// clusters reaches the server.
func TestOnlyTheOperatorConfigRegistersClusters(t *testing.T) {
	registered := terracev1.APICluster{Name: "second", Server: "https://second.example:6443"}
	setOperatorConfig(t, func(c *terracev1.TerraceConfig) {
		c.Spec.API = &terracev1.APIConfig{Clusters: []terracev1.APICluster{registered}}
	})
	ns := env.Namespace(t)
	createConfig(t, ns, terracev1.TerraceConfigSpec{API: &terracev1.APIConfig{Enabled: true, Clusters: []terracev1.APICluster{
		{Name: "prod", Server: "https://tokens.tenant.example"},
	}}})

	refused := waitForConfig(t, ns, "refused for its clusters", func(c *terracev1.TerraceConfig) bool {
		cond := outcome.Get(c, APIServerReadyCondition)
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == APIClustersNotAllowedReason && stalledWith(APIClustersNotAllowedReason)(c)
	})
	if msg := outcome.Get(refused, APIServerReadyCondition).Message; !strings.Contains(msg, "spec.api.clusters (prod) is refused") || !strings.Contains(msg, opNS+"/default") {
		t.Errorf("APIServerReady message: %s", msg)
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: APIName}}
	clustersArg := func(want string) func() error {
		return func() error {
			args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ")
			if !strings.Contains(args, apiClustersFlag+"="+want+" ") && !strings.HasSuffix(args, apiClustersFlag+"="+want) {
				return fmt.Errorf("args %q, want %s=%s", args, apiClustersFlag, want)
			}
			if strings.Contains(args, "tenant.example") {
				return fmt.Errorf("the namespace's cluster reached the server: %s", args)
			}
			return nil
		}
	}
	eventuallyObject(t, "the API server told the operator's clusters only", dep, clustersArg(`[{"name":"second","server":"https://second.example:6443"}]`))

	updateConfig(t, opNS, func(c *terracev1.TerraceConfig) {
		c.Spec.API.Clusters = append(c.Spec.API.Clusters, terracev1.APICluster{Name: "third", Server: "https://third.example"})
	})
	eventuallyObject(t, "the API server following the operator's clusters", dep,
		clustersArg(`[{"name":"second","server":"https://second.example:6443"},{"name":"third","server":"https://third.example"}]`))

	updateConfig(t, ns, func(c *terracev1.TerraceConfig) { c.Spec.API.Clusters = nil })
	waitForConfig(t, ns, "accepted without clusters", func(c *terracev1.TerraceConfig) bool {
		return outcome.IsTrue(c, APIServerReadyCondition) && !outcome.IsTrue(c, terracev1.StalledCondition)
	})
	if op := outcome.Get(waitForConfig(t, opNS, "reconciled", func(c *terracev1.TerraceConfig) bool { return c.Status.ObservedGeneration == c.Generation }), APIServerReadyCondition); op != nil && op.Reason == APIClustersNotAllowedReason {
		t.Errorf("the operator's own config was refused for its clusters: %s", op.Message)
	}
}
