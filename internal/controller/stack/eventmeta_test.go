package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/settings"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// annotatedEvents records events with their metadata.
type annotatedEvents struct{ got []recordedEvent }

type recordedEvent struct {
	eventType, reason, note string
	meta                    map[string]string
}

func (a *annotatedEvents) Eventf(_ runtime.Object, _ runtime.Object, eventtype, reason, _, note string, args ...any) {
	a.AnnotatedEventf(nil, nil, nil, eventtype, reason, "", note, args...)
}

func (a *annotatedEvents) AnnotatedEventf(_ runtime.Object, _ runtime.Object, meta map[string]string, eventtype, reason, _, note string, args ...any) {
	a.got = append(a.got, recordedEvent{eventType: eventtype, reason: reason, note: fmt.Sprintf(note, args...), meta: maps.Clone(meta)})
}

// TestEventMetadata: the events a notification is made of (plan waiting,
// applied, failed, drift found, recovered) carry the revision and, where
// there is a plan, its id and summary, under the Stack's API group as Flux's
// notification-controller requires.
func TestEventMetadata(t *testing.T) {
	if EventRevisionKey != terracev1.GroupVersion.Group+"/revision" {
		t.Fatalf("metadata keys must be prefixed with the Stack's API group %q", terracev1.GroupVersion.Group)
	}
	plan := &planObservation{id: "plan-7-abc", summary: &runnerv1.PlanSummary{Add: 2, Change: 1}, hasChanges: true}
	newScope := func() *scope {
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", Generation: 2}}
		st.Status.ObservedGeneration = 1
		return &scope{stack: st, log: logr.Discard(), source: &source{revision: "main@sha1:0123"}, inputs: &inputs{digest: "sha256:in"},
			config: settings.Effective{Interval: 10 * time.Minute}}
	}
	withPlan := map[string]string{EventRevisionKey: "main@sha1:0123", EventPlanKey: "plan-7-abc", EventSummaryKey: "+2 ~1 -0", EventTokenKey: "plan-7-abc"}
	cases := []struct {
		name   string
		record func(r *Reconciler, s *scope)
		want   recordedEvent
	}{
		{"plan waiting", func(r *Reconciler, s *scope) {
			r.normalEventFor(s, plan.ref(), "PlanCreated", "plan %s awaits approval", plan.id)
		}, recordedEvent{"Normal", "PlanCreated", "plan plan-7-abc awaits approval", withPlan}},
		{"applied", func(r *Reconciler, s *scope) {
			r.normalEventFor(s, plan.ref(), AppliedReason, "applied %s", plan.id)
		}, recordedEvent{"Normal", AppliedReason, "applied plan-7-abc", withPlan}},
		{"drift found", func(r *Reconciler, s *scope) {
			s.run = &runScope{kind: runDrift}
			r.checkDrift(s, plan)
		}, recordedEvent{"Warning", DriftDetectedReason, "drift detected: +2 ~1 -0", withPlan}},
		{"failed, with the plan it applied", func(r *Reconciler, s *scope) {
			s.observed.plan = plan
			r.summarize(context.Background(), s, errors.New("failed to apply: Error: boom"))
		}, recordedEvent{"Warning", "ReconciliationFailed", "failed to apply: Error: boom (retry in 30s)", withPlan}},
		{"failed before any plan: the revision of the last attempt", func(r *Reconciler, s *scope) {
			s.source = nil
			s.stack.Status.LastAttemptedRevision = "main@sha1:0099"
			r.summarize(context.Background(), s, errors.New("failed to start the runner"))
		}, recordedEvent{"Warning", "ReconciliationFailed", "failed to start the runner (retry in 30s)", map[string]string{EventRevisionKey: "main@sha1:0099"}}},
		{"recovered", func(r *Reconciler, s *scope) {
			s.observed.kind = runPlan
			s.observed.plan = &planObservation{id: "plan-8", summary: &runnerv1.PlanSummary{}, upToDate: true}
			s.stack.Status.LastAppliedRevision = "main@sha1:0123"
			s.stack.Status.LastAppliedInputsDigest = "sha256:in"
			r.summarize(context.Background(), s, nil)
		}, recordedEvent{"Normal", "Ready", "", map[string]string{EventRevisionKey: "main@sha1:0123"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &annotatedEvents{}
			r := &Reconciler{Recorder: rec, Now: time.Now}
			tc.record(r, newScope())
			if len(rec.got) == 0 {
				t.Fatalf("no event recorded")
			}
			got := rec.got[0]
			if got.eventType != tc.want.eventType || got.reason != tc.want.reason || (tc.want.note != "" && got.note != tc.want.note) {
				t.Errorf("event %s %s %q, want %s %s %q", got.eventType, got.reason, got.note, tc.want.eventType, tc.want.reason, tc.want.note)
			}
			if !maps.Equal(got.meta, tc.want.meta) {
				t.Errorf("metadata %v, want %v", got.meta, tc.want.meta)
			}
		})
	}
}
