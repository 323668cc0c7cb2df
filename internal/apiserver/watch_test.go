package apiserver

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// setConditions sets the Stack's status conditions as the controller would.
func (at *apiTest) setConditions(name string, conditions ...metav1.Condition) {
	at.t.Helper()
	stack := at.stack(name)
	stack.Status.ObservedGeneration = stack.Generation
	for i := range conditions {
		conditions[i].LastTransitionTime = metav1.Now()
	}
	stack.Status.Conditions = conditions
	if err := env.Client.Status().Update(context.Background(), stack); err != nil {
		at.t.Fatal(err)
	}
}

// planAndApply moves installation name from Pending through Planning to
// Ready, as the controller would; before each change and after the last,
// seen is told the phase a watch must show now.
func (at *apiTest) planAndApply(name string, seen func(phase string)) {
	at.t.Helper()
	seen(phasePending)
	at.setConditions(name,
		metav1.Condition{Type: terracev1.ReconcilingCondition, Status: metav1.ConditionTrue, Reason: "Progressing", Message: "planning"},
		metav1.Condition{Type: terracev1.ReadyCondition, Status: metav1.ConditionUnknown, Reason: "Progressing", Message: "planning"})
	seen(phasePlanning)
	at.setConditions(name, metav1.Condition{Type: terracev1.ReadyCondition, Status: metav1.ConditionTrue, Reason: "Applied", Message: "applied"})
	seen(phaseReady)
}

// TestWatchStreamsStatusChanges: a gRPC Watch sees the installation as it
// is, then Planning, then Ready, then its deletion; a caller who may not
// watch Stacks is refused.
func TestWatchStreamsStatusChanges(t *testing.T) {
	at := newAPITest(t)
	grpc := at.grpcClient()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := grpc.Create(ctx, withToken(&apiv1.CreateRequest{Name: "web", Source: &apiv1.Source{ProgramRef: "m"}}, at.admin)); err != nil {
		t.Fatal(err)
	}
	stream, err := grpc.Watch(ctx, withToken(&apiv1.WatchRequest{Name: "web"}, at.admin))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	next := func(want string) *apiv1.WatchResponse {
		t.Helper()
		if !stream.Receive() {
			t.Fatalf("the stream ended waiting for %s: %v", want, stream.Err())
		}
		msg := stream.Msg()
		if msg.Installation.Phase != want {
			t.Fatalf("phase %s, want %s: %v", msg.Installation.Phase, want, msg)
		}
		return msg
	}
	at.planAndApply("web", func(phase string) {
		if ev := next(phase); phase == phaseReady && !ev.Installation.Ready {
			t.Fatalf("ready: %v", ev)
		}
	})
	if _, err := grpc.Delete(ctx, withToken(&apiv1.DeleteRequest{Name: "web"}, at.admin)); err != nil {
		t.Fatal(err)
	}
	// Deletion begins (a timestamp, when a finalizer holds it) or is done.
	for stream.Receive() {
		if stream.Msg().Deleted {
			break
		}
		if stream.Msg().Installation.Phase != phaseDeleting {
			t.Fatalf("after delete: %v", stream.Msg())
		}
	}
	if !stream.Msg().GetDeleted() {
		t.Fatalf("no deleted event: %v", stream.Err())
	}
	if stream.Receive() {
		t.Fatalf("the stream goes on after the deletion: %v", stream.Msg())
	}

	denied, err := grpc.Watch(ctx, withToken(&apiv1.WatchRequest{Name: "web"}, at.nobody))
	if err != nil {
		t.Fatal(err)
	}
	defer denied.Close()
	if denied.Receive() {
		t.Fatalf("a caller without rights got %v", denied.Msg())
	}
	expectCode(t, denied.Err(), connect.CodePermissionDenied, reasonForbidden, `cannot get resource "stacks"`)
}
