package stack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// eventLog is the suite's event recorder: it keeps every event by object.
type eventLog struct {
	mu     sync.Mutex
	events map[string][]string // namespace/name → "Type Reason"
}

func (l *eventLog) Eventf(regarding runtime.Object, _ runtime.Object, eventtype, reason, _, _ string, _ ...any) {
	obj, ok := regarding.(client.Object)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == nil {
		l.events = map[string][]string{}
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	l.events[key] = append(l.events[key], eventtype+" "+reason)
}

// reasons lists the event reasons of an object, in order.
func (l *eventLog) reasons(namespace, name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events[namespace+"/"+name] {
		out = append(out, strings.Fields(e)[1])
	}
	return out
}

// Modules the scenarios deploy, served as tarballs over HTTP (spec.source.url).
const (
	dataModule = `
variable "greeting" { type = string }
resource "terraform_data" "greeting" { input = var.greeting }
output "greeting" { value = terraform_data.greeting.output }
`
	failingDestroyModule = `
resource "terraform_data" "guarded" {
  provisioner "local-exec" {
    when    = destroy
    command = "echo refusing to destroy; exit 1"
  }
}
`
	fileModuleForDrift = `
terraform {
  required_providers {
    testfile = {
      source  = "terrace-dev/testfile"
      version = "0.1.0"
    }
  }
}
variable "path" { type = string }
resource "testfile_file" "managed" {
  path    = var.path
  content = "managed by terrace"
}
`
)

// moduleServer serves each module as a tar.gz and returns url and digest.
func moduleServer(t *testing.T, module string) (string, string) {
	t.Helper()
	data, digest, err := artifact.Build(map[string][]byte{"main.tf": []byte(module)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(data) }))
	t.Cleanup(srv.Close)
	return srv.URL + "/module.tar.gz", digest
}

// suiteEnv is one scenario's namespace.
type suiteEnv struct {
	t  *testing.T
	c  client.Client
	ns string
}

func newSuiteEnv(t *testing.T) *suiteEnv {
	t.Helper()
	t.Parallel()
	c := suite.env.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "stack-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return &suiteEnv{t: t, c: c, ns: ns.Name}
}

func (e *suiteEnv) stack(name, module string, vars map[string]string, mutate func(*terracev1.Stack)) *terracev1.Stack {
	e.t.Helper()
	url, digest := moduleServer(e.t, module)
	st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: terracev1.StackSpec{
		Source:        terracev1.StackSource{URL: url, Digest: digest},
		Vars:          map[string]apiextensionsv1.JSON{},
		RetryInterval: &metav1.Duration{Duration: time.Second},
	}}
	for k, v := range vars {
		st.Spec.Vars[k] = apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf("%q", v))}
	}
	if mutate != nil {
		mutate(st)
	}
	if err := e.c.Create(context.Background(), st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// waitFor polls the Stack until check passes, failing after timeout with
// the last status.
func (e *suiteEnv) waitFor(name, what string, check func(*terracev1.Stack) bool) *terracev1.Stack {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	st := &terracev1.Stack{}
	for {
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, st)
		if err == nil && check(st) {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Stack %s/%s never became %s; conditions %s; events %v", e.ns, name, what, conditionsText(st), suite.events.reasons(e.ns, name))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (e *suiteEnv) update(name string, mutate func(*terracev1.Stack)) {
	e.t.Helper()
	for {
		st := &terracev1.Stack{}
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, st); err != nil {
			e.t.Fatal(err)
		}
		mutate(st)
		err := e.c.Update(context.Background(), st)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			e.t.Fatal(err)
		}
	}
}

// grantSecretReads lets a ServiceAccount of the namespace get its Secrets.
func (e *suiteEnv) grantSecretReads(serviceAccount string) {
	e.t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "read-secrets", Namespace: e.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "read-secrets", Namespace: e.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-secrets"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccount, Namespace: e.ns}}}
	for _, obj := range []client.Object{role, binding} {
		if err := e.c.Create(ctx, obj); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *suiteEnv) request(name string) {
	e.update(name, func(st *terracev1.Stack) {
		if st.Annotations == nil {
			st.Annotations = map[string]string{}
		}
		st.Annotations[terracev1.ReconcileRequestAnnotation] = time.Now().Format(time.RFC3339Nano)
	})
}

// expectEvents checks that the Stack's events hold want in this order
// (others may come between).
func (e *suiteEnv) expectEvents(name string, want ...string) {
	e.t.Helper()
	got := suite.events.reasons(e.ns, name)
	i := 0
	for _, r := range got {
		if i < len(want) && r == want[i] {
			i++
		}
	}
	if i < len(want) {
		e.t.Errorf("events %v do not hold %v in order", got, want)
	}
}

func is(cond, status, reason string) func(*terracev1.Stack) bool {
	return func(st *terracev1.Stack) bool {
		c := outcome.Get(st, cond)
		return c != nil && string(c.Status) == status && c.Reason == reason && c.ObservedGeneration == st.Generation
	}
}

func readyAt(st *terracev1.Stack) bool {
	return is(terracev1.ReadyCondition, "True", AppliedReason)(st) && st.Status.ObservedGeneration == st.Generation
}

func conditionsText(st *terracev1.Stack) string {
	var parts []string
	for _, c := range st.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s/%s %q", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}
