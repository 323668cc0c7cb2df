package stack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/stackview"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Condition reasons about runs.
const (
	PlanFailedReason        = "PlanFailed"
	ApplyFailedReason       = "ApplyFailed"
	RunnerFailedReason      = "RunnerFailed"
	AwaitingApprovalReason  = "AwaitingApproval"
	PlannedReason           = "Planned"
	NoChangesReason         = "NoChanges"
	AppliedReason           = "Applied"
	DriftDetectedReason     = "DriftDetected"
	DriftRepairedReason     = "DriftRepaired"
	NoDriftReason           = "NoDrift"
	PlanOnlyReason          = "PlanOnly"
	ProgressingReason       = reconcile.ProgressingReason
	SourceDigestMismatch    = "SourceDigestMismatch"
	PlanNoLongerValidReason = "PlanNoLongerValid"
)

// runKind is what a reconcile does with a runner.
type runKind string

const (
	// runNothing: everything is up to date; look again later.
	runNothing runKind = ""
	// runAwaitApproval: a plan waits for approval; nothing to run.
	runAwaitApproval runKind = "await"
	// runPlan: the inputs changed (or a retry/request is due): plan, and apply if approved.
	runPlan runKind = "plan"
	// runApplyPending: the pending plan was approved: apply exactly it.
	runApplyPending runKind = "apply"
	// runDrift: the interval passed: plan to find drift.
	runDrift runKind = "drift"
	// runDestroy: the Stack is deleted with destroyOnDelete.
	runDestroy runKind = "destroy"
)

// maxSourceBytes bounds tarballs the controller downloads for runners.
const maxSourceBytes = 256 << 20

// decide says what this reconcile runs and, for runNothing, when to look again.
func (r *Reconciler) decide(s *scope) (runKind, time.Duration) {
	st := s.stack.Status
	_, requested := requestedReconcile(s.stack)
	if st.Plan != nil && st.Plan.Pending != "" && st.Plan.InputsDigest == s.inputs.digest && !requested {
		if approved(s.stack.Spec.ApprovePlan, st.Plan.Pending) {
			return runApplyPending, 0
		}
		return runAwaitApproval, 0
	}
	if requested || st.Failures > 0 || st.LastAppliedInputsDigest != s.inputs.digest ||
		st.ObservedGeneration != s.stack.Generation {
		return runPlan, 0
	}
	if s.config.DriftMode == terracev1.DriftDetectionDisabled {
		return runNothing, s.config.Interval
	}
	if st.LastDriftCheckAt == nil {
		return runDrift, 0
	}
	if due := st.LastDriftCheckAt.Add(s.config.Interval); !r.now().Before(due) {
		return runDrift, 0
	} else {
		return runNothing, due.Sub(r.now())
	}
}

func approved(approvePlan, planID string) bool {
	return approvePlan == terracev1.ApprovePlanAuto || (planID != "" && approvePlan == planID)
}

// run carries out what decide chose.
func (r *Reconciler) run(ctx context.Context, s *scope) error {
	var discarded string
	if p := s.stack.Status.Plan; p != nil && p.Pending != "" && p.InputsDigest != s.inputs.digest {
		// The inputs moved on: the waiting plan can never be applied.
		discarded, p.Pending = p.Pending, ""
	}
	kind, wait := r.decide(s)
	s.observed.kind = kind
	if kind != runNothing && kind != runAwaitApproval {
		current, err := r.cacheIsCurrent(ctx, s.stack)
		if err != nil {
			return err
		}
		if !current {
			s.observed.staleCache = true
			return nil
		}
	}
	if discarded != "" {
		r.event(s.stack, "Normal", "PlanDiscarded", "plan %s was made from other inputs and is discarded", discarded)
	}
	switch kind {
	case runNothing:
		s.observed.requeueAfter = wait
		return nil
	case runAwaitApproval:
		s.observed.awaitingApproval = true
		return nil
	}
	stores, err := r.openStores(ctx, s.stack.Namespace)
	if err != nil {
		return err
	}
	if err := r.announceRun(ctx, s, kind); err != nil {
		return err
	}
	timeout := launcher.DefaultRunTimeout
	if t := s.stack.Spec.Timeout; t != nil && t.Duration > 0 {
		timeout = t.Duration
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = r.runInRunner(ctx, s, kind, stores)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the run was stopped after spec.timeout (%s); raise spec.timeout if it needs longer: %w", timeout, err)
	}
	return err
}

// runInRunner carries out a run in a new runner pod.
func (r *Reconciler) runInRunner(ctx context.Context, s *scope, kind runKind, stores *storeSet) error {
	if err := r.recoverFromDeadRuns(ctx, s, stores.States); err != nil {
		return err
	}
	sess, err := r.Runs.Start(ctx, runRequestFor(s))
	if err != nil {
		return fmt.Errorf("failed to start a runner: %w", err)
	}
	defer func() {
		if err := sess.Close(context.WithoutCancel(ctx)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "failed to remove runner pod")
		}
	}()
	rctx := sess.Context()
	cl := sess.Client()
	logf := runLogger(ctx, sess.ID())

	s.stack.Status.LastAttemptedRevision = s.source.revision
	if err := r.loadSource(rctx, s, cl); err != nil {
		return err
	}
	initResult, err := cl.Init(rctx, r.initRequest(s, sess.ID()), logf)
	if err != nil {
		return classify(sess, err, PlanFailedReason, "init failed")
	}
	s.observed.tool = r.runTool(ctx, sess, initResult)

	switch kind {
	case runApplyPending:
		return r.applyPending(rctx, s, cl, stores, logf, sess)
	default:
		return r.planAndMaybeApply(rctx, s, cl, stores, logf, sess, kind)
	}
}

// announceRun makes the run visible before it starts: runs take minutes.
func (r *Reconciler) announceRun(ctx context.Context, s *scope, kind runKind) error {
	patcher := reconcile.NewStatusPatcher(r.Client, s.stack)
	var msg string
	switch kind {
	case runApplyPending:
		msg = "applying approved plan " + s.stack.Status.Plan.Pending
	case runDrift:
		msg = "checking for drift"
	case runDestroy:
		msg = "destroying"
	default:
		msg = "planning " + stackview.ShortRevision(s.source.revision)
	}
	reconcile.MarkReconciling(s.stack, ProgressingReason, "%s", msg)
	// Recorded before the runner exists: its certificate opens the state
	// only while this is the Stack's current run.
	s.stack.Status.CurrentRun = launcher.NewRunID()
	return patcher.Patch(ctx, s.stack, terracev1.ReadyCondition, terracev1.ReconcilingCondition)
}

// recoverFromDeadRuns removes runner pods of earlier runs (a controller that
// restarted mid-run left them) and releases a state lock only such a run
// can hold: runs of one Stack never overlap.
func (r *Reconciler) recoverFromDeadRuns(ctx context.Context, s *scope, states state.Store) error {
	if err := r.Runs.Cleanup(ctx, s.stack.Namespace, s.stack.Name); err != nil {
		return fmt.Errorf("failed to remove runner pods of earlier runs: %w", err)
	}
	key := stateKey(s.stack)
	holder, err := states.GetLock(ctx, key)
	if err != nil || holder == nil {
		return err
	}
	if holder.Operation == migrate.LockOperation {
		// Never break a migration's lock: the copy would miss what we write.
		return reconcile.Waiting(StateMigrationPendingReason, migrationRecheck, fmt.Errorf("the state of %s is being copied to another backend (lock %s since %s)", key, holder.ID, holder.Created.Format(time.RFC3339)))
	}
	if err := states.ForceUnlock(ctx, key); err != nil {
		return fmt.Errorf("failed to release the state lock of a dead run: %w", err)
	}
	ctrl.LoggerFrom(ctx).Info("released the state lock of a dead run", "lockID", holder.ID, "operation", holder.Operation, "created", holder.Created)
	r.event(s.stack, "Normal", "StateUnlocked", "released the state lock held since %s by a run that is gone", holder.Created.Format(time.RFC3339))
	return nil
}

func stateKey(stack *terracev1.Stack) state.Key {
	return state.Key{Namespace: stack.Namespace, Stack: stack.Name, Workspace: stack.Spec.Workspace}
}

// loadSource gets the module into the runner. Programs and spec.source.url
// tarballs are fetched by the runner itself (from the artifact server, or
// from its pod's network position); only Flux artifacts, served by
// source-controller on a host the operator allowed, are downloaded here
// and streamed to the runner, which verifies the digest.
func (r *Reconciler) loadSource(ctx context.Context, s *scope, cl *runner.Client) error {
	var err error
	switch s.source.origin {
	case fromArtifactServer:
		_, err = cl.Fetch(ctx, s.source.url, s.source.digest)
	case fromStackURL:
		_, err = cl.FetchExternal(ctx, s.source.url, s.source.digest)
	case fromFluxArtifact:
		err = r.uploadFluxArtifact(ctx, s, cl)
	}
	if err != nil {
		return classifySourceError(s, err)
	}
	return nil
}

// fluxFetchUserAgent names the controller to source-controller.
const fluxFetchUserAgent = "terrace-controller"

// uploadFluxArtifact streams a Flux artifact to the runner. Its host was
// checked by resolveFluxSource, and the source client refuses any other.
func (r *Reconciler) uploadFluxArtifact(ctx context.Context, s *scope, cl *runner.Client) error {
	httpClient := artifact.NewSourceClient(r.Options.SourceArtifactHosts, fluxFetchUserAgent)
	defer httpClient.CloseIdleConnections()
	// Cancelling the upload ends the runner's side when the download fails.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body, err := artifact.Open(ctx, httpClient, s.source.url, maxSourceBytes)
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = cl.Upload(ctx, s.source.digest, body)
	return err
}

// classifySourceError gives each way a source can fail its own reason.
// Messages come from errors that never quote a server's answer; a refused
// or broken archive is terminal (the source must change), an unavailable
// source is looked at again after spec.retryInterval.
func classifySourceError(s *scope, err error) error {
	var terminal *reconcile.TerminalError
	if errors.As(err, &terminal) {
		return err
	}
	desc := s.source.description
	var notAllowed *artifact.HostNotAllowedError
	var httpStatus *artifact.FetchStatusError
	switch {
	case errors.As(err, &notAllowed):
		return reconcile.Terminalf(SourceHostNotAllowedReason, "%s: %s; the operator may add it with the controller flag --source-artifact-hosts", desc, notAllowed.Error())
	case errors.As(err, &httpStatus):
		return reconcile.Waiting(SourceUnavailableReason, retryBackoff(s.stack, 1), fmt.Errorf("%s is unavailable: %s", desc, httpStatus.Error()))
	case errors.Is(err, artifact.ErrLimitExceeded):
		return reconcile.Terminalf(SourceTooLargeReason, "%s is too large: %s", desc, runnerMessage(err))
	case errors.Is(err, artifact.ErrUnreachable):
		return reconcile.Waiting(SourceUnavailableReason, retryBackoff(s.stack, 1), fmt.Errorf("%s is unavailable: %s", desc, runnerMessage(err)))
	}
	msg := runnerMessage(err)
	switch runner.Reason(err) {
	case runner.ReasonDigestMismatch:
		return reconcile.Terminalf(SourceDigestMismatch, "%s: %s; fix the digest, or the tarball it names", desc, msg)
	case runner.ReasonUnsafeArchive:
		return reconcile.Terminalf(SourceUnsafeReason, "%s was refused by the runner: %s", desc, msg)
	case runner.ReasonTooLarge:
		return reconcile.Terminalf(SourceTooLargeReason, "%s is too large for the runner: %s", desc, msg)
	case runner.ReasonFetchFailed:
		return reconcile.Waiting(SourceUnavailableReason, retryBackoff(s.stack, 1), fmt.Errorf("%s is unavailable to the runner: %s", desc, msg))
	case runner.ReasonInvalidArgument:
		return reconcile.Terminalf(SourceUnavailableReason, "%s was refused by the runner: %s", desc, msg)
	}
	return fmt.Errorf("failed to load %s into the runner: %w", desc, err)
}

// runnerMessage is the message of a runner's gRPC status, or of err.
func runnerMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

func (r *Reconciler) initRequest(s *scope, runID string) *runnerv1.InitRequest {
	addr := fmt.Sprintf("%s/state/%s/%s/%s", strings.TrimRight(r.Options.StateServerURL, "/"), s.stack.Namespace, s.stack.Name, s.stack.Spec.Workspace)
	return &runnerv1.InitRequest{
		Path:      s.stack.Spec.Path,
		Workspace: s.stack.Spec.Workspace,
		HttpBackend: &runnerv1.HTTPBackend{
			Address: addr, LockAddress: addr, UnlockAddress: addr,
		},
	}
}

func (r *Reconciler) planRequest(s *scope, planID string) (*runnerv1.PlanRequest, error) {
	js, err := json.Marshal(s.inputs.vars)
	if err != nil {
		return nil, fmt.Errorf("failed to encode variables: %w", err)
	}
	return &runnerv1.PlanRequest{
		Variables: &runnerv1.Variables{Json: js, Sensitive: s.inputs.sensitive},
		PlanId:    planID,
	}, nil
}

// newPlanID names a plan after the generation it belongs to, unique per run.
func (r *Reconciler) newPlanID(s *scope, runID string) string {
	h := sha256.Sum256([]byte(s.inputs.digest + "/" + runID))
	return fmt.Sprintf("plan-%d-%s", s.stack.Generation, hex.EncodeToString(h[:])[:10])
}

// planAndMaybeApply plans; applies when approved; otherwise stores the plan
// for approval (or only reports, for drift under warn).
func (r *Reconciler) planAndMaybeApply(ctx context.Context, s *scope, cl *runner.Client, stores *storeSet, logf runner.LogFunc, sess runSession, kind runKind) error {
	planID := r.newPlanID(s, sess.ID())
	req, err := r.planRequest(s, planID)
	if err != nil {
		return err
	}
	started := r.now()
	p, err := cl.Plan(ctx, req, logf)
	if err != nil {
		return classify(sess, err, PlanFailedReason, "plan failed")
	}
	s.recordPlan(planID, p, r.now())
	// Every plan refreshes the state against the world, so it counts as a
	// drift check: the next one is due an interval from now.
	now := metav1.NewTime(r.now())
	s.stack.Status.LastDriftCheckAt = &now
	drift := r.isDrift(s, kind, p.GetHasChanges())
	if kind == runDrift || drift {
		s.observed.driftChecked = true
	}
	if drift {
		s.stack.Status.LastDriftDetectedAt = &now
		s.observed.drifted = true
		r.event(s.stack, "Warning", DriftDetectedReason, "drift detected: %s", summaryText(p.GetSummary()))
		driftDetectedTotal.WithLabelValues(s.stack.Namespace).Inc()
	}
	if !p.GetHasChanges() {
		if err := r.syncOutputs(ctx, s, cl, kind); err != nil {
			return err
		}
		s.stack.Status.LastAppliedInputsDigest = s.inputs.digest
		s.stack.Status.LastPlannedRevision = s.source.revision
		if s.stack.Status.LastAppliedRevision == "" || kind == runPlan {
			s.stack.Status.LastAppliedRevision = s.source.revision
		}
		s.observed.noChanges = true
		return nil
	}
	s.stack.Status.LastPlannedRevision = s.source.revision
	if s.stack.Spec.PlanOnly {
		s.observed.planOnly = true
		return r.storeReadablePlan(ctx, s, cl, stores, planID, nil)
	}
	if drift && s.config.DriftMode == terracev1.DriftDetectionWarn {
		if _, requested := requestedReconcile(s.stack); !requested {
			return nil // reported, never repaired unless a person asks
		}
	}
	if approved(s.stack.Spec.ApprovePlan, "") {
		return r.apply(ctx, s, cl, stores, logf, planID, p.GetSummary(), started)
	}
	// Keep the plan for approval: a later run, in a new runner, applies it.
	var buf bytes.Buffer
	if _, err := cl.DownloadPlan(ctx, planID, &buf); err != nil {
		return classify(sess, err, PlanFailedReason, "failed to download the plan file")
	}
	if err := r.storeReadablePlan(ctx, s, cl, stores, planID, buf.Bytes()); err != nil {
		return err
	}
	s.stack.Status.Plan.Pending = planID
	s.observed.awaitingApproval = true
	r.event(s.stack, "Normal", "PlanCreated", "plan %s awaits approval: %s; set spec.approvePlan to %q to apply it", planID, summaryText(p.GetSummary()), planID)
	return nil
}

// isDrift says whether a plan's changes were made outside Terrace: the
// inputs are the ones last applied (or planned with no changes), so only
// the world can have moved. What started the run does not matter: the
// retry of a failed drift check, or a plan for a new generation that
// changed only, say, the interval, finds drift just as a drift check does.
func (r *Reconciler) isDrift(s *scope, kind runKind, hasChanges bool) bool {
	if !hasChanges || s.config.DriftMode == terracev1.DriftDetectionDisabled {
		return false
	}
	if kind == runDrift {
		return true
	}
	applied := s.stack.Status.LastAppliedInputsDigest
	return kind == runPlan && applied != "" && applied == s.inputs.digest
}

// storeReadablePlan saves the plan file (when given) with the readable
// rendering the Stack asks for.
func (r *Reconciler) storeReadablePlan(ctx context.Context, s *scope, cl *runner.Client, stores *storeSet, planID string, binary []byte) error {
	format := s.stack.Spec.StoreReadablePlan
	if binary == nil && (format == "" || format == terracev1.ReadablePlanNone) {
		return nil
	}
	plan := state.Plan{PlanMeta: state.PlanMeta{Key: planKey(s.stack, planID)}, Binary: binary}
	if format == terracev1.ReadablePlanJSON || format == terracev1.ReadablePlanHuman {
		f := runnerv1.PlanFormat_PLAN_FORMAT_JSON
		if format == terracev1.ReadablePlanHuman {
			f = runnerv1.PlanFormat_PLAN_FORMAT_HUMAN
		}
		readable, err := cl.ShowPlan(ctx, planID, f)
		if err != nil {
			return fmt.Errorf("failed to render the plan: %w", err)
		}
		plan.Readable = readable
		plan.ReadableFormat = state.ReadableFormat(format)
	}
	if _, err := stores.Plans.PutPlan(ctx, plan); err != nil {
		return fmt.Errorf("failed to store plan %s: %w", planID, err)
	}
	return nil
}

func planKey(stack *terracev1.Stack, planID string) state.PlanKey {
	return state.PlanKey{Namespace: stack.Namespace, Stack: stack.Name, ID: planID}
}

// applyPending applies the stored, approved plan in this (new) runner.
func (r *Reconciler) applyPending(ctx context.Context, s *scope, cl *runner.Client, stores *storeSet, logf runner.LogFunc, sess runSession) error {
	planID := s.stack.Status.Plan.Pending
	stored, err := stores.Plans.GetPlan(ctx, planKey(s.stack, planID))
	if errors.Is(err, state.ErrNotFound) {
		s.stack.Status.Plan.Pending = ""
		return reconcile.Terminalf(PlanNoLongerValidReason, "plan %s is no longer stored; a new plan will be made on the next change or terrace.dev/requestedAt", planID)
	}
	if err != nil {
		return fmt.Errorf("failed to read plan %s: %w", planID, err)
	}
	if err := cl.UploadPlan(ctx, planID, stored.Digest, bytes.NewReader(stored.Binary)); err != nil {
		return classify(sess, err, ApplyFailedReason, "failed to restore the plan in the runner")
	}
	summary := &runnerv1.PlanSummary{}
	if p := s.stack.Status.Plan; p != nil {
		summary = &runnerv1.PlanSummary{Add: p.Add, Change: p.Change, Destroy: p.Destroy}
	}
	if err := r.apply(ctx, s, cl, stores, logf, planID, summary, r.now()); err != nil {
		return err
	}
	return stores.Plans.DeletePlan(ctx, planKey(s.stack, planID))
}
