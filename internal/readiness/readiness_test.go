package readiness

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

func stack(generation, observed int64, conds ...metav1.Condition) *terracev1.Stack {
	s := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", Generation: generation}}
	s.Status.ObservedGeneration = observed
	s.Status.Conditions = conds
	return s
}

func cond(t string, s metav1.ConditionStatus, generation int64) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: "Because", Message: "said so", ObservedGeneration: generation}
}

func unstructuredObject(apiVersion, kind string, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": "x", "namespace": "team", "generation": int64(1)},
	}}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func TestComputeAndReadyAtGeneration(t *testing.T) {
	const (
		T = metav1.ConditionTrue
		F = metav1.ConditionFalse
		U = metav1.ConditionUnknown
	)
	deleting := stack(2, 2, cond(terracev1.ReadyCondition, T, 2))
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)}
	for _, tc := range []struct {
		name      string
		obj       client.Object
		want      status.Status
		wantReady bool
	}{
		{"Ready at the current generation", stack(2, 2, cond(terracev1.ReadyCondition, T, 2)), status.CurrentStatus, true},
		{"Reconciling", stack(2, 1, cond(terracev1.ReadyCondition, U, 2), cond(terracev1.ReconcilingCondition, T, 2)), status.InProgressStatus, false},
		{"Stalled", stack(2, 2, cond(terracev1.ReadyCondition, F, 2), cond(terracev1.StalledCondition, T, 2)), status.FailedStatus, false},
		{"stale generation", stack(3, 2, cond(terracev1.ReadyCondition, T, 2)), status.InProgressStatus, false},
		{"Ready for an older generation", stack(3, 0, cond(terracev1.ReadyCondition, T, 2)), status.InProgressStatus, false},
		{"Ready=False without Stalled, which kstatus alone calls Current", stack(2, 2, cond(terracev1.ReadyCondition, F, 2)), status.InProgressStatus, false},
		{"Ready without observedGeneration, status current", stack(2, 2, cond(terracev1.ReadyCondition, T, 0)), status.CurrentStatus, true},
		{"no conditions on a Terrace kind", stack(1, 0), status.InProgressStatus, false},
		{"deleting", deleting, status.TerminatingStatus, false},
		{"Ready on an unstructured Terrace object", unstructuredObject("terrace.dev/v1alpha1", "Program", map[string]any{
			"observedGeneration": int64(1),
			"conditions":         []any{map[string]any{"type": "Ready", "status": "True", "reason": "ArtifactReady", "message": "ok", "observedGeneration": int64(1), "lastTransitionTime": "2026-12-01T20:00:00Z"}},
		}), status.CurrentStatus, true},
		{"no conditions on a ConfigMap", unstructuredObject("v1", "ConfigMap", nil), status.CurrentStatus, false},
		{"Ready=False on another group's kind", unstructuredObject("example.com/v1", "Widget", map[string]any{
			"conditions": []any{map[string]any{"type": "Ready", "status": "False", "reason": "Waiting", "message": "not yet"}},
		}), status.InProgressStatus, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, msg, err := Compute(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Compute = %s (%s), want %s", got, msg, tc.want)
			}
			ready, why, err := ReadyAtGeneration(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			if ready != tc.wantReady {
				t.Errorf("ReadyAtGeneration = %v (%s), want %v", ready, why, tc.wantReady)
			}
			if why == "" {
				t.Error("ReadyAtGeneration gave no message")
			}
		})
	}
}
