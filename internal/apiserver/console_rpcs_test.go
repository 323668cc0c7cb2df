package apiserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// TestConsoleActionsActAsTheCaller: Suspend, Resume and Reconcile change
// the Stack for a caller who may, and are refused, changing nothing, for
// one who may not; GetAccess says which.
func TestConsoleActionsActAsTheCaller(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	api := at.grpcClient()
	if _, err := api.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "web-module"}}, at.admin)); err != nil {
		t.Fatal(err)
	}

	in, err := api.Suspend(ctx, withToken(&apiv1.SuspendRequest{Name: "web"}, at.admin))
	if err != nil || !in.Msg.GetSuspended() || !at.stack("web").Spec.Suspend {
		t.Fatalf("suspend: %v %v", in, err)
	}
	if _, err := api.Resume(ctx, withToken(&apiv1.ResumeRequest{Name: "web"}, at.admin)); err != nil || at.stack("web").Spec.Suspend {
		t.Fatalf("resume: %v, suspend %v", err, at.stack("web").Spec.Suspend)
	}
	if _, err := api.Reconcile(ctx, withToken(&apiv1.ReconcileRequest{Name: "web"}, at.admin)); err != nil {
		t.Fatal(err)
	}
	requested := at.stack("web").Annotations[terracev1.ReconcileRequestAnnotation]
	if requested == "" {
		t.Fatal("reconcile set no terrace.dev/requestedAt")
	}

	_, err = api.Suspend(ctx, withToken(&apiv1.SuspendRequest{Name: "web"}, at.nobody))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, "forbidden")
	_, err = api.Reconcile(ctx, withToken(&apiv1.ReconcileRequest{Name: "web"}, at.nobody))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden)
	if s := at.stack("web"); s.Spec.Suspend || s.Annotations[terracev1.ReconcileRequestAnnotation] != requested {
		t.Fatalf("a refused call changed the Stack: suspend %v, requestedAt %q", s.Spec.Suspend, s.Annotations[terracev1.ReconcileRequestAnnotation])
	}
	_, err = api.Suspend(ctx, withToken(&apiv1.SuspendRequest{Name: "nope"}, at.admin))
	expectCode(t, err, connect.CodeNotFound, reasonNotFound)

	access, err := api.GetAccess(ctx, withToken(&apiv1.GetAccessRequest{Name: "web"}, at.admin))
	if err != nil || !access.Msg.GetUpdate() || !access.Msg.GetReadSecrets() || access.Msg.GetReadLogs() {
		t.Fatalf("admin access: %v %v", access, err)
	}
	access, err = api.GetAccess(ctx, withToken(&apiv1.GetAccessRequest{Name: "web"}, at.nobody))
	if err != nil || access.Msg.GetUpdate() || access.Msg.GetDelete() || access.Msg.GetReadSecrets() {
		t.Fatalf("nobody's access: %v %v", access, err)
	}
}

// TestListAllFallsBackToTheCallersNamespace: a caller who may list Stacks
// only here gets this namespace's installations and a note saying why;
// filters by phase and label work, a bad selector is INVALID_ARGUMENT.
func TestListAllFallsBackToTheCallersNamespace(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	api := at.grpcClient()
	for _, name := range []string{"a", "b"} {
		if _, err := api.Create(ctx, withToken(&apiv1.CreateRequest{Name: name, Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
			t.Fatal(err)
		}
	}
	stack := at.stack("b")
	stack.Labels["team"] = "web"
	if err := env.Client.Update(ctx, stack); err != nil {
		t.Fatal(err)
	}
	out, err := api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Msg.GetItems()) != 2 || !strings.Contains(out.Msg.GetNamespacesNote(), at.namespace) || strings.Join(out.Msg.GetNamespaces(), ",") != at.namespace {
		t.Fatalf("list: %v", out.Msg)
	}
	out, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{LabelSelector: "team=web"}, at.admin))
	if err != nil || len(out.Msg.GetItems()) != 1 || out.Msg.GetItems()[0].GetName() != "b" {
		t.Fatalf("by label: %v %v", out, err)
	}
	out, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{Phase: phaseReady}, at.admin))
	if err != nil || len(out.Msg.GetItems()) != 0 {
		t.Fatalf("by phase Ready (none is): %v %v", out, err)
	}
	_, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{LabelSelector: "team in (("}, at.admin))
	expectCode(t, err, connect.CodeInvalidArgument, reasonInvalidInput, "labelSelector")
	_, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, at.nobody))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden)
	_, err = api.ListAll(ctx, withToken(&apiv1.ListAllRequest{}, "not-a-token"))
	expectCode(t, err, connect.CodeUnauthenticated, reasonUnauthenticated, "not accepted")
}

// TestProgramVariablesForTheInstallForm: the declared variables with their
// types, descriptions and defaults, a sensitive default never shown; a
// missing Program is NOT_FOUND and unparsable HCL INVALID_ARGUMENT.
func TestProgramVariablesForTheInstallForm(t *testing.T) {
	at := newAPITest(t)
	ctx := context.Background()
	api := at.grpcClient()
	files := map[string]terracev1.ProgramFile{
		"variables.tf": `
variable "replicas" {
  type        = number
  description = "How many"
  default     = 2
}
variable "tags" { type = list(string) }
variable "password" {
  type      = string
  sensitive = true
  default   = "hunter2"
}`,
		"extra.tf.json":       `{"variable": {"region": {"type": "string", "default": "eu"}}}`,
		"modules/net/main.tf": `variable "inner" {}`,
	}
	program := &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Namespace: at.namespace, Name: "web-module"}, Spec: terracev1.ProgramSpec{Files: files}}
	if err := env.Client.Create(ctx, program); err != nil {
		t.Fatal(err)
	}
	// Reading a Program takes get on programs, which the installer lacks.
	_, err := api.GetProgramVariables(ctx, withToken(&apiv1.GetProgramVariablesRequest{Program: "web-module"}, at.admin))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden, "programs")
	reader := serviceAccountToken(t, mustClientset(t), at.namespace, "program-reader", []rbacv1.PolicyRule{
		{APIGroups: []string{"terrace.dev"}, Resources: []string{"programs"}, Verbs: []string{"get"}},
	})
	out, err := api.GetProgramVariables(ctx, withToken(&apiv1.GetProgramVariablesRequest{Program: "web-module"}, reader))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*apiv1.Variable{}
	for _, v := range out.Msg.GetItems() {
		got[v.GetName()] = v
	}
	if len(got) != 4 || got["inner"] != nil {
		t.Fatalf("variables: %v", out.Msg.GetItems())
	}
	if r := got["replicas"]; r.GetType() != "number" || r.GetDescription() != "How many" || r.GetDefault() != "2" {
		t.Errorf("replicas: %v", r)
	}
	if v := got["tags"]; v.GetType() != "list(string)" || v.Default != nil {
		t.Errorf("tags: %v", v)
	}
	if v := got["tags"]; !v.GetRequired() || got["replicas"].GetRequired() {
		t.Errorf("required: tags %v, replicas %v", v.GetRequired(), got["replicas"].GetRequired())
	}
	if p := got["password"]; !p.GetSensitive() || p.Default != nil || p.GetRequired() {
		t.Errorf("password: %v (its default must not be shown)", p)
	}
	if r := got["region"]; r.GetType() != "string" || r.GetDefault() != `"eu"` {
		t.Errorf("region: %v", r)
	}

	_, err = api.GetProgramVariables(ctx, withToken(&apiv1.GetProgramVariablesRequest{Program: "missing"}, reader))
	expectCode(t, err, connect.CodeNotFound, reasonNotFound)
	program.Spec.Files = map[string]terracev1.ProgramFile{"main.tf": `variable "x" {`}
	if err := env.Client.Update(ctx, program); err != nil {
		t.Fatal(err)
	}
	_, err = api.GetProgramVariables(ctx, withToken(&apiv1.GetProgramVariablesRequest{Program: "web-module"}, reader))
	expectCode(t, err, connect.CodeInvalidArgument, reasonInvalidInput, "main.tf")
}

// TestRunLogSaysWhyThereIsNone: without a run, and once the run's pod is
// gone, the answer is an empty log with a note; a server without a log
// reader says so.
func TestRunLogSaysWhyThereIsNone(t *testing.T) {
	at := newAPITestWith(t, func(s *Server) {
		logs, err := CallerPodLogs(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		s.PodLogs = logs
	})
	ctx := context.Background()
	api := at.grpcClient()
	if _, err := api.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
		t.Fatal(err)
	}
	out, err := api.GetRunLog(ctx, withToken(&apiv1.GetRunLogRequest{Name: "web"}, at.admin))
	if err != nil || out.Msg.GetText() != "" || !strings.Contains(out.Msg.GetNote(), "no run") {
		t.Fatalf("before a run: %v %v", out, err)
	}
	stack := at.stack("web")
	stack.Status.LastRun = "r1" // a finished run: currentRun is cleared
	if err := env.Client.Status().Update(ctx, stack); err != nil {
		t.Fatal(err)
	}
	// The admin may not get pods: the Kubernetes API refuses it, as the caller.
	_, err = api.GetRunLog(ctx, withToken(&apiv1.GetRunLogRequest{Name: "web"}, at.admin))
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden)
	reader := serviceAccountToken(t, mustClientset(t), at.namespace, "log-reader", []rbacv1.PolicyRule{
		stackRules("get")[0], {APIGroups: []string{""}, Resources: []string{"pods", "pods/log"}, Verbs: []string{"get"}},
	})
	out, err = api.GetRunLog(ctx, withToken(&apiv1.GetRunLogRequest{Name: "web"}, reader))
	if err != nil || out.Msg.GetRun() != "r1" || !strings.Contains(out.Msg.GetNote(), "pod is gone") {
		t.Fatalf("after the run: %v %v", out, err)
	}

	plain := newAPITest(t)
	if err := env.Client.Create(ctx, &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: plain.namespace, Name: "web", Labels: map[string]string{InstallationLabel: "true"}},
		Spec: terracev1.StackSpec{Source: terracev1.StackSource{ProgramRef: &terracev1.LocalObjectReference{Name: "m"}}}}); err != nil {
		t.Fatal(err)
	}
	_, err = plain.grpcClient().GetRunLog(ctx, withToken(&apiv1.GetRunLogRequest{Name: "web"}, plain.admin))
	expectCode(t, err, connect.CodeUnavailable, reasonStoreMisconfigured, "terrace logs")
}

// TestWatchAllFollowsTheList: the stream starts with the listed
// installations, then sends new ones, changes, and a removal when one no
// longer matches the label selector; a caller without rights is refused.
func TestWatchAllFollowsTheList(t *testing.T) {
	at := newAPITest(t)
	api := at.grpcClient()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	create := func(name string) {
		t.Helper()
		if _, err := api.Create(ctx, withToken(&apiv1.CreateRequest{Name: name, Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
			t.Fatal(err)
		}
	}
	setTeam := func(name, team string) {
		t.Helper()
		stack := at.stack(name)
		stack.Labels["team"] = team
		if err := env.Client.Update(ctx, stack); err != nil {
			t.Fatal(err)
		}
	}
	create("a")
	setTeam("a", "web")
	stream, err := api.WatchAll(ctx, withToken(&apiv1.ListAllRequest{LabelSelector: "team=web"}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close() }()
	next := func(what string) *apiv1.WatchResponse {
		t.Helper()
		if !stream.Receive() {
			t.Fatalf("%s: the stream ended: %v", what, stream.Err())
		}
		return stream.Msg()
	}
	if m := next("the listed one"); m.GetInstallation().GetName() != "a" || m.GetDeleted() {
		t.Fatalf("first message: %v", m)
	}
	create("b") // no team label: not sent
	create("c")
	setTeam("c", "web")
	if m := next("the new one"); m.GetInstallation().GetName() != "c" || m.GetDeleted() {
		t.Fatalf("after c joined: %v", m)
	}
	setTeam("a", "db")
	if m := next("the one that left"); m.GetInstallation().GetName() != "a" || !m.GetDeleted() {
		t.Fatalf("after a left: %v", m)
	}

	refused, err := api.WatchAll(ctx, withToken(&apiv1.ListAllRequest{}, at.nobody))
	if err == nil {
		if refused.Receive() {
			t.Fatalf("a caller without rights got %v", refused.Msg())
		}
		err = refused.Err()
	}
	expectCode(t, err, connect.CodePermissionDenied, reasonForbidden)
}
