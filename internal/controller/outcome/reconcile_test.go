package outcome

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func program(gen int64) *terracev1.Program {
	return &terracev1.Program{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Generation: gen}}
}

func status(obj Object, t string) string {
	c := Get(obj, t)
	if c == nil {
		return "-"
	}
	return string(c.Status) + "/" + c.Reason
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		err                         error
		ready, reconciling, stalled string
		final, returnsErr           bool
		requeueAfter                time.Duration
		readyMessageContains        string
	}{
		{name: "success", err: nil, ready: "True/ArtifactReady", reconciling: "-", stalled: "-", final: true, requeueAfter: time.Hour, readyMessageContains: "all good"},
		{name: "terminal", err: fmt.Errorf("failed to validate: %w", Terminalf("InvalidProgram", "main.tf:1:1: bad")), ready: "False/InvalidProgram", reconciling: "-", stalled: "True/InvalidProgram", final: true, requeueAfter: time.Hour, readyMessageContains: "main.tf:1:1: bad"},
		{name: "awaiting a person", err: Awaiting("AwaitingApproval", "plan p1 awaits approval"), ready: "False/AwaitingApproval", reconciling: "True/AwaitingApproval", stalled: "-", final: true, readyMessageContains: "plan p1"},
		{name: "waiting", err: Waiting("DependencyNotReady", 30*time.Second, errors.New("stack a is not ready")), ready: "False/DependencyNotReady", reconciling: "True/DependencyNotReady", stalled: "-", requeueAfter: 30 * time.Second, readyMessageContains: "stack a"},
		{name: "transient", err: errors.New("conflict"), ready: "False/ReconciliationFailed", reconciling: "True/ProgressingWithRetry", stalled: "-", returnsErr: true, readyMessageContains: "conflict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := program(3)
			MarkReconciling(obj, ProgressingReason, "building")
			MarkStalled(obj, "Old", "old failure") // a previous outcome the new one must clear or replace
			out := Summarize(obj, tc.err, "ArtifactReady", "all good", time.Hour)
			if got := status(obj, terracev1.ReadyCondition); got != tc.ready {
				t.Errorf("Ready %s, want %s", got, tc.ready)
			}
			if got := status(obj, terracev1.ReconcilingCondition); got != tc.reconciling {
				t.Errorf("Reconciling %s, want %s", got, tc.reconciling)
			}
			if got := status(obj, terracev1.StalledCondition); got != tc.stalled {
				t.Errorf("Stalled %s, want %s", got, tc.stalled)
			}
			if out.Final != tc.final || (out.Err != nil) != tc.returnsErr || out.Result.RequeueAfter != tc.requeueAfter {
				t.Errorf("outcome %+v", out)
			}
			ready := Get(obj, terracev1.ReadyCondition)
			if !strings.Contains(ready.Message, tc.readyMessageContains) || ready.ObservedGeneration != 3 {
				t.Errorf("Ready %+v", ready)
			}
		})
	}
}

// A deferred check of a Ready object leaves it Ready and not Reconciling:
// kstatus and `kubectl wait` see it as they did.
func TestSummarizeDeferredLeavesTheConditions(t *testing.T) {
	obj := program(3)
	MarkReady(obj, "ArtifactReady", "built")
	before := append([]metav1.Condition(nil), obj.Status.Conditions...)
	out := Summarize(obj, Deferred(time.Minute, errors.New("all 4 run slots are taken")), "ArtifactReady", "all good", time.Hour)
	if out.Final || out.Err != nil || out.Result.RequeueAfter != time.Minute {
		t.Errorf("outcome %+v, want a requeue after a minute, not final", out)
	}
	if !equality.Semantic.DeepEqual(obj.Status.Conditions, before) {
		t.Errorf("conditions %+v, want them as they were: %+v", obj.Status.Conditions, before)
	}
}

func TestMarkReconcilingKeepsAKnownFailureVisible(t *testing.T) {
	obj := program(1)
	MarkReconciling(obj, ProgressingReason, "new generation")
	if got := status(obj, terracev1.ReadyCondition); got != "Unknown/Progressing" {
		t.Fatalf("Ready %s", got)
	}
	MarkStalled(obj, "InvalidProgram", "bad")
	MarkReconciling(obj, ProgressingReason, "new generation")
	if got := status(obj, terracev1.ReadyCondition); got != "False/InvalidProgram" {
		t.Fatalf("Ready %s, want the failure kept", got)
	}
}

func TestMessagesAreTruncated(t *testing.T) {
	obj := program(1)
	MarkFalse(obj, terracev1.ReadyCondition, "X", "%s", strings.Repeat("é", 40000))
	msg := Get(obj, terracev1.ReadyCondition).Message
	if len(msg) > maxMessageLength || !strings.HasSuffix(msg, "(truncated)") || !utf8Valid(msg) {
		t.Fatalf("message of %d bytes", len(msg))
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "?") == s }

func TestHandleReconcileRequest(t *testing.T) {
	obj := program(1)
	if HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) {
		t.Fatal("handled a request without the annotation")
	}
	obj.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "2026-11-30T06:00:00Z"}
	if !HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) || obj.Status.LastHandledReconcileAt != "2026-11-30T06:00:00Z" {
		t.Fatalf("request not handled: %+v", obj.Status)
	}
	if HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) {
		t.Fatal("the same request handled twice")
	}
}

func TestGenerationOrRequestChanged(t *testing.T) {
	p := GenerationOrRequestChanged()
	old := program(1)
	sameGen := old.DeepCopy()
	sameGen.Status.ObservedGeneration = 1
	newGen := program(2)
	requested := old.DeepCopy()
	requested.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "now"}
	for name, tc := range map[string]struct {
		newObj client.Object
		want   bool
	}{"status only": {sameGen, false}, "new generation": {newGen, true}, "requested": {requested, true}} {
		if got := p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: tc.newObj}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	if !p.Create(event.CreateEvent{Object: old}) {
		t.Error("create dropped")
	}
}

func TestStatusPatcherKeepsOthersConditions(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := terracev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj := program(1)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).WithStatusSubresource(obj).Build()
	ctx := context.Background()

	mine := &terracev1.Program{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), mine); err != nil {
		t.Fatal(err)
	}
	patcher := NewStatusPatcher(c, mine)

	// Meanwhile someone else adds a condition of their own.
	theirs := mine.DeepCopy()
	meta.SetStatusCondition(&theirs.Status.Conditions, metav1.Condition{Type: "Audited", Status: metav1.ConditionTrue, Reason: "Ok"})
	if err := c.Status().Update(ctx, theirs); err != nil {
		t.Fatal(err)
	}

	MarkReady(mine, "ArtifactReady", "ready")
	mine.Status.ObservedGeneration = 1
	if err := patcher.Patch(ctx, mine, KstatusConditions...); err != nil {
		t.Fatal(err)
	}
	got := &terracev1.Program{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatal(err)
	}
	if !IsTrue(got, terracev1.ReadyCondition) || !IsTrue(got, "Audited") || got.Status.ObservedGeneration != 1 {
		t.Fatalf("status after patch: %+v", got.Status)
	}

	// Nothing changed: no request is sent (the fake client would bump the resourceVersion).
	rv := got.ResourceVersion
	if err := patcher.Patch(ctx, mine, KstatusConditions...); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != rv {
		t.Fatalf("an empty patch was sent: resourceVersion %s → %s", rv, got.ResourceVersion)
	}
}

// A write between this reconcile's read and its patch is neither lost nor
// silently overwritten: the patch carries the resourceVersion it was made
// against, and after the conflict the same changes are laid over the
// latest object.
func TestStatusPatcherLocksAndRemergesAfterAConflict(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := terracev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj := program(1)
	var patches, conflicts int
	base := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).WithStatusSubresource(obj).Build()
	c := interceptor.NewClient(base, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			patches++
			err := cl.SubResource(sub).Patch(ctx, o, p, opts...)
			if apierrors.IsConflict(err) {
				conflicts++
			}
			return err
		},
	})
	ctx := context.Background()
	mine := &terracev1.Program{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), mine); err != nil {
		t.Fatal(err)
	}
	patcher := NewStatusPatcher(c, mine)

	// Someone else writes the status after our read: an artifact and a
	// condition of their own.
	theirs := mine.DeepCopy()
	theirs.Status.Artifact = &terracev1.Artifact{URL: "https://theirs", Revision: "r9"}
	meta.SetStatusCondition(&theirs.Status.Conditions, metav1.Condition{Type: "Audited", Status: metav1.ConditionTrue, Reason: "Ok"})
	if err := base.Status().Update(ctx, theirs); err != nil {
		t.Fatal(err)
	}

	MarkReady(mine, "ArtifactReady", "ready")
	mine.Status.ObservedGeneration = 1
	if err := patcher.Patch(ctx, mine, KstatusConditions...); err != nil {
		t.Fatal(err)
	}
	if conflicts != 1 || patches != 2 {
		t.Fatalf("%d patches with %d conflicts, want the first refused by the lock and one retry", patches, conflicts)
	}
	got := &terracev1.Program{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatal(err)
	}
	if !IsTrue(got, terracev1.ReadyCondition) || !IsTrue(got, "Audited") || got.Status.ObservedGeneration != 1 ||
		got.Status.Artifact == nil || got.Status.Artifact.URL != "https://theirs" {
		t.Fatalf("status after the re-merged patch: %+v", got.Status)
	}
	if mine.ResourceVersion != got.ResourceVersion || mine.Status.Artifact == nil {
		t.Fatalf("the patched object does not hold what the server stored: rv %s vs %s", mine.ResourceVersion, got.ResourceVersion)
	}
}

// A status field set back to its zero value (left out of the JSON by
// omitempty) is cleared on the server, also after a conflict's re-merge.
func TestStatusPatcherClearsFieldsSetToZero(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := terracev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"}}
	obj.Status.Failures = 3
	obj.Status.Plan = &terracev1.PlanStatus{ID: "p1", Pending: "p1"}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).WithStatusSubresource(obj).Build()
	ctx := context.Background()
	mine := &terracev1.Stack{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), mine); err != nil {
		t.Fatal(err)
	}
	patcher := NewStatusPatcher(c, mine)
	// A conflicting write first, so the re-merge path runs too.
	theirs := mine.DeepCopy()
	theirs.Status.LastHandledReconcileAt = "now"
	if err := c.Status().Update(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	mine.Status.Failures = 0
	mine.Status.Plan.Pending = ""
	if err := patcher.Patch(ctx, mine, KstatusConditions...); err != nil {
		t.Fatal(err)
	}
	got := &terracev1.Stack{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Failures != 0 || got.Status.Plan == nil || got.Status.Plan.Pending != "" || got.Status.Plan.ID != "p1" || got.Status.LastHandledReconcileAt != "now" {
		t.Fatalf("status after patch: %+v plan %+v", got.Status, got.Status.Plan)
	}
}

func TestFluxReconcileRequestCounts(t *testing.T) {
	const (
		older = "2026-11-30T06:00:00Z"
		newer = "2026-11-30T07:00:00.123456789Z"
	)
	for name, tc := range map[string]struct {
		own, flux string
		want      string
	}{
		"Flux's alone":                     {"", newer, newer},
		"Terrace's alone":                  {newer, "", newer},
		"Flux's newer":                     {older, newer, newer},
		"Terrace's newer":                  {newer, older, newer},
		"Flux's in Unix seconds, newer":    {older, "1796022000", "1796022000"},
		"the same time":                    {older, older, older},
		"values that are no times":         {"again", "now", "again"},
		"Flux's no time, Terrace's a time": {older, "now", older},
	} {
		obj := program(1)
		obj.Annotations = map[string]string{}
		if tc.own != "" {
			obj.Annotations[terracev1.ReconcileRequestAnnotation] = tc.own
		}
		if tc.flux != "" {
			obj.Annotations[FluxReconcileRequestAnnotation] = tc.flux
		}
		if got, ok := RequestedAt(obj); !ok || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", name, got, ok, tc.want)
		}
	}
}

func TestFluxReconcileRequestIsHandledOnce(t *testing.T) {
	obj := program(1)
	obj.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "2026-11-30T06:00:00Z"}
	if !HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) {
		t.Fatal("Terrace's request not handled")
	}
	// A Flux Receiver asks later: a new request, handled once, and
	// Terrace's older value does not come back as new.
	obj.Annotations[FluxReconcileRequestAnnotation] = "2026-11-30T07:00:00Z"
	if !HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) || obj.Status.LastHandledReconcileAt != "2026-11-30T07:00:00Z" {
		t.Fatalf("Flux's request not handled: %+v", obj.Status)
	}
	for range 2 {
		if HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) {
			t.Fatalf("a request handled twice: %+v", obj.Status)
		}
	}
	// `terrace reconcile` asks again, later still.
	obj.Annotations[terracev1.ReconcileRequestAnnotation] = "2026-11-30T08:00:00Z"
	if !HandleReconcileRequest(obj, &obj.Status.ReconcileRequestStatus) || obj.Status.LastHandledReconcileAt != "2026-11-30T08:00:00Z" {
		t.Fatalf("Terrace's newer request not handled: %+v", obj.Status)
	}
}

func TestFluxReconcileRequestPassesThePredicate(t *testing.T) {
	p := GenerationOrRequestChanged()
	old := program(1)
	flux := old.DeepCopy()
	flux.Annotations = map[string]string{FluxReconcileRequestAnnotation: "2026-11-30T07:00:00Z"}
	if !p.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: flux}) {
		t.Fatal("Flux's request dropped by the predicate")
	}
}
