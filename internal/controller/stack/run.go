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

	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
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
	PlanNoLongerValidReason = "PlanNoLongerValid"
)

// maxSourceBytes bounds tarballs the controller downloads for runners.
const maxSourceBytes = 256 << 20

// reconcileRun decides what to run and runs it: exactly one of plan,
// apply of an approved plan, or drift check (destroy runs from the
// deletion path through the same execute).
func (r *Reconciler) reconcileRun(ctx context.Context, s *scope) error {
	kind, wait := r.decide(s)
	s.observed.kind = kind
	if kind.startsRunner() && !s.current {
		current, err := r.cacheIsCurrent(ctx, s.stack)
		if err != nil {
			return err
		}
		if !current {
			s.observed.staleCache = true
			return nil
		}
	}
	if discarded := staleWaitingPlan(s); discarded != "" {
		s.observed.discardedPlan = discarded
		r.normalEvent(s.stack, "PlanDiscarded", "plan %s was made from other inputs and is discarded", discarded)
	}
	switch kind {
	case runNothing:
		s.observed.requeueAfter = wait
		return nil
	case runAwaitApproval:
		return nil
	}
	return r.startRun(ctx, s, kind)
}

// execute runs one run of kind in a new runner pod: open the stores,
// announce the run, start the runner, load the source, init, then the
// kind's own step. Every kind, destroy included, goes this way.
func (r *Reconciler) execute(ctx context.Context, s *scope, kind runKind) error {
	s.observed.kind = kind
	stores, err := r.openStores(ctx, s.stack.Namespace)
	if err != nil {
		return err
	}
	recover, sweep := r.mayHaveDeadRun(s)
	s.run = &runScope{kind: kind, id: r.newRunID(s), stores: stores, recover: recover, sweep: sweep, previous: s.stack.Status.CurrentRun}
	timeout := r.runTimeout(s)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	starting := r.startRunner(ctx, s)
	announced := false
	defer func() {
		if !announced { // the announcement failed, or panicked
			starting.abandon(s) // its pod goes with the run (closeRun)
		}
	}()
	if err := r.announce(ctx, s); err != nil {
		return err
	}
	announced = true
	err = r.runInRunner(ctx, s, starting)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the run was stopped after spec.timeout (%s); raise spec.timeout if it needs longer: %w", timeout, err)
	}
	return err
}

// announce makes the run visible before it starts (runs take minutes)
// through the reconcile's own patcher. It also records status.currentRun
// before the runner exists: the run's certificate opens the state only
// while it is the Stack's current run.
func (r *Reconciler) announce(ctx context.Context, s *scope) error {
	var msg string
	switch s.run.kind {
	case runApplyPending:
		msg = "applying approved plan " + pendingPlan(s)
	case runDrift:
		msg = "checking for drift"
	case runDestroy:
		msg = "destroying"
	default:
		msg = "planning " + stackview.ShortRevision(s.source.revision)
	}
	s.observed.runStarted = &runAnnouncement{id: s.run.id, message: msg}
	summarizeProgress(s)
	return s.patcher.Patch(ctx, s.stack, progressConditions...)
}

// runInRunner waits for the runner (starting, or started only now after
// recovering from dead runs) and the module's load into it, then for its
// pod's labels, initialises the module and runs the kind's step.
func (r *Reconciler) runInRunner(ctx context.Context, s *scope, starting *runnerStart) error {
	sess, err := r.awaitRunner(ctx, s, starting)
	if sess == nil {
		return err
	}
	// Closed by finish, after the final status patch: the outcome is
	// visible without waiting for the pod to go. A runner the module
	// failed to load into is the run's all the same, for closeRun.
	run := s.run
	run.session, run.client, run.logf = sess, sess.Client(), runLogger(ctx, sess.ID())
	rctx := sess.Context()
	if err != nil {
		return err
	}
	if err := awaitLabels(rctx, s, sess); err != nil {
		return err
	}
	initDone := run.timings.Start(runphase.Init)
	initResult, err := run.client.Init(rctx, r.initRequest(s), run.logf)
	initDone()
	if err != nil {
		return classify(sess, err, failureReason(run.kind), "init failed")
	}
	s.observed.tool = r.runTool(ctx, sess, initResult)
	if err := r.stepFor(run.kind)(rctx, s); err != nil {
		return err
	}
	if p := s.observed.plan; p != nil && p.upToDate && !s.stack.Spec.PlanOnly {
		if err := r.reconcileRelease(rctx, s); err != nil {
			return err
		}
	}
	if err := r.afterRun(rctx, s, nil); err != nil {
		return err
	}
	// Every command returned its result: nothing runs in the runner, and
	// its pod can go without a grace period. The run stops being current
	// with the final status patch, before its pod goes.
	s.observed.runFinished = true
	if idle, ok := sess.(idleMarker); ok {
		idle.MarkIdle()
	}
	return nil
}

// closeRun removes the run's runner pod (unless the config retains it)
// and records where the run's time went.
func closeRun(ctx context.Context, s *scope) {
	if s.run == nil || s.run.session == nil {
		return
	}
	if err := s.run.session.Close(context.WithoutCancel(ctx)); err != nil {
		s.log.Error(err, "failed to remove runner pod")
	}
	s.run.session = nil
	observePhases(&s.run.timings, string(s.run.kind))
	s.log.Info("run finished", append([]any{"run", s.run.id, "kind", s.run.kind}, s.run.timings.KeysAndValues()...)...)
}

// stepFor is the work of each run kind.
func (r *Reconciler) stepFor(kind runKind) runStep {
	switch kind {
	case runApplyPending:
		return r.applyApproved
	case runDestroy:
		return r.destroy
	default:
		return r.plan
	}
}

// failureReason is the reason a failed command of a run kind is reported with.
func failureReason(kind runKind) string {
	switch kind {
	case runApplyPending:
		return ApplyFailedReason
	case runDestroy:
		return DestroyFailedReason
	}
	return PlanFailedReason
}

// mayHaveDeadRun says whether an earlier run of the Stack may have left a
// runner pod or a state lock (recover): its reconcile did not settle, or
// this controller process has not run the Stack yet (the last one may have
// stopped between the final status patch and removing the pod). A Stack
// whose last run finished every command (status.currentRun cleared: tofu
// released its lock) or that never ran has no lock to recover: its state
// was removed with any earlier Stack of its name; should a lock be left
// all the same (that Stack's finalizer removed by hand), its first run
// fails on it and the retry, no longer settled, releases it. It may have a
// pod, though (sweep): a runner is started while its run is announced, so
// a controller that stopped between the two left a pod of a run that no
// status names. Both hold until cleanedUpHere: a run that failed before
// it dealt with them leaves them to the next.
func (r *Reconciler) mayHaveDeadRun(s *scope) (recover, sweep bool) {
	_, seen := r.cleanedHere.Load(client.ObjectKeyFromObject(s.stack))
	if s.stack.Status.CurrentRun == "" {
		return false, !seen
	}
	return !seen || !lastRunSettled(s), false
}

// cleanedUpHere records that this process has dealt with what the Stack's
// runs in earlier processes may have left (recovered, or swept).
func (r *Reconciler) cleanedUpHere(s *scope) {
	r.cleanedHere.Store(client.ObjectKeyFromObject(s.stack), true)
}

// mustRecoverFirst says the run's runner may start only after
// recoverFromDeadRuns: pods and a lock of a dead run, or a lock kept on
// purpose (StateNotSaved), are dealt with before anything else.
func mustRecoverFirst(s *scope) bool {
	return s.run.recover || stalledWith(s.stack, StateNotSavedReason)
}

// recoverFromDeadRuns removes runner pods of earlier runs (a controller that
// restarted mid-run left them) and releases a state lock only such a run
// can hold: runs of one Stack never overlap. After a run that settled
// (its runner closed, tofu done with the lock) there is nothing to
// recover, and the List of pods and the lock read are skipped, unless the
// last apply's state is kept (StateNotSaved): that run's lock is then held
// until the state is pushed (holdForUnsavedState).
func (r *Reconciler) recoverFromDeadRuns(ctx context.Context, s *scope) error {
	// A lock kept on purpose is read even after a settled run.
	keptState := stalledWith(s.stack, StateNotSavedReason)
	if !mustRecoverFirst(s) {
		return nil
	}
	if s.run.recover {
		if err := r.cleanupEarlierRuns(ctx, s); err != nil {
			return fmt.Errorf("failed to remove runner pods of earlier runs: %w", err)
		}
	}
	if ownsBackend(s.stack) {
		return nil // its lock is the backend's: Terrace cannot tell whose it is
	}
	states := s.run.stores.States
	key := stateKey(s.stack)
	holder, err := states.GetLock(ctx, key)
	if err != nil || holder == nil {
		return err
	}
	if keptState {
		if err := holdForUnsavedState(s, holder); err != nil {
			return err
		}
	}
	if holder.Operation == migrate.LockOperation {
		// Never break a migration's lock: the copy would miss what we write.
		return reconcile.Waiting(StateMigrationPendingReason, migrationRecheck, fmt.Errorf("the state of %s is being copied to another backend (lock %s since %s)", key, holder.ID, holder.Created.Format(time.RFC3339)))
	}
	if err := states.ForceUnlock(ctx, key); err != nil {
		return fmt.Errorf("failed to release the state lock of a dead run: %w", err)
	}
	s.log.Info("released the state lock of a dead run", "lockID", holder.ID, "operation", holder.Operation, "created", holder.Created)
	r.normalEvent(s.stack, "StateUnlocked", "released the state lock held since %s by a run that is gone", holder.Created.Format(time.RFC3339))
	return nil
}

func stateKey(stack *terracev1.Stack) state.Key {
	return state.Key{Namespace: stack.Namespace, Stack: stack.Name, Workspace: stack.Spec.Workspace}
}

// loadSource gets the module into the runner, which verifies the digest.
// A Program's tarball, which resolveProgram built and checked against
// status.artifact, is uploaded over the run's connection: the runner would
// otherwise open a connection of its own to fetch the same bytes from the
// artifact server. spec.source.url tarballs are fetched by the runner
// itself, from its pod's network position; Flux artifacts, served by
// source-controller on a host the operator allowed, are downloaded here
// and streamed to the runner.
func (r *Reconciler) loadSource(ctx context.Context, src *source, cl *runner.Client) error {
	switch src.origin {
	case fromProgram:
		_, err := cl.Upload(ctx, src.digest, bytes.NewReader(src.data))
		return err
	case fromStackURL:
		_, err := cl.FetchExternal(ctx, src.url, src.digest)
		return err
	case fromFluxArtifact:
		return r.uploadFluxArtifact(ctx, src, cl)
	default:
		return fmt.Errorf("%s has no origin to load it from", src.description)
	}
}

// fluxFetchUserAgent names the controller to source-controller.
const fluxFetchUserAgent = "terrace-controller"

// uploadFluxArtifact streams a Flux artifact to the runner. Its host was
// checked by resolveFluxSource, and the source client refuses any other.
func (r *Reconciler) uploadFluxArtifact(ctx context.Context, src *source, cl *runner.Client) error {
	httpClient := artifact.NewSourceClient(r.Options.SourceArtifactHosts, fluxFetchUserAgent)
	defer httpClient.CloseIdleConnections()
	// Cancelling the upload ends the runner's side when the download fails.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body, err := artifact.Open(ctx, httpClient, src.url, maxSourceBytes)
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = cl.Upload(ctx, src.digest, body)
	return err
}

func (r *Reconciler) initRequest(s *scope) *runnerv1.InitRequest {
	if s.backend != nil {
		return &runnerv1.InitRequest{Path: s.stack.Spec.Path, Workspace: s.stack.Spec.Workspace, OwnBackend: s.backend}
	}
	addr := fmt.Sprintf("%s/state/%s/%s/%s", strings.TrimRight(r.Options.StateServerURL, "/"), s.stack.Namespace, s.stack.Name, s.stack.Spec.Workspace)
	return &runnerv1.InitRequest{
		Path:      s.stack.Spec.Path,
		Workspace: s.stack.Spec.Workspace,
		Files:     s.mappedFiles(),
		HttpBackend: &runnerv1.HTTPBackend{
			Address: addr, LockAddress: addr, UnlockAddress: addr,
		},
	}
}

// variables are the run's inputs as the runner takes them.
func (s *scope) variables() (*runnerv1.Variables, error) {
	js, err := json.Marshal(s.inputs.vars)
	if err != nil {
		return nil, fmt.Errorf("failed to encode variables: %w", err)
	}
	return &runnerv1.Variables{Json: js, Sensitive: s.inputs.sensitive, Files: s.stack.Spec.VarsFiles}, nil
}

// newPlanID names a plan after the generation it belongs to, unique per run.
func newPlanID(s *scope) string {
	h := sha256.Sum256([]byte(s.inputs.digest + "/" + s.run.id))
	return fmt.Sprintf("plan-%d-%s", s.stack.Generation, hex.EncodeToString(h[:])[:10])
}
