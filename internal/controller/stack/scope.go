package stack

import (
	"time"

	"github.com/go-logr/logr"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/runphase"
	"github.com/terrace-dev/terrace/internal/settings"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// scope is what the steps of one reconcile share. Steps fill in what they
// resolved (config, source, inputs) and what they saw (observed); only
// summarize (status.go) turns that into the Stack's status.
type scope struct {
	stack *terracev1.Stack
	log   logr.Logger
	// patcher is the reconcile's one status patcher: the deferred
	// summarize and the announcement of a run both write through it.
	patcher *outcome.StatusPatcher

	config settings.Effective
	source *source
	inputs *inputs
	// options are the run options, mapped files and plan policies.
	options *runOptions
	// backend is spec.backend with its credentials, as the runner takes it;
	// nil when the state is on Terrace's state server.
	backend *runnerv1.OwnBackend
	// backendVersions are spec.backend's credentials by Secret version,
	// for the digest.
	backendVersions []string
	// run is the run in progress, while a runner is in use.
	run      *runScope
	observed observations
	// current: this reconcile wrote the Stack (its finalizer) or read it
	// from the API server, so its cache needs no check before a run.
	current bool
	// walk is the states and actions this reconcile went through, in
	// order ("OutOfSync→startPlanRun"), for logs and tests.
	walk []string
}

// runScope is one run: its runner session and the stores it writes.
type runScope struct {
	kind   runKind
	id     string
	stores *storeSet
	// recover: an earlier run may have died (the last reconcile did not
	// settle), so its pod and state lock may be left.
	recover bool
	// sweep: the Stack never had a run announced and this process has not
	// run it, so a pod of a run whose announcement never landed may be left.
	sweep bool
	// previous is the run that was current before this one, whose pod and
	// TLS Secret recovery removes by name.
	previous string
	session  runSession
	client   *runner.Client
	logf     runner.LogFunc
	// timings say where the run's time went (runphase names the phases).
	timings runphase.Timings
	// after is the state as the run left it, read once (stateAfterRun).
	after *stateRead
	// facts are what the run's actions observed, for determineState.
	facts runFacts
	// starting is the runner started beside the announcement, or nil.
	starting *runnerStart
	// lockHolder is the state lock recoverDeadRun found.
	lockHolder *state.LockInfo
	// record is the plan being applied, applyErr how its apply failed.
	record   planRecord
	applyErr error
	// policyErr is the policies' denial of the plan, stateTooLarge the
	// refusal of a plan whose state would be over the limit.
	policyErr     error
	stateTooLarge error
}

// stateRead is one read of a Stack's state.
type stateRead struct {
	state *state.State
	err   error
}

// observations are what the steps saw. Status is derived from them in one
// place, summarize; a step never writes the Stack's status itself.
type observations struct {
	// kind is what this reconcile decided to run (runNothing included).
	kind      runKind
	suspended bool
	// staleCache: a run was due but the cached Stack was older than the
	// API server's; nothing was done and the reconcile is retried.
	staleCache     bool
	dependencyWait string
	// requeueAfter is when a settled Stack looks again (next drift check).
	requeueAfter time.Duration

	// discardedPlan is a waiting plan made from inputs that moved on.
	discardedPlan string
	// lostPlan is an approved plan no longer stored.
	lostPlan string
	// runStarted: a run was announced (status.currentRun) with progress.
	runStarted *runAnnouncement
	// runFinished: every command of the announced run returned its result,
	// so nothing of it goes on in its runner and it is no longer current.
	runFinished bool
	// attempted is the source revision a runner was started for.
	attempted string
	// git is the commit a runner cloned (status.git), gitCheckedAt when
	// a runner last looked at the Git ref, cloned or not.
	git          *terracev1.GitStatus
	gitCheckedAt *time.Time
	tool         runTool

	plan *planObservation
	// applied is the apply that succeeded in this reconcile.
	applied *applyObservation
	// release is the release recorded in this reconcile, failed or not.
	release *release.Release
	// outputsSecret is the outputs Secret written ("" after removing it),
	// nil when outputs were not touched.
	outputsSecret *string
	drift         driftObservation
	// health is the outcome of the health checks run in this reconcile.
	health *healthObservation
	// inventory is the state's resources after this reconcile's run.
	inventory *terracev1.Inventory
}

// runAnnouncement is what a run says while it runs.
type runAnnouncement struct {
	id      string
	message string
}

// planObservation is a plan made in this reconcile.
type planObservation struct {
	id         string
	summary    *runnerv1.PlanSummary
	hasChanges bool
	at         time.Time
	// upToDate: no changes, and the outputs Secret is in line with the spec.
	upToDate bool
	// keptForApproval: stored, waiting for spec.approvePlan to name it.
	keptForApproval bool
	// planOnly: spec.planOnly; reported, never applied.
	planOnly bool
	// destroy: the plan of a destroy run (destroyOnDelete under policies).
	destroy bool
	// policy is the plan policies' decision, when they were asked.
	policy *terracev1.PlanPolicyStatus
}

// applyObservation is a successful apply.
type applyObservation struct {
	outputs []string
}

// driftObservation is what a plan said about changes made outside Terrace.
type driftObservation struct {
	// checked: this reconcile's plan counted as a drift check.
	checked bool
	// found: the world moved away from the last applied inputs.
	found bool
	// at is when it was checked.
	at time.Time
}

// awaitingApproval reports a plan waiting for a person, made now or before.
func (o *observations) awaitingApproval() bool {
	return o.kind == runAwaitApproval || (o.plan != nil && o.plan.keptForApproval)
}
