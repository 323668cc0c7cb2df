package apiserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// admissionSeen is one request the Kubernetes API server sent the webhook.
type admissionSeen struct {
	kind, name, user, operation string
	dryRun                      bool
}

// admissionWebhook is a validating webhook for Stacks and Secrets of one
// namespace, served over TLS on 127.0.0.1: it records who each request is
// made by, as the Kubernetes API server tells it, and lets decide refuse or
// stall a request.
type admissionWebhook struct {
	mu     sync.Mutex
	seen   []admissionSeen
	decide func(admissionSeen) (allow bool, stall time.Duration)
}

// set makes decide answer from now on (nil: allow everything).
func (w *admissionWebhook) set(decide func(admissionSeen) (bool, time.Duration)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.decide = decide
}

func (w *admissionWebhook) requests() []admissionSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

func (w *admissionWebhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	review := &admissionv1.AdmissionReview{}
	if err := json.NewDecoder(r.Body).Decode(review); err != nil || review.Request == nil {
		http.Error(rw, "bad review", http.StatusBadRequest)
		return
	}
	req := review.Request
	seen := admissionSeen{kind: req.Kind.Kind, name: req.Name, user: req.UserInfo.Username, operation: string(req.Operation), dryRun: req.DryRun != nil && *req.DryRun}
	w.mu.Lock()
	w.seen = append(w.seen, seen)
	decide := w.decide
	w.mu.Unlock()
	allow, stall := true, time.Duration(0)
	if decide != nil {
		allow, stall = decide(seen)
	}
	deny := !allow
	if stall > 0 {
		select {
		case <-time.After(stall):
		case <-r.Context().Done():
		}
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: !deny}
	if deny {
		resp.Result = &metav1.Status{Code: http.StatusForbidden, Message: "the test webhook refuses this " + req.Kind.Kind}
	}
	review.Response = resp
	review.Request = nil
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(review)
}

// startAdmissionWebhook registers an admissionWebhook for the namespace and
// waits until the Kubernetes API server calls it.
func startAdmissionWebhook(t *testing.T, ns string) *admissionWebhook {
	t.Helper()
	hook := &admissionWebhook{}
	certFile, keyFile, _ := selfSignedCert(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: hook, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	url := "https://" + ln.Addr().String() + "/validate"
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(3)
	rule := func(group, version, resource string) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version}, Resources: []string{resource}},
		}
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "terrace-api-test-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "record.terrace.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{rule("terrace.dev", "v1alpha1", "stacks"), rule("", "v1", "secrets")},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	ctx := context.Background()
	if err := env.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cfg) })
	// The API server picks a new webhook up after a moment: probe with dry runs.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("probe-%d", i)}}
		_ = env.Client.Create(ctx, probe, client.DryRunAll)
		if slices.ContainsFunc(hook.requests(), func(s admissionSeen) bool { return s.name == probe.Name }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the API server never called the test webhook")
		}
		time.Sleep(100 * time.Millisecond)
	}
	hook.mu.Lock()
	hook.seen = nil
	hook.mu.Unlock()
	return hook
}

// TestTheServerActsAsTheCaller: the Kubernetes API server's own requests
// (as its admission webhooks see them) name the caller, never the API
// server's ServiceAccount; a caller without rights is PERMISSION_DENIED by
// the Kubernetes API itself, and nothing is made.
func TestTheServerActsAsTheCaller(t *testing.T) {
	at := newAPITest(t)
	hook := startAdmissionWebhook(t, at.namespace)
	ctx := context.Background()
	grpc := at.grpcClient()

	if _, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
		t.Fatal(err)
	}
	if _, err := grpc.Delete(ctx, withToken(&apiv1.DeleteRequest{Name: "web"}, at.admin)); err != nil {
		t.Fatal(err)
	}
	installer := "system:serviceaccount:" + at.namespace + ":installer"
	seen := hook.requests()
	for _, want := range []admissionSeen{
		{kind: "Stack", operation: "CREATE", dryRun: true}, // the dry run before anything is made
		{kind: "Secret", operation: "CREATE"},
		{kind: "Stack", operation: "CREATE"},
		{kind: "Secret", operation: "UPDATE"}, // the ownerReference
		{kind: "Stack", operation: "DELETE"},
	} {
		if !slices.ContainsFunc(seen, func(s admissionSeen) bool {
			return s.kind == want.kind && s.operation == want.operation && s.dryRun == want.dryRun && s.user == installer
		}) {
			t.Fatalf("no %s %s (dry run %v) made by %s; the API server saw %+v", want.operation, want.kind, want.dryRun, installer, seen)
		}
	}
	for _, s := range seen {
		if s.user != installer && !strings.HasPrefix(s.user, "system:serviceaccount:kube-system:") && s.user != "system:apiserver" {
			t.Fatalf("a request was made as %s, not the caller: %+v", s.user, seen)
		}
	}

	before := len(hook.requests())
	_, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "db", Source: &apiv1.Source{ProgramRef: "m"}}, at.nobody))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, `User "system:serviceaccount:`+at.namespace+`:nobody" cannot create resource "stacks"`)
	if after := hook.requests(); len(after) != before {
		t.Fatalf("a refused caller's create reached admission: %+v", after[before:])
	}
}

// TestTheAPIServersOwnRights: the API server's ServiceAccount, bound as the
// controller binds it, may read its namespace's TerraceConfig and the
// cluster default, and nothing of Stacks, Secrets or the cluster.
func TestTheAPIServersOwnRights(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	own, err := kubernetes.NewForConfig(at.serverConfig)
	if err != nil {
		t.Fatal(err)
	}
	rulesOf := func(cs kubernetes.Interface) []string {
		t.Helper()
		review, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{
			Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: at.namespace},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var rules []string
		for _, r := range review.Status.ResourceRules {
			rule := fmt.Sprintf("%v %v %v %v", r.Verbs, r.APIGroups, r.Resources, r.ResourceNames)
			if !slices.Contains(rules, rule) {
				rules = append(rules, rule)
			}
		}
		return rules
	}
	// What every authenticated user may do (review itself, ...) is what a
	// ServiceAccount with no bindings has; the API server has one rule more.
	nobodyConfig := rest.AnonymousClientConfig(env.Config)
	nobodyConfig.BearerToken = at.nobody
	nobody, err := kubernetes.NewForConfig(nobodyConfig)
	if err != nil {
		t.Fatal(err)
	}
	everyone := rulesOf(nobody)
	all := rulesOf(own)
	t.Logf("effective rules of the API server in its namespace: %v", all)
	var extra []string
	for _, rule := range all {
		if !slices.Contains(everyone, rule) {
			extra = append(extra, rule)
		}
	}
	if want := []string{"[get] [terrace.dev] [terraceconfigs] [default]"}; !slices.Equal(extra, want) {
		t.Fatalf("the API server's own rules in its namespace are %v, want only %v", extra, want)
	}

	user := "system:serviceaccount:" + at.namespace + ":terrace-api"
	may := func(ns, verb, group, resource, name string) bool {
		t.Helper()
		review, err := mustClientset(t).AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + at.namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource, Name: name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return review.Status.Allowed
	}
	for _, c := range []struct {
		ns, verb, group, resource, name string
		allowed                         bool
	}{
		{at.namespace, "get", "terrace.dev", "terraceconfigs", "default", true},
		// The operator's config reaches it as a flag (--operator-state): no right there.
		{"terrace-system", "get", "terrace.dev", "terraceconfigs", "default", false},
		{"", "get", "terrace.dev", "terraceconfigs", "default", false},
		{"", "list", "terrace.dev", "terraceconfigs", "", false},
		{"terrace-system", "get", "", "secrets", "", false},
		{at.namespace, "list", "terrace.dev", "terraceconfigs", "", false},
		{at.namespace, "get", "", "secrets", "web-values", false},
		{at.namespace, "list", "", "secrets", "", false},
		{at.namespace, "create", "", "secrets", "", false},
		{at.namespace, "get", "terrace.dev", "stacks", "web", false},
		{at.namespace, "create", "terrace.dev", "stacks", "", false},
		{"", "list", "", "secrets", "", false},
		{"", "create", "authentication.k8s.io", "tokenreviews", "", false},
		{"", "create", "authorization.k8s.io", "subjectaccessreviews", "", false},
		{"", "impersonate", "", "users", "", false},
		{"", "impersonate", "", "serviceaccounts", "", false},
	} {
		if got := may(c.ns, c.verb, c.group, c.resource, c.name); got != c.allowed {
			t.Errorf("the API server may %s %s.%s %q in %q: %v, want %v", c.verb, c.resource, c.group, c.name, c.ns, got, c.allowed)
		}
	}
}
