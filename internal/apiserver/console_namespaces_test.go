package apiserver

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestListAllLooksInEachNamespaceTheCallerMayList: a caller bound by
// RoleBindings in the server's namespace and another, but not a third, and
// who may list neither Stacks cluster-wide nor Namespaces, gets the Stacks
// of both (the other named in the request) and none of the third, with no
// error; WatchAll starts with the same Stacks.
func TestListAllLooksInEachNamespaceTheCallerMayList(t *testing.T) {
	at := newAPITest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other, third := env.Namespace(t), env.Namespace(t)
	user := serviceAccountToken(t, mustClientset(t), at.namespace, "lister", stackRules("get", "list", "watch"))
	cs := mustClientset(t)
	if _, err := cs.RbacV1().Roles(other).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "lister"}, Rules: stackRules("get", "list", "watch")}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(other).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lister"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lister"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "lister", Namespace: at.namespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{at.namespace, other, third} {
		stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s"},
			Spec: terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "m"}}}}
		if err := env.Client.Create(ctx, stack); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{at.namespace, other}
	slices.Sort(want)
	seen := func(items []*apiv1.Installation) []string {
		var got []string
		for _, in := range items {
			got = append(got, in.GetNamespace())
		}
		slices.Sort(got)
		return got
	}

	api := at.grpcClient()
	req := &apiv1.ListAllRequest{Namespaces: []string{other, third}}
	out, err := api.ListAll(ctx, withToken(req, user))
	if err != nil {
		t.Fatal(err)
	}
	if got := seen(out.Msg.GetItems()); !slices.Equal(got, want) {
		t.Fatalf("Stacks of namespaces %v, want %v", got, want)
	}
	if got := out.Msg.GetListedNamespaces(); !slices.Equal(got, want) {
		t.Fatalf("listed namespaces %v, want %v", got, want)
	}
	if note := out.Msg.GetNamespacesNote(); !strings.Contains(note, other) || strings.Contains(note, third) {
		t.Fatalf("note: %q", note)
	}

	// Without the other namespace named, only the server's own is looked in.
	out, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, user))
	if err != nil || !slices.Equal(seen(out.Msg.GetItems()), []string{at.namespace}) {
		t.Fatalf("unnamed: %v %v", out, err)
	}

	stream, err := api.WatchAll(ctx, withToken(req, user))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var first []*apiv1.Installation
	for len(first) < len(want) && stream.Receive() {
		first = append(first, stream.Msg().GetInstallation())
	}
	if got := seen(first); !slices.Equal(got, want) {
		t.Fatalf("watch starts with Stacks of %v, want %v (%v)", got, want, stream.Err())
	}
}
