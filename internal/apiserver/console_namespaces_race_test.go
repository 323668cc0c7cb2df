package apiserver

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// TestRightsGrantedDuringAListAreTheAnswer checks the step where a caller's
// rights grow while ListAll looks namespace by namespace (a RoleBinding
// just made, not yet seen by the first look): the second look's Stacks are
// the answer, not an internal error.
func TestRightsGrantedDuringAListAreTheAnswer(t *testing.T) {
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"}}
	looks := 0
	caller := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(stack).WithInterceptorFuncs(interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*corev1.NamespaceList); ok {
				return apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "", nil)
			}
			if looks++; looks == 1 {
				return apierrors.NewForbidden(schema.GroupResource{Group: "terrace.dev", Resource: "stacks"}, "", nil)
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	s := &site{Namespace: "team", Caller: caller}
	scope := &listScope{stacks: &terracev1.StackList{}}
	if err := s.listEachNamespace(context.Background(), scope, nil); err != nil {
		t.Fatalf("listing while the caller's rights grew: %v", err)
	}
	if len(scope.stacks.Items) != 1 || scope.stacks.Items[0].Name != "web" || len(scope.listed) != 1 || scope.listed[0] != "team" {
		t.Fatalf("listed %v in %v, want Stack web in team", scope.stacks.Items, scope.listed)
	}
}
