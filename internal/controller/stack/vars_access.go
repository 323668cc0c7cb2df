package stack

import (
	"context"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/ownership"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
	"github.com/terrace-dev/terrace/internal/settings"
)

// Condition reasons about who may read varsFrom objects.
const (
	// VarsSourceForbiddenReason: the Stack's runner ServiceAccount may not
	// get a varsFrom object, so Terrace does not read it for the Stack.
	VarsSourceForbiddenReason = "VarsSourceForbidden"
	// VarsSourcePendingReason: an installation's values Secret is not yet
	// bound to its Stack; the Installations API binds it right after
	// creating the Stack.
	VarsSourcePendingReason = "VarsSourcePending"
)

// valuesBindingRecheck is how soon a Stack waiting for its values Secret
// to be bound looks again: the API binds it within its create request.
const valuesBindingRecheck = 2 * time.Second

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create,roleName=terrace-controller-cluster

// checkVarsAccess lets the controller read a varsFrom object for a Stack
// only when the Stack's runner ServiceAccount may get it itself: a Stack
// author gets no Secret their namespace's RBAC did not already give the
// account their module runs as. The check is a SubjectAccessReview, asked
// before every read (reconciles are minutes apart, so a cache would only
// delay a revoked grant).
//
// The one exception is an installation's values Secret that Terrace bound
// to this very Stack (ownership.ComponentValues, controller reference to the
// Stack's UID): whoever created the installation was authorized to write it.
// That Secret, read for the check, is returned so it is not read twice.
func (r *Reconciler) checkVarsAccess(ctx context.Context, s *scope, i int, ref terracev1.VarsReference) (*corev1.Secret, error) {
	ns, sa := s.stack.Namespace, runnerServiceAccount(s)
	allowed, err := r.serviceAccountMayGet(ctx, sa, ref.Kind, types.NamespacedName{Namespace: ns, Name: ref.Name})
	if err != nil || allowed {
		return nil, err
	}
	if ref.Kind == "Secret" {
		sec := &corev1.Secret{}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, sec)
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("failed to read spec.varsFrom[%d] Secret %s: %w", i, ref.Name, err)
		case err == nil && ownership.Owns(sec, s.stack, ownership.ComponentValues):
			return sec, nil
		case err == nil && ownership.Marked(sec, ownership.ComponentValues) && metav1.GetControllerOfNoCopy(sec) == nil:
			return nil, outcome.Waiting(VarsSourcePendingReason, valuesBindingRecheck,
				fmt.Errorf("spec.varsFrom[%d]: values Secret %s is not bound to a Stack yet; if this lasts, create the installation again", i, ref.Name))
		}
	}
	// The same answer whether or not the object exists: a Stack author
	// learns nothing about objects the ServiceAccount may not read.
	resource := strings.ToLower(ref.Kind) + "s"
	return nil, outcome.Terminalf(VarsSourceForbiddenReason,
		"spec.varsFrom[%d]: ServiceAccount %s, which the Stack's runner runs as, may not get %s %s/%s, so Terrace does not read it: "+
			"grant it with a Role and RoleBinding (kubectl -n %s create role read-%s --verb=get --resource=%s --resource-name=%s; "+
			"kubectl -n %s create rolebinding read-%s --role=read-%s --serviceaccount=%s:%s) or name an object it may read",
		i, sa, ref.Kind, ns, ref.Name,
		ns, ref.Name, resource, ref.Name,
		ns, ref.Name, ref.Name, ns, sa)
}

// runnerServiceAccount is the ServiceAccount the Stack's runner pods run as.
func runnerServiceAccount(s *scope) string {
	if sa := s.config.ServiceAccountName; sa != "" {
		return sa
	}
	return settings.DefaultServiceAccountName
}

// serviceAccountMayGet asks the API server's authorizer whether the
// ServiceAccount may get the object, with the groups its tokens carry.
func (r *Reconciler) serviceAccountMayGet(ctx context.Context, serviceAccount, kind string, obj types.NamespacedName) (bool, error) {
	return r.serviceAccountMay(ctx, serviceAccount, obj.Namespace, runnerpolicy.Access{Verb: "get", Resource: strings.ToLower(kind) + "s", Name: obj.Name})
}

// serviceAccountMay asks the API server's authorizer whether the
// ServiceAccount of namespace may do what a names there, with the groups
// its tokens carry.
func (r *Reconciler) serviceAccountMay(ctx context.Context, serviceAccount, namespace string, a runnerpolicy.Access) (bool, error) {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + namespace + ":" + serviceAccount,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource, Name: a.Name,
		},
	}}
	if err := r.Client.Create(ctx, review); err != nil {
		return false, fmt.Errorf("failed to ask whether ServiceAccount %s may %s %s %s: %w", serviceAccount, a.Verb, a.ResourceName(), a.Name, err)
	}
	return review.Status.Allowed, nil
}
