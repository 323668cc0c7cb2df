package apiserver

import (
	"context"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestCallsNameTheStacksNamespace: a Stack of another namespace, made
// with kubectl (no installation label), is listed, read, suspended and its
// releases read when the request names its namespace and the caller's RBAC
// there allows it, and refused as the Kubernetes API refuses the caller
// otherwise; the calls that manage what Create made refuse it as no
// installation; an empty namespace is the server's own.
func TestCallsNameTheStacksNamespace(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	api := at.grpcClient()
	other := env.Namespace(t)
	plain := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "plain", Labels: map[string]string{"team": "db"}},
		Spec:       terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "m"}}},
	}
	if err := env.Client.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	get := &apiv1.GetRequest{Namespace: other, Name: "plain"}

	// The server's namespace's installer has no right in the other namespace yet.
	_, err := api.Get(ctx, withToken(get, at.admin))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, other)
	bindInstaller(t, at, other, rbacv1.PolicyRule{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: []string{"get", "list", "watch", "patch", "delete"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list"}})

	in, err := api.Get(ctx, withToken(get, at.admin))
	if err != nil || in.Msg.GetNamespace() != other || in.Msg.GetInstallation() || in.Msg.GetValuesSecret() != "" {
		t.Fatalf("get: %v %v", in, err)
	}
	// On the REST paths the namespace is a query parameter.
	var rest struct {
		Namespace    string `json:"namespace"`
		Installation bool   `json:"installation"`
	}
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/plain?namespace="+other, nil, &rest)
	if rest.Namespace != other || rest.Installation {
		t.Fatalf("REST get: %+v", rest)
	}
	// Empty is the server's namespace, where no such Stack is.
	_, err = api.Get(ctx, withToken(&apiv1.GetRequest{Name: "plain"}, at.admin))
	expectCode(t, err, connect.CodeNotFound, reasonNotFound)
	_, err = api.Get(ctx, withToken(&apiv1.GetRequest{Namespace: "Not_A_Namespace", Name: "plain"}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonInvalidInput, "namespace")

	listed, err := api.ListAll(ctx, withToken(&apiv1.ListAllRequest{Namespace: other}, at.admin))
	if err != nil || len(listed.Msg.GetItems()) != 1 || listed.Msg.GetItems()[0].GetName() != "plain" || listed.Msg.GetItems()[0].GetInstallation() {
		t.Fatalf("ListAll of %s: %v %v", other, listed, err)
	}

	if _, err := api.Suspend(ctx, withToken(&apiv1.SuspendRequest{Namespace: other, Name: "plain"}, at.admin)); err != nil {
		t.Fatal(err)
	}
	stack := &terracev1.Stack{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: "plain"}, stack); err != nil || !stack.Spec.Suspend {
		t.Fatalf("after Suspend in %s: suspend %v (%v)", other, stack.Spec.Suspend, err)
	}
	access, err := api.GetAccess(ctx, withToken(&apiv1.GetAccessRequest{Namespace: other, Name: "plain"}, at.admin))
	if err != nil || !access.Msg.GetUpdate() || !access.Msg.GetReadSecrets() {
		t.Fatalf("access in %s: %v %v", other, access, err)
	}
	_, err = api.Suspend(ctx, withToken(&apiv1.SuspendRequest{Namespace: other, Name: "plain"}, at.nobody))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden)

	// Where the other namespace keeps its releases is its TerraceConfig's
	// to say, read as the caller: without the right, refused.
	_, err = api.ListReleases(ctx, withToken(&apiv1.ListReleasesRequest{Namespace: other, Name: "plain"}, at.admin))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, "terraceconfigs")
	// The first reader of a namespace's stores records where its state is
	// kept (the controller does at the first run; none runs here): create.
	bindInstaller(t, at, other, rbacv1.PolicyRule{APIGroups: []string{"terrace.dev"}, Resources: []string{"terraceconfigs"}, Verbs: []string{"get"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}})
	releases, err := api.ListReleases(ctx, withToken(&apiv1.ListReleasesRequest{Namespace: other, Name: "plain"}, at.admin))
	if err != nil || len(releases.Msg.GetItems()) != 0 {
		t.Fatalf("releases in %s: %v %v", other, releases, err)
	}

	// What Create made is managed only for installations.
	_, err = api.Delete(ctx, withToken(&apiv1.DeleteRequest{Namespace: other, Name: "plain"}, at.admin))
	expectCode(t, err, connect.CodeNotFound, reasonNotAnInstallation)
	_, err = api.UpdateValues(ctx, withToken(&apiv1.UpdateValuesRequest{Namespace: other, Name: "plain", Values: &structpb.Struct{}}, at.admin))
	expectCode(t, err, connect.CodeNotFound, reasonNotAnInstallation)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: "plain"}, stack); err != nil || stack.DeletionTimestamp != nil {
		t.Fatalf("the refused Delete deleted the Stack: %v", err)
	}
}

// bindInstaller grants the server namespace's installer ServiceAccount
// rules in namespace ns (a Role and RoleBinding per call).
func bindInstaller(t *testing.T, at *apiTest, ns string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "installer-"}, Rules: rules}
	if err := env.Client.Create(context.Background(), role); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "installer", Namespace: at.namespace}},
	}
	if err := env.Client.Create(context.Background(), binding); err != nil {
		t.Fatal(err)
	}
	for _, rule := range rules {
		for _, resource := range rule.Resources {
			at.waitForInstallerAccess(t, authorizationv1.ResourceAttributes{Namespace: ns, Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: resource}, true)
		}
	}
}
