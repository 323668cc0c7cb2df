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

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/stackview"
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
	ProgressingReason       = outcome.ProgressingReason
	PlanNoLongerValidReason = "PlanNoLongerValid"
)

// maxSourceBytes bounds tarballs the controller downloads for runners.
const maxSourceBytes = 256 << 20

// newRun opens the stores of a run of kind and names it; the run's
// actions (announce, recoverDeadRun, awaitRunner, initialise, then the
// kind's own) follow from decideAndAct.
func (r *Reconciler) newRun(ctx context.Context, s *scope, kind runKind) error {
	s.observed.kind = kind
	stores, err := r.openStores(ctx, s.stack.Namespace)
	if err != nil {
		return err
	}
	recover, sweep := r.mayHaveDeadRun(s)
	s.run = &runScope{kind: kind, id: r.newRunID(s), stores: stores, recover: recover, sweep: sweep, previous: s.stack.Status.CurrentRun}
	s.run.facts = runFacts{kind: kind, recoverFirst: recover, planOnly: s.stack.Spec.PlanOnly,
		autoApprove: approved(s.stack.Spec.ApprovePlan, "")}
	if kind == runApplyPending {
		pinGitCommit(s)
	}
	return nil
}

// runToTheEnd decides and acts within the run's timeout until the run
// ends. A start abandoned before its announcement landed gives its runner
// to the run, so that closeRun removes its pod.
func (r *Reconciler) runToTheEnd(ctx context.Context, s *scope) error {
	timeout := r.runTimeout(s)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if !s.run.facts.announced { // the announcement failed, or panicked
			s.run.starting.abandon(s)
		}
	}()
	err := r.decideAndAct(ctx, s)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the run was stopped after spec.timeout (%s); raise spec.timeout if it needs longer: %w", timeout, err)
	}
	return err
}

// announce makes the run visible before it starts (runs take minutes)
// through the reconcile's own patcher, and starts its runner meanwhile
// (startRunner), unless a dead run must be dealt with first. It records
// status.currentRun before the runner exists: the run's certificate opens
// the state only while it is the Stack's current run. Conditions change
// only for a run that may change something (markProgress).
func (r *Reconciler) announce(ctx context.Context, s *scope) error {
	var msg string
	switch s.run.kind {
	case runApplyPending:
		msg = "applying approved plan " + pendingPlan(s)
	case runDrift:
		msg = "checking for drift"
	case runSourceCheck:
		msg = "looking for a new commit in " + s.source.description
	case runDestroy:
		msg = "destroying"
	default:
		msg = "planning " + stackview.ShortRevision(s.source.revision)
	}
	if !s.run.facts.recoverFirst {
		s.run.starting = r.startRunner(ctx, s)
	}
	s.observed.runStarted = &runAnnouncement{id: s.run.id, message: msg}
	summarizeProgress(s, r.reannounces(s), r.mayChangeInfrastructure(s))
	if err := s.patcher.Patch(ctx, s.stack, progressConditions...); err != nil {
		return err
	}
	s.run.facts.announced = true
	return nil
}

// mayChangeInfrastructure says the run about to start may change the
// Stack's resources: an approved plan's apply, a destroy, or a plan of new
// inputs that approvePlan auto applies. Drift checks and plans of the
// inputs already applied change nothing unless they find drift.
func (r *Reconciler) mayChangeInfrastructure(s *scope) bool {
	switch s.run.kind {
	case runApplyPending, runDestroy:
		return true
	case runPlan:
		return r.inOnePass(s) || (s.run.facts.autoApprove && !s.stack.Spec.PlanOnly && s.recorded().LastAppliedInputsDigest != s.inputs.digest)
	}
	return false
}

// reannounces says the run's announcement changes the Stack's conditions:
// a run of new inputs or of a new generation, or one that may change
// something. A drift check, or a plan of what is applied, only records
// status.currentRun: a Stack that is Ready stays Ready while it is checked.
func (r *Reconciler) reannounces(s *scope) bool {
	st := s.recorded()
	return r.mayChangeInfrastructure(s) || (s.run.kind == runPlan &&
		(st.LastAppliedInputsDigest != s.inputs.digest || st.ObservedGeneration != s.stack.Generation))
}

// finishRun ends a run every command of which returned: nothing runs in
// the runner, and its pod can go without a grace period. The run stops
// being current with the final status patch, before its pod goes.
func (r *Reconciler) finishRun(_ context.Context, s *scope) error {
	s.run.facts.finished = true
	s.observed.runFinished = true
	if idle, ok := s.run.session.(idleMarker); ok {
		idle.MarkIdle()
	}
	return nil
}

// initialise waits for the run's pod's labels (the state server takes the
// run's certificate only from a labelled pod) and runs init.
func (r *Reconciler) initialise(ctx context.Context, s *scope) error {
	run := s.run
	rctx := run.session.Context()
	if err := awaitLabels(rctx, s, run.session); err != nil {
		return err
	}
	initDone := run.timings.Start(runphase.Init)
	initResult, err := run.client.Init(rctx, r.initRequest(s), run.logf)
	initDone()
	if err != nil {
		return classify(run.session, err, failureReason(run.kind), "init failed")
	}
	s.observed.tool = r.runTool(ctx, run.session, initResult)
	run.facts.initialised = true
	return nil
}

// runContext is the context of the run's runner commands: the session's,
// which ends with the runner.
func runContext(s *scope) context.Context { return s.run.session.Context() }

// closeRun removes the run's runner pod (unless the config retains it)
// and records where the run's time went.
func (r *Reconciler) closeRun(ctx context.Context, s *scope) {
	if s.run == nil || s.run.session == nil {
		return
	}
	recordUsage(ctx, s)
	if err := s.run.session.Close(context.WithoutCancel(ctx)); err != nil {
		s.log.Error(err, "failed to remove runner pod")
	}
	s.run.session = nil
	r.closedHere.Store(client.ObjectKeyFromObject(s.stack), s.run.id)
	observePhases(&s.run.timings, string(s.run.kind))
	s.log.Info("run finished", append([]any{"run", s.run.id, "kind", s.run.kind}, s.run.timings.KeysAndValues()...)...)
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
	case fromGit:
		return cloneInto(ctx, src, cl)
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
