package apiserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// realCreate matches a request that is not a dry run, of kind and operation.
func realCreate(s admissionSeen, kind, operation string) bool {
	return !s.dryRun && s.kind == kind && s.operation == operation
}

// TestAFailedCreateLeavesNoValuesSecret injects a failure at each step of a
// Create, after the dry run has passed where it can, and shows that no
// values Secret (and no Stack reading one) is left behind.
func TestAFailedCreateLeavesNoValuesSecret(t *testing.T) {
	for _, tc := range []struct {
		name string
		// inject arranges the failure; the request is then made by at.admin.
		inject func(t *testing.T, at *apiTest, hook *admissionWebhook)
		req    *apiv1.CreateRequest
		code   connect.Code
		// stackLeft is a Stack the test itself made, which must stay.
		stackLeft bool
		// timeout is the server's RequestTimeout; its default when zero.
		timeout time.Duration
	}{{
		name: "the caller may not create Stacks (RBAC, refused at the dry run)",
		inject: func(t *testing.T, at *apiTest, _ *admissionWebhook) {
			at.setInstallerRules(t, installerRulesWithout("stacks", "create"))
		},
		code: connect.CodePermissionDenied,
	}, {
		name: "RBAC takes the right to create Stacks away between the Secret and the Stack",
		inject: func(t *testing.T, at *apiTest, hook *admissionWebhook) {
			hook.set(func(s admissionSeen) (bool, time.Duration) {
				if realCreate(s, "Secret", "CREATE") {
					at.setInstallerRules(t, installerRulesWithout("stacks", "create"))
				}
				return true, 0
			})
		},
		code: connect.CodePermissionDenied,
	}, {
		name: "the Stack schema refuses the spec (validation, at the dry run)",
		req:  &apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}, Path: "../etc"},
		code: connect.CodeInvalidArgument,
	}, {
		name: "a webhook denies the Stack",
		inject: func(_ *testing.T, _ *apiTest, hook *admissionWebhook) {
			hook.set(func(s admissionSeen) (bool, time.Duration) { return !realCreate(s, "Stack", "CREATE"), 0 })
		},
		code: connect.CodePermissionDenied,
	}, {
		name: "the Stack create outlasts the call's deadline",
		inject: func(_ *testing.T, at *apiTest, hook *admissionWebhook) {
			hook.set(func(s admissionSeen) (bool, time.Duration) {
				if realCreate(s, "Stack", "CREATE") {
					return true, 2 * time.Second
				}
				return true, 0
			})
		},
		code:    connect.CodeDeadlineExceeded,
		timeout: 1500 * time.Millisecond,
	}, {
		name: "the webhook times out (the Kubernetes API server gives up on it)",
		inject: func(_ *testing.T, _ *apiTest, hook *admissionWebhook) {
			hook.set(func(s admissionSeen) (bool, time.Duration) {
				if realCreate(s, "Stack", "CREATE") {
					return true, 10 * time.Second
				}
				return true, 0
			})
		},
		code: connect.CodeInternal,
	}, {
		name: "the Secret cannot be given its ownerReference",
		inject: func(_ *testing.T, _ *apiTest, hook *admissionWebhook) {
			hook.set(func(s admissionSeen) (bool, time.Duration) { return !realCreate(s, "Secret", "UPDATE"), 0 })
		},
		code: connect.CodePermissionDenied,
	}, {
		name: "another Stack of the name appears between the Secret and the Stack",
		inject: func(t *testing.T, at *apiTest, hook *admissionWebhook) {
			hook.set(func(s admissionSeen) (bool, time.Duration) {
				if realCreate(s, "Secret", "CREATE") {
					other := &terracev1.Stack{
						ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "web"},
						Spec:       terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "other"}}},
					}
					if err := env.Client.Create(context.Background(), other); err != nil {
						t.Error(err)
					}
				}
				return true, 0
			})
		},
		code:      connect.CodeAlreadyExists,
		stackLeft: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			at := newAPITestWith(t, func(s *Server) { s.RequestTimeout = tc.timeout })
			hook := startAdmissionWebhook(t, at.namespace)
			if tc.inject != nil {
				tc.inject(t, at, hook)
			}
			req := tc.req
			if req == nil {
				req = &apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}, Values: mustStruct(t, map[string]any{"password": "hunter2"})}
			}
			_, err := at.grpcClient().Create(context.Background(), withToken(req, at.admin))
			var cerr *connect.Error
			if !errors.As(err, &cerr) || cerr.Code() != tc.code {
				t.Fatalf("create: %v, want code %v", err, tc.code)
			}
			// The Kubernetes API server may still be busy with a request
			// the call gave up on: nothing may appear for a while either.
			hook.set(nil)
			consistentlyNoValuesSecret(t, at, 3*time.Second)
			stack := &terracev1.Stack{}
			err = env.Client.Get(context.Background(), client.ObjectKey{Namespace: at.namespace, Name: "web"}, stack)
			switch {
			case tc.stackLeft && err != nil:
				t.Fatalf("the Stack the test made is gone: %v", err)
			case tc.stackLeft && stack.Spec.Source.ProgramRef.Name != "other":
				t.Fatalf("the Stack the test made was replaced: %+v", stack.Spec)
			case !tc.stackLeft && !apierrors.IsNotFound(err):
				t.Fatalf("a Stack is left: %v %+v", err, stack.Spec)
			}
		})
	}
}

// consistentlyNoValuesSecret fails if a values Secret exists at any time within d.
func consistentlyNoValuesSecret(t *testing.T, at *apiTest, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if left := at.valuesSecrets(); len(left) != 0 {
			t.Fatalf("values Secrets left behind: %v", left)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// installerRulesWithout is installerRules less one verb on one resource.
func installerRulesWithout(resource, verb string) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	for _, r := range installerRules {
		r = *r.DeepCopy()
		if r.Resources[0] == resource {
			var verbs []string
			for _, v := range r.Verbs {
				if v != verb {
					verbs = append(verbs, v)
				}
			}
			r.Verbs = verbs
		}
		rules = append(rules, r)
	}
	return rules
}

// setInstallerRules replaces the installer's Role and waits until the
// Kubernetes API server's authorizer has seen the change.
func (at *apiTest) setInstallerRules(t *testing.T, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: at.namespace, Name: "installer"}, role); err != nil {
		t.Error(err)
		return
	}
	role.Rules = rules
	if err := env.Client.Update(ctx, role); err != nil {
		t.Error(err)
		return
	}
	at.waitForInstallerAccess(t, authorizationv1.ResourceAttributes{Namespace: at.namespace, Verb: "create", Group: "terrace.dev", Resource: "stacks"}, false)
}

// waitForInstallerAccess waits until the Kubernetes API server's authorizer,
// which reads RBAC through its own informers, answers allowed for the
// installer: a Role or binding just written is not in force at once.
func (at *apiTest) waitForInstallerAccess(t *testing.T, attributes authorizationv1.ResourceAttributes, allowed bool) {
	t.Helper()
	user := "system:serviceaccount:" + at.namespace + ":installer"
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		review, err := mustClientset(t).AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + at.namespace, "system:authenticated"},
			ResourceAttributes: &attributes,
		}}, metav1.CreateOptions{})
		if err == nil && review.Status.Allowed == allowed {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("the authorizer never answered allowed=%v for the installer: %+v", allowed, attributes)
}
