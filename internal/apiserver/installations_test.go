package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
)

const goodDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func validCreate(name string) map[string]any {
	return map[string]any{
		"name":   name,
		"source": map[string]string{"programRef": "web-module"},
		"values": map[string]any{"replicas": 3, "password": "hunter2", "tags": []string{"a", "b"}},
	}
}

func mustClientset(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func stackRules(verbs ...string) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{APIGroups: []string{"terrace.dev"}, Resources: []string{"stacks"}, Verbs: verbs}}
}

func (at *apiTest) stack(name string) *terracev1.Stack {
	at.t.Helper()
	stack := &terracev1.Stack{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: at.namespace, Name: name}, stack); err != nil {
		at.t.Fatal(err)
	}
	return stack
}

func (at *apiTest) secret(name string) *corev1.Secret {
	at.t.Helper()
	secret := &corev1.Secret{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: at.namespace, Name: name}, secret); err != nil {
		at.t.Fatal(err)
	}
	return secret
}

// valuesSecret reads the Secret the installation's Stack reads its values from.
func (at *apiTest) valuesSecret(installation string) *corev1.Secret {
	at.t.Helper()
	stack := at.stack(installation)
	if len(stack.Spec.VarsFrom) != 1 || stack.Spec.VarsFrom[0].Kind != "Secret" {
		at.t.Fatalf("Stack %s varsFrom: %+v", installation, stack.Spec.VarsFrom)
	}
	return at.secret(stack.Spec.VarsFrom[0].Name)
}

// valuesSecrets lists the Secrets of the namespace that hold an installation's values.
func (at *apiTest) valuesSecrets() []string {
	at.t.Helper()
	list := &corev1.SecretList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(at.namespace)); err != nil {
		at.t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		if s.Labels[InstallationLabel] == "true" || strings.Contains(s.Name, "-values") {
			names = append(names, s.Name)
		}
	}
	return names
}

func TestCreateMakesAStackReadingAValuesSecret(t *testing.T) {
	at := newAPITest(t)
	var created Installation
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), &created)
	if created.Name != "web" || created.Source.ProgramRef != "web-module" || created.Ready {
		t.Fatalf("created: %+v", created)
	}

	stack := at.stack("web")
	if stack.Labels[InstallationLabel] != "true" {
		t.Fatalf("labels: %v", stack.Labels)
	}
	// The values Secret's name is generated: it can meet no Secret made by someone else.
	if len(stack.Spec.VarsFrom) != 1 || !strings.HasPrefix(stack.Spec.VarsFrom[0].Name, "web-values-") || stack.Spec.VarsFrom[0].Kind != "Secret" {
		t.Fatalf("varsFrom: %+v", stack.Spec.VarsFrom)
	}
	if stack.Spec.WriteOutputsToSecret == nil || stack.Spec.WriteOutputsToSecret.Name != "web-outputs" {
		t.Fatalf("writeOutputsToSecret: %+v", stack.Spec.WriteOutputsToSecret)
	}
	if stack.Spec.Source.ProgramRef == nil || stack.Spec.Source.ProgramRef.Name != "web-module" || stack.Spec.ApprovePlan != "" {
		t.Fatalf("spec: %+v", stack.Spec)
	}
	raw, _ := json.Marshal(stack)
	if strings.Contains(string(raw), "hunter2") || len(stack.Spec.Vars) != 0 {
		t.Fatalf("a value is in the Stack: %s", raw)
	}

	secret := at.valuesSecret("web")
	if string(secret.Data["replicas"]) != "3" || string(secret.Data["password"]) != `"hunter2"` || string(secret.Data["tags"]) != `["a","b"]` {
		t.Fatalf("values Secret: %q", secret.Data)
	}
	owners := secret.OwnerReferences
	if len(owners) != 1 || owners[0].Kind != "Stack" || owners[0].Name != "web" || owners[0].UID != stack.UID {
		t.Fatalf("the values Secret is not owned by the Stack: %+v", owners)
	}

	at.expectError(http.StatusConflict, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), "Stack web already exists")

	byURL := map[string]any{"name": "db", "source": map[string]string{"url": "https://example.com/db.tar.gz", "digest": goodDigest}, "approvePlan": "auto", "path": "modules/db"}
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", byURL, nil)
	db := at.stack("db")
	if db.Spec.Source.URL != "https://example.com/db.tar.gz" || db.Spec.Source.Digest != goodDigest || db.Spec.ApprovePlan != "auto" || db.Spec.Path != "modules/db" {
		t.Fatalf("db spec: %+v", db.Spec)
	}
	if len(at.valuesSecret("db").Data) != 0 {
		t.Fatal("an installation without values has values")
	}

	log := at.log.String()
	if !strings.Contains(log, `"procedure":"/terrace.api.v1.InstallationService/Create"`) || !strings.Contains(log, `"code":"ok"`) ||
		!strings.Contains(log, `"user":"system:serviceaccount:`+at.namespace+`:installer"`) {
		t.Fatalf("the request is not logged:\n%s", log)
	}
	if strings.Contains(log, "hunter2") || strings.Contains(log, at.admin) {
		t.Fatalf("a value or a token was logged:\n%s", log)
	}
}

func TestCreateRefusesBadInputWithAClearMessage(t *testing.T) {
	at := newAPITest(t)
	bad := func(mutate func(map[string]any), parts ...string) {
		t.Helper()
		body := validCreate("web")
		mutate(body)
		at.expectError(http.StatusBadRequest, at.admin, http.MethodPost, "/v1/installations", body, parts...)
	}
	bad(func(b map[string]any) { b["name"] = "Web_1" }, `name "Web_1" is not valid`)
	bad(func(b map[string]any) { delete(b, "name") }, "name is required")
	bad(func(b map[string]any) {
		b["source"] = map[string]string{"programRef": "m", "url": "https://x/y.tgz", "digest": goodDigest}
	}, "exactly one of programRef")
	bad(func(b map[string]any) { b["source"] = map[string]string{} }, "exactly one of programRef")
	bad(func(b map[string]any) {
		b["source"] = map[string]string{"url": "https://x/y.tgz", "digest": "sha256:abc"}
	}, "source.digest must be sha256:")
	bad(func(b map[string]any) { b["source"] = map[string]string{"url": "ftp://x/y.tgz", "digest": goodDigest} }, "must start with https://")
	bad(func(b map[string]any) { b["values"] = map[string]any{"1bad": 1} }, `"1bad" is not a variable name`)
	bad(func(b map[string]any) { b["values"] = []int{1} }, "unexpected token [")
	bad(func(b map[string]any) { b["approvePlan"] = "plan-1-a" }, "approvePlan may be")
	bad(func(b map[string]any) { b["extra"] = true }, `unknown field "extra"`)
	// The Stack schema is the API server's: its message comes back.
	bad(func(b map[string]any) { b["path"] = "../etc" }, "path must be relative")

	if left := at.valuesSecrets(); len(left) != 0 {
		t.Fatalf("a refused create left values Secrets behind: %v", left)
	}
}

func TestListAndGetShowOnlyInstallations(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)
	plain := &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "plain"},
		Spec:       terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "m"}}},
	}
	if err := env.Client.Create(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	web := at.stack("web")
	web.Status.ObservedGeneration = web.Generation
	web.Status.LastAppliedRevision = "main@sha1:abc"
	web.Status.Outputs = []string{"url"}
	web.Status.Release = &terracev1.ReleaseStatus{Revision: 2, Status: "deployed"}
	web.Status.Conditions = []metav1.Condition{{Type: terracev1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Applied", Message: "applied main@sha1:abc (release 2)", LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(context.Background(), web); err != nil {
		t.Fatal(err)
	}

	var list InstallationList
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations", nil, &list)
	if len(list.Items) != 1 || list.Items[0].Name != "web" {
		t.Fatalf("list: %+v", list)
	}
	got := list.Items[0]
	if !got.Ready || got.Status != "True" || got.Message != "applied main@sha1:abc (release 2)" || got.Revision != "main@sha1:abc" ||
		got.Release != 2 || len(got.Outputs) != 1 || len(got.Conditions) != 1 {
		t.Fatalf("installation: %+v", got)
	}
	var one Installation
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web", nil, &one)
	if one.Name != "web" || !one.Ready {
		t.Fatalf("get: %+v", one)
	}
	// Another Stack is read (the console opens every Stack), marked as no
	// installation, but not listed here, and not deleted through the API.
	var shown struct {
		Name         string `json:"name"`
		Installation bool   `json:"installation"`
		Phase        string `json:"phase"`
	}
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/plain", nil, &shown)
	if shown.Name != "plain" || shown.Installation || shown.Phase == "" {
		t.Fatalf("get of a Stack made without the API: %+v", shown)
	}
	at.expectError(http.StatusNotFound, at.admin, http.MethodDelete, "/v1/installations/plain", nil, "is not an installation")
	at.expectError(http.StatusNotFound, at.admin, http.MethodGet, "/v1/installations/gone", nil, "Stack gone in namespace "+at.namespace+" not found")
	at.expectError(http.StatusBadRequest, at.admin, http.MethodGet, "/v1/installations/Bad_Name", nil, "is not valid")
}

// setPending gives the Stack a pending plan as the controller would.
func (at *apiTest) setPending(name, planID string) {
	at.t.Helper()
	stack := at.stack(name)
	created := metav1.NewTime(time.Now().Truncate(time.Second))
	stack.Status.ObservedGeneration = stack.Generation
	stack.Status.Plan = &terracev1.PlanStatus{ID: planID, Pending: planID, Add: 2, Change: 1, CreatedAt: &created}
	stack.Status.LastPlannedRevision = "main@sha1:def"
	stack.Status.Conditions = []metav1.Condition{{Type: terracev1.ReadyCondition, Status: metav1.ConditionFalse, Reason: "AwaitingApproval", Message: "plan " + planID + " awaits approval", LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(context.Background(), stack); err != nil {
		at.t.Fatal(err)
	}
}

func TestPlanAndApprove(t *testing.T) {
	at := newAPITest(t)
	body := validCreate("web")
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", body, nil)

	at.expectError(http.StatusNotFound, at.admin, http.MethodGet, "/v1/installations/web/plan", nil, "no plan is pending for Stack "+at.namespace+"/web: it has not been reconciled yet")
	at.expectError(http.StatusConflict, at.admin, http.MethodPost, "/v1/installations/web/approve", map[string]string{"planId": "plan-1-a"}, "no plan is pending")

	at.setPending("web", "plan-7-abc")
	var plan Plan
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web/plan", nil, &plan)
	if plan.ID != "plan-7-abc" || !plan.Approvable || plan.Add != 2 || plan.Change != 1 || plan.Revision != "main@sha1:def" || !strings.Contains(plan.Note, "no readable plan is stored") {
		t.Fatalf("plan: %+v", plan)
	}

	// With a readable rendering stored in the namespace's plan store.
	stack := at.stack("web")
	stack.Spec.StoreReadablePlan = terracev1.ReadablePlanHuman
	if err := env.Client.Update(context.Background(), stack); err != nil {
		t.Fatal(err)
	}
	at.setPending("web", "plan-7-abc")
	_, err := secrets.New(env.Client, secrets.Options{}).PutPlan(context.Background(), state.Plan{
		PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: at.namespace, Stack: "web", ID: "plan-7-abc"}, ReadableFormat: state.ReadableHuman,
			Policy: &state.PlanPolicy{Decision: "allowed", Warnings: []string{"terraform_data.web: discouraged"}, PoliciesDigest: "sha256:2d"}},
		Binary: []byte("saved plan"), Readable: []byte("+ resource \"terraform_data\" \"web\" {}\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	plan = Plan{}
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web/plan", nil, &plan)
	if plan.Readable != "+ resource \"terraform_data\" \"web\" {}\n" || plan.ReadableFormat != "human" || plan.Note != "" {
		t.Fatalf("readable plan: %+v", plan)
	}
	// The decision stored with the plan is shown with it.
	if d := plan.Policy; d == nil || d.Decision != "allowed" || d.PoliciesDigest != "sha256:2d" || len(d.Warnings) != 1 {
		t.Fatalf("plan policy: %+v", plan.Policy)
	}

	at.expectError(http.StatusBadRequest, at.admin, http.MethodPost, "/v1/installations/web/approve", map[string]string{}, `{"planId"`)
	at.expectError(http.StatusConflict, at.admin, http.MethodPost, "/v1/installations/web/approve", map[string]string{"planId": "plan-6-old"},
		"plan plan-6-old is not the pending plan of Stack "+at.namespace+"/web: plan-7-abc is (+2 ~1 -0)")
	if got := at.stack("web").Spec.ApprovePlan; got != "" {
		t.Fatalf("a wrong id set approvePlan to %q", got)
	}
	var approved Installation
	at.expect(http.StatusOK, at.admin, http.MethodPost, "/v1/installations/web/approve", map[string]string{"planId": "plan-7-abc"}, &approved)
	if got := at.stack("web").Spec.ApprovePlan; got != "plan-7-abc" || approved.ApprovePlan != "plan-7-abc" {
		t.Fatalf("approvePlan: Stack %q, answer %q", got, approved.ApprovePlan)
	}
}

func TestValuesAreReplaced(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)
	before := at.valuesSecret("web").ResourceVersion

	at.expect(http.StatusOK, at.admin, http.MethodPut, "/v1/installations/web/values", map[string]any{"values": map[string]any{"replicas": 5, "region": "eu"}}, nil)
	secret := at.valuesSecret("web")
	if len(secret.Data) != 2 || string(secret.Data["replicas"]) != "5" || string(secret.Data["region"]) != `"eu"` || secret.ResourceVersion == before {
		t.Fatalf("values after PUT: %q", secret.Data)
	}
	at.expectError(http.StatusBadRequest, at.admin, http.MethodPut, "/v1/installations/web/values", map[string]any{"replicas": 5}, `unknown field "replicas"`)
	at.expectError(http.StatusNotFound, at.admin, http.MethodPut, "/v1/installations/gone/values", map[string]any{"values": map[string]any{}}, "not found")

	// A deleted values Secret is made again, owned by the Stack.
	if err := env.Client.Delete(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	at.expect(http.StatusOK, at.admin, http.MethodPut, "/v1/installations/web/values", map[string]any{"values": map[string]any{"replicas": 1}}, nil)
	secret = at.valuesSecret("web")
	if string(secret.Data["replicas"]) != "1" || len(secret.OwnerReferences) != 1 {
		t.Fatalf("recreated values Secret: %q %+v", secret.Data, secret.OwnerReferences)
	}
}

func TestReleasesAndOutputs(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)

	var releases ReleaseList
	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web/releases", nil, &releases)
	if len(releases.Items) != 0 {
		t.Fatalf("releases before any apply: %+v", releases)
	}
	at.expectError(http.StatusNotFound, at.admin, http.MethodGet, "/v1/installations/web/outputs", nil, "Secret web-outputs, which does not exist yet")

	h := release.History{Store: secrets.New(env.Client, secrets.Options{})}
	start := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for i, rev := range []string{"main@sha1:aaa", "main@sha1:bbb"} {
		_, err := h.Record(context.Background(), release.Release{
			Namespace: at.namespace, Stack: "web", Status: release.StatusDeployed, SourceRevision: rev, PlanID: "plan-x",
			Outputs:   []release.Output{{Name: "url", Value: json.RawMessage(`"https://web.example"`)}, {Name: "password", Sensitive: true}},
			StartedAt: start.Add(time.Duration(i) * time.Hour), FinishedAt: start.Add(time.Duration(i)*time.Hour + time.Minute),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	outputs := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "web-outputs"},
		Data:       map[string][]byte{"url": []byte("https://web.example"), "password": []byte("hunter2"), "unknown": []byte("s3cr3t")},
	}
	if err := env.Client.Create(context.Background(), outputs); err != nil {
		t.Fatal(err)
	}

	at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web/releases", nil, &releases)
	if len(releases.Items) != 2 || releases.Items[0].Status != release.StatusSuperseded || releases.Items[1].SourceRevision != "main@sha1:bbb" || releases.Items[1].Status != release.StatusDeployed {
		t.Fatalf("releases: %+v", releases)
	}

	var shown Outputs
	raw := at.expect(http.StatusOK, at.admin, http.MethodGet, "/v1/installations/web/outputs", nil, &shown)
	if strings.Contains(string(raw), "hunter2") || strings.Contains(string(raw), "s3cr3t") {
		t.Fatalf("a sensitive value was returned: %s", raw)
	}
	if len(shown.Items) != 3 || shown.Items[0].Name != "password" || !shown.Items[0].Masked || !shown.Items[1].Masked ||
		shown.Items[2].Value == nil || *shown.Items[2].Value != "https://web.example" {
		t.Fatalf("outputs: %s", raw)
	}
}

func TestDeleteRemovesTheStack(t *testing.T) {
	at := newAPITest(t)
	at.expect(http.StatusCreated, at.admin, http.MethodPost, "/v1/installations", validCreate("web"), nil)
	var deleted Installation
	at.expect(http.StatusAccepted, at.admin, http.MethodDelete, "/v1/installations/web", nil, &deleted)
	if !deleted.Deleting {
		t.Fatalf("delete: %+v", deleted)
	}
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: at.namespace, Name: "web"}, &terracev1.Stack{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the Stack is still there: %v", err)
	}
	at.expectError(http.StatusNotFound, at.admin, http.MethodDelete, "/v1/installations/web", nil, "not found")
}
