package stack

import (
	"context"
	"errors"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/ownership"
	"github.com/terrace-dev/terrace/internal/scheme"
	terracesettings "github.com/terrace-dev/terrace/internal/settings"
)

// authorizer answers SubjectAccessReviews from a list of allowed
// "user verb resource[/subresource]/name" grants and records what it was
// asked. The real
// authorizer is exercised by the e2e tests under RBAC.
type authorizer struct {
	allowAll bool
	grants   map[string]bool
	reviews  []authorizationv1.SubjectAccessReviewSpec
}

func (a *authorizer) client(objs ...client.Object) client.Client {
	c := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(objs...).Build()
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			review, ok := obj.(*authorizationv1.SubjectAccessReview)
			if !ok {
				return c.Create(ctx, obj, opts...)
			}
			a.reviews = append(a.reviews, review.Spec)
			ra := review.Spec.ResourceAttributes
			resource := ra.Resource
			if ra.Subresource != "" {
				resource += "/" + ra.Subresource
			}
			review.Status.Allowed = a.allowAll || a.grants[review.Spec.User+" "+ra.Verb+" "+resource+"/"+ra.Name]
			return nil
		},
	})
}

func TestVarsFromIsReadWithTheRunnerServiceAccountsRights(t *testing.T) {
	const token = "s3cret-value"
	readable := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-creds", Namespace: outputsNS}, Data: map[string][]byte{"token": []byte("ok")}}
	forbidden := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db-admin", Namespace: outputsNS}, Data: map[string][]byte{"password": []byte(token)}}
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: outputsNS}, Data: map[string]string{"region": "eu"}}
	auth := &authorizer{grants: map[string]bool{
		"system:serviceaccount:team:deployer get secrets/app-creds":   true,
		"system:serviceaccount:team:deployer get configmaps/settings": true,
	}}
	c := auth.client(readable, forbidden, settings)
	r := &Reconciler{Client: c, APIReader: c}
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: outputsNS, UID: "uid-s"}}
	s := &scope{stack: stack, source: &source{digest: "sha256:src"}, config: terracesettings.Effective{ServiceAccountName: "deployer"}}

	stack.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: "app-creds"}, {Kind: "ConfigMap", Name: "settings"}}
	if err := r.gatherInputs(context.Background(), s); err != nil {
		t.Fatalf("granted objects: %v", err)
	}
	if string(s.inputs.vars["token"]) != `"ok"` || string(s.inputs.vars["region"]) != `"eu"` {
		t.Fatalf("vars: %s", s.inputs.vars)
	}
	review := auth.reviews[0]
	if review.User != "system:serviceaccount:team:deployer" || !strings.Contains(strings.Join(review.Groups, ","), "system:serviceaccounts:team") ||
		review.ResourceAttributes.Namespace != outputsNS || review.ResourceAttributes.Verb != "get" {
		t.Fatalf("review: %+v", review)
	}

	// Denied: the same answer for an existing and a missing object, and
	// optional does not turn a denial into silence.
	for _, ref := range []terracev1.VarsReference{
		{Kind: "Secret", Name: "db-admin"},
		{Kind: "Secret", Name: "does-not-exist"},
		{Kind: "Secret", Name: "db-admin", Optional: true},
		{Kind: "ConfigMap", Name: "settings-of-others"},
	} {
		stack.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: "app-creds"}, ref}
		s.inputs = nil
		err := r.gatherInputs(context.Background(), s)
		var terminal *outcome.TerminalError
		if !errors.As(err, &terminal) || terminal.Reason != VarsSourceForbiddenReason {
			t.Fatalf("%+v: %v", ref, err)
		}
		msg := err.Error()
		for _, want := range []string{"spec.varsFrom[1]", "ServiceAccount deployer", ref.Kind + " team/" + ref.Name, "rolebinding"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%+v: message %q does not say %q", ref, msg, want)
			}
		}
		if strings.Contains(msg, token) || s.inputs != nil {
			t.Fatalf("%+v: a denied value was used: %q", ref, msg)
		}
	}
}

// An installation's values Secret bound by Terrace to this Stack is read
// without a grant; bound to another Stack it is not; not yet bound, the
// Stack waits for the Installations API to bind it.
func TestInstallationValuesBoundToTheStackAreRead(t *testing.T) {
	stack := &terracev1.Stack{
		TypeMeta:   metav1.TypeMeta{APIVersion: terracev1.GroupVersion.String(), Kind: "Stack"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: outputsNS, UID: "uid-web"},
	}
	other := stack.DeepCopy()
	other.Name, other.UID = "other", "uid-other"
	values := func(name string, owner *terracev1.Stack) *corev1.Secret {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: outputsNS}, Data: map[string][]byte{"replicas": []byte("3")}}
		if owner == nil {
			sec.Labels = map[string]string{ownership.LabelManagedBy: ownership.ManagedByTerrace, ownership.LabelComponent: ownership.ComponentValues}
			return sec
		}
		if err := ownership.Claim(sec, owner, ownership.ComponentValues, scheme.New()); err != nil {
			t.Fatal(err)
		}
		return sec
	}
	c := (&authorizer{}).client(values("web-values", stack), values("other-values", other), values("new-values", nil))
	r := &Reconciler{Client: c, APIReader: c}
	gather := func(name string) error {
		stack.Spec.VarsFrom = []terracev1.VarsReference{{Kind: "Secret", Name: name}}
		return r.gatherInputs(context.Background(), &scope{stack: stack, source: &source{}})
	}
	if err := gather("web-values"); err != nil {
		t.Fatalf("own values: %v", err)
	}
	var terminal *outcome.TerminalError
	if err := gather("other-values"); !errors.As(err, &terminal) || terminal.Reason != VarsSourceForbiddenReason {
		t.Fatalf("another installation's values: %v", err)
	}
	var waiting *outcome.WaitingError
	if err := gather("new-values"); !errors.As(err, &waiting) || waiting.Reason != VarsSourcePendingReason {
		t.Fatalf("unbound values: %v", err)
	}
}
