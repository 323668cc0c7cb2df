package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/readiness"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state/release"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// TestSummarize drives summarize, the only writer of a Stack's status,
// with the observations of each kind of reconcile.
func TestSummarize(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	changes := &runnerv1.PlanSummary{Add: 1, Change: 2, Destroy: 0}
	plan := func(mutate func(*planObservation)) *planObservation {
		p := &planObservation{id: "plan-3-new", summary: changes, hasChanges: true, at: now}
		if mutate != nil {
			mutate(p)
		}
		return p
	}
	settledStack := func() *terracev1.Stack {
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", Generation: 3}}
		st.Status.ObservedGeneration = 2
		st.Status.LastAppliedInputsDigest = "sha256:old"
		st.Status.LastAppliedRevision = "rev-1"
		st.Status.Release = &terracev1.ReleaseStatus{Revision: 1, Status: "deployed"}
		return st
	}
	type want struct {
		ready, reconciling, stalled, planned, applied, drifted string
		final, returnsErr                                      bool
		requeueAfter                                           time.Duration
		failures                                               int64
		pending, appliedDigest                                 string
		readyMessage, event                                    string
	}
	cases := []struct {
		name    string
		stack   func() *terracev1.Stack
		observe observations
		err     error
		want    want
	}{
		{
			name:    "plan kept for approval",
			observe: observations{kind: runPlan, plan: plan(func(p *planObservation) { p.keptForApproval = true })},
			want: want{ready: "False/AwaitingApproval", reconciling: "True/AwaitingApproval", stalled: "-", planned: "True/AwaitingApproval", applied: "-", drifted: "-",
				final: true, pending: "plan-3-new", appliedDigest: "sha256:old", readyMessage: "plan-3-new (+1 ~2 -0) awaits approval"},
		},
		{
			name: "still awaiting approval",
			stack: func() *terracev1.Stack {
				st := settledStack()
				st.Status.Plan = &terracev1.PlanStatus{ID: "plan-3-old", Pending: "plan-3-old", Add: 1, InputsDigest: "sha256:in"}
				return st
			},
			observe: observations{kind: runAwaitApproval},
			want: want{ready: "False/AwaitingApproval", reconciling: "True/AwaitingApproval", stalled: "-", planned: "True/AwaitingApproval", applied: "-", drifted: "-",
				final: true, pending: "plan-3-old", appliedDigest: "sha256:old", readyMessage: "plan-3-old (+1 ~0 -0) awaits approval"},
		},
		{
			name: "applied",
			observe: observations{kind: runPlan, plan: plan(nil), applied: &applyObservation{outputs: []string{"url"}},
				release: &release.Release{Revision: 2, Status: release.StatusDeployed, FinishedAt: now}},
			want: want{ready: "True/Applied", reconciling: "-", stalled: "-", planned: "True/Planned", applied: "True/Applied", drifted: "False/NoDrift",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:in", readyMessage: "applied rev-2 (release 2)"},
		},
		{
			name:    "no changes",
			observe: observations{kind: runPlan, plan: plan(func(p *planObservation) { p.hasChanges, p.upToDate, p.summary = false, true, &runnerv1.PlanSummary{} })},
			want: want{ready: "True/Applied", reconciling: "-", stalled: "-", planned: "True/NoChanges", applied: "-", drifted: "-",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:in", readyMessage: "applied rev-2 (release 1)", event: "Ready"},
		},
		{
			name:    "drift reported under warn",
			observe: observations{kind: runDrift, plan: plan(nil), drift: driftObservation{checked: true, found: true, at: now}},
			want: want{ready: "True/DriftDetected", reconciling: "-", stalled: "-", planned: "True/Planned", applied: "-", drifted: "True/DriftDetected",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:old", readyMessage: "drift detected (+1 ~2 -0), not repaired", event: "Ready"},
		},
		{
			name: "drift repaired under auto",
			observe: observations{kind: runDrift, plan: plan(nil), drift: driftObservation{checked: true, found: true, at: now},
				applied: &applyObservation{}, release: &release.Release{Revision: 2, Status: release.StatusDeployed, FinishedAt: now}},
			want: want{ready: "True/Applied", reconciling: "-", stalled: "-", planned: "True/Planned", applied: "True/Applied", drifted: "True/DriftRepaired",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:in", readyMessage: "release 2"},
		},
		{
			name:    "terminal input error",
			observe: observations{},
			err:     fmt.Errorf("failed to read inputs: %w", outcome.Terminalf(VarsNotFoundReason, "spec.varsFrom[0]: Secret team/creds not found")),
			want: want{ready: "False/VarsNotFound", reconciling: "-", stalled: "True/VarsNotFound", planned: "-", applied: "-", drifted: "-",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:old", readyMessage: "Secret team/creds not found"},
		},
		{
			name:    "transient runner error",
			observe: observations{kind: runPlan, runStarted: &runAnnouncement{id: "r1", message: "planning"}},
			err:     errors.New("plan failed: the runner died: OOMKilled"),
			want: want{ready: "False/ReconciliationFailed", reconciling: "True/ProgressingWithRetry", stalled: "-", planned: "-", applied: "-", drifted: "-",
				returnsErr: true, failures: 1, appliedDigest: "sha256:old", readyMessage: "OOMKilled", event: "ReconciliationFailed"},
		},
		{
			name:    "waiting on a dependency",
			observe: observations{dependencyWait: "team/db"},
			err:     outcome.Waiting(DependencyNotReadyReason, 30*time.Second, errors.New("waiting for dependencies to be Ready: team/db")),
			want: want{ready: "False/DependencyNotReady", reconciling: "True/DependencyNotReady", stalled: "-", planned: "-", applied: "-", drifted: "-",
				requeueAfter: 30 * time.Second, appliedDigest: "sha256:old", readyMessage: "team/db"},
		},
		{
			name: "plan from other inputs discarded",
			stack: func() *terracev1.Stack {
				st := settledStack()
				st.Status.Plan = &terracev1.PlanStatus{ID: "plan-2-old", Pending: "plan-2-old", InputsDigest: "sha256:older"}
				return st
			},
			observe: observations{kind: runPlan, discardedPlan: "plan-2-old", plan: plan(nil), applied: &applyObservation{},
				release: &release.Release{Revision: 2, Status: release.StatusDeployed, FinishedAt: now}},
			want: want{ready: "True/Applied", reconciling: "-", stalled: "-", planned: "True/Planned", applied: "True/Applied", drifted: "False/NoDrift",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:in", readyMessage: "release 2"},
		},
		{
			name: "destroy failed on deletion",
			stack: func() *terracev1.Stack {
				st := settledStack()
				st.DeletionTimestamp = &metav1.Time{Time: now}
				st.Finalizers = []string{Finalizer}
				return st
			},
			observe: observations{kind: runDestroy, runStarted: &runAnnouncement{id: "r1", message: "destroying"}},
			err:     deletionBlocked(outcome.Terminalf(DestroyFailedReason, "destroy failed: Error: refusing")),
			want: want{ready: "False/DestroyFailed", reconciling: "-", stalled: "True/DestroyFailed", planned: "-", applied: "-", drifted: "-",
				final: true, requeueAfter: 10 * time.Minute, appliedDigest: "sha256:old", readyMessage: "deletion blocked: destroy failed: Error: refusing; fix it, or remove the finalizer"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stack := settledStack()
			if tc.stack != nil {
				stack = tc.stack()
			}
			recorder := events.NewFakeRecorder(10)
			r := &Reconciler{Recorder: recorder, Now: func() time.Time { return now }}
			s := &scope{stack: stack, log: logr.Discard(), observed: tc.observe,
				source: &source{revision: "rev-2"}, inputs: &inputs{digest: "sha256:in"},
				config: settings.Effective{Interval: 10 * time.Minute}}
			out := r.summarize(context.Background(), s, tc.err)
			w := tc.want
			for _, c := range []struct{ cond, want string }{
				{terracev1.ReadyCondition, w.ready}, {terracev1.ReconcilingCondition, w.reconciling}, {terracev1.StalledCondition, w.stalled},
				{terracev1.PlannedCondition, w.planned}, {terracev1.AppliedCondition, w.applied}, {terracev1.DriftedCondition, w.drifted},
			} {
				if got := conditionText(stack, c.cond); got != c.want {
					t.Errorf("%s = %s, want %s", c.cond, got, c.want)
				}
			}
			// Requeues at the interval are jittered by up to a tenth.
			if got := out.Result.RequeueAfter; out.Final != w.final || (out.Err != nil) != w.returnsErr || got < w.requeueAfter || got > w.requeueAfter+w.requeueAfter/10 {
				t.Errorf("outcome final=%v err=%v requeueAfter=%s, want final=%v err=%v requeueAfter=%s", out.Final, out.Err, out.Result.RequeueAfter, w.final, w.returnsErr, w.requeueAfter)
			}
			st := stack.Status
			if st.Failures != w.failures {
				t.Errorf("failures = %d, want %d", st.Failures, w.failures)
			}
			if pending := planPending(stack); pending != w.pending {
				t.Errorf("plan pending = %q, want %q", pending, w.pending)
			}
			if st.LastAppliedInputsDigest != w.appliedDigest {
				t.Errorf("lastAppliedInputsDigest = %q, want %q", st.LastAppliedInputsDigest, w.appliedDigest)
			}
			if w.final != (st.ObservedGeneration == stack.Generation) {
				t.Errorf("observedGeneration %d at generation %d, final %v", st.ObservedGeneration, stack.Generation, w.final)
			}
			if msg := outcome.Get(stack, terracev1.ReadyCondition).Message; !strings.Contains(msg, w.readyMessage) {
				t.Errorf("Ready message %q does not contain %q", msg, w.readyMessage)
			}
			if got := firstEventReason(recorder); got != w.event {
				t.Errorf("first event %q, want %q", got, w.event)
			}
			if conditionTrue(stack, terracev1.ReadyCondition) {
				if ok, why, err := readiness.ReadyAtGeneration(stack); !ok || err != nil {
					t.Errorf("not Ready at its generation by kstatus: %s %v", why, err)
				}
			}
		})
	}
}

// TestSummarizeRecordsTheRun checks the run's own status fields.
func TestSummarizeRecordsTheRun(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", Generation: 1}}
	r := &Reconciler{Now: func() time.Time { return now }}
	s := &scope{stack: stack, log: logr.Discard(), source: &source{revision: "rev-1"}, inputs: &inputs{digest: "sha256:in"},
		observed: observations{kind: runPlan, attempted: "rev-1", runStarted: &runAnnouncement{id: "run-1", message: "planning"},
			plan:    &planObservation{id: "plan-1-a", summary: &runnerv1.PlanSummary{Add: 1}, hasChanges: true, at: now},
			applied: &applyObservation{outputs: []string{"a", "b"}},
			release: &release.Release{Revision: 1, Status: release.StatusDeployed, FinishedAt: now}}}
	summarizeProgress(s, true, true)
	if stack.Status.CurrentRun != "run-1" || !conditionTrue(stack, terracev1.ReconcilingCondition) {
		t.Fatalf("a starting run is not announced: %+v", stack.Status)
	}
	r.summarize(context.Background(), s, nil)
	st := stack.Status
	if st.LastAttemptedRevision != "rev-1" || st.LastPlannedRevision != "rev-1" || st.LastAppliedRevision != "rev-1" {
		t.Errorf("revisions %q %q %q", st.LastAttemptedRevision, st.LastPlannedRevision, st.LastAppliedRevision)
	}
	if st.Plan == nil || st.Plan.ID != "plan-1-a" || st.Plan.Add != 1 || st.Plan.InputsDigest != "sha256:in" || st.Plan.Pending != "" {
		t.Errorf("plan %+v", st.Plan)
	}
	if st.LastDriftCheckAt == nil || !st.LastDriftCheckAt.Time.Equal(now) || st.LastDriftDetectedAt != nil {
		t.Errorf("drift times %v %v", st.LastDriftCheckAt, st.LastDriftDetectedAt)
	}
	if strings.Join(st.Outputs, ",") != "a,b" || st.Release == nil || st.Release.Revision != 1 || st.Release.Status != "deployed" {
		t.Errorf("outputs %v release %+v", st.Outputs, st.Release)
	}
}

func conditionText(stack *terracev1.Stack, t string) string {
	c := outcome.Get(stack, t)
	if c == nil {
		return "-"
	}
	return string(c.Status) + "/" + c.Reason
}

func planPending(stack *terracev1.Stack) string {
	if stack.Status.Plan == nil {
		return ""
	}
	return stack.Status.Plan.Pending
}

func firstEventReason(r *events.FakeRecorder) string {
	select {
	case e := <-r.Events:
		// "Type Reason Note"
		if f := strings.Fields(e); len(f) > 1 {
			return f[1]
		}
		return e
	default:
		return ""
	}
}

// TestSummarizeAQueuedRun: a Ready Stack whose run waits for a slot. Its
// drift check leaves it Ready (its dependents and kstatus see no change);
// a requested run shows RunQueued and leaves the request unhandled until
// a reconcile that does not queue it, so that the run happens and
// `terrace reconcile --wait` waits for it.
func TestSummarizeAQueuedRun(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ans := slotAnswer{inUse: 4, total: 4, perNamespace: 3, recheck: 90 * time.Second}
	readyStack := func() *terracev1.Stack {
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team", Generation: 2,
			Annotations: map[string]string{terracev1.ReconcileRequestAnnotation: "asked-1"}}}
		st.Status.ObservedGeneration = 2
		st.Status.LastAppliedInputsDigest = "sha256:in"
		st.Status.LastHandledReconcileAt = "asked-0"
		st.Status.Release = &terracev1.ReleaseStatus{Revision: 1, Status: "deployed"}
		outcome.MarkReady(st, AppliedReason, "applied rev-1 (release 1)")
		return st
	}
	// summarize summarizes a reconcile that ended with step's error.
	summarize := func(st *terracev1.Stack, step func(*scope) error) outcome.Outcome {
		r := &Reconciler{Recorder: events.NewFakeRecorder(10), Now: func() time.Time { return now }}
		s := &scope{stack: st, log: logr.Discard(), source: &source{revision: "rev-1"}, inputs: &inputs{digest: "sha256:in"},
			config: settings.Effective{Interval: 10 * time.Minute}}
		return r.summarize(context.Background(), s, step(s))
	}
	queuedCheck := func(s *scope) error { return queued(s, ans, true) }
	queuedRun := func(s *scope) error { return queued(s, ans, false) }
	ran := func(*scope) error { return nil }

	check := readyStack()
	delete(check.Annotations, terracev1.ReconcileRequestAnnotation)
	out := summarize(check, queuedCheck)
	if got := conditionText(check, terracev1.ReadyCondition) + " " + conditionText(check, terracev1.ReconcilingCondition); got != "True/Applied -" {
		t.Errorf("a Ready Stack whose drift check waits: Ready, Reconciling = %s, want True/Applied -", got)
	}
	if out.Err != nil || out.Result.RequeueAfter != ans.recheck {
		t.Errorf("queued check: outcome %+v, want a recheck after %s", out, ans.recheck)
	}

	asked := readyStack()
	out = summarize(asked, queuedRun)
	if got := conditionText(asked, terracev1.ReadyCondition) + " " + conditionText(asked, terracev1.ReconcilingCondition); got != "False/RunQueued True/RunQueued" {
		t.Errorf("a requested run that waits: Ready, Reconciling = %s, want False/RunQueued True/RunQueued", got)
	}
	if out.Err != nil || out.Result.RequeueAfter != ans.recheck || asked.Status.Failures != 0 {
		t.Errorf("queued request: outcome %+v, failures %d", out, asked.Status.Failures)
	}
	if got := asked.Status.LastHandledReconcileAt; got != "asked-0" {
		t.Errorf("lastHandledReconcileAt %q while the requested run waits, want the earlier asked-0", got)
	}
	if _, pending := requestedReconcile(asked); !pending {
		t.Error("the request is no longer pending after its run was queued")
	}
	summarize(asked, ran) // the run, once it had a slot
	if got := asked.Status.LastHandledReconcileAt; got != "asked-1" {
		t.Errorf("lastHandledReconcileAt %q after the requested run, want asked-1", got)
	}
}
