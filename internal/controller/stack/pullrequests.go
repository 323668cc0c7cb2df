package stack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pullrequest"
	"github.com/terrace-dev/terrace/internal/runnerpolicy"
)

// PullRequestReconciler plans the open pull requests of Stacks with
// spec.source.git.pullRequests and posts each plan to its pull request
// (docs/git-pull-requests.md). It is a reconciler of its own beside the
// Stack controller: its runs never touch the Stack's state lock, may run
// while the Stack's run runs, and it writes status.pullRequests only,
// through the optimistic-lock patcher, so it never overwrites what the
// Stack controller writes. It never calls the forge itself: the forge's
// API URL is the Stack author's choice and its token a Secret the
// controller does not read, so every forge call is made by a runner pod of
// the Stack's namespace (pullrequests_runs.go).
type PullRequestReconciler struct {
	// Stacks is the Stack controller, whose clients, settings and helpers
	// (inputs, access reviews, the state server's address) are shared.
	Stacks *Reconciler
	Runs   PullRequestRuns
	// ProviderMirror is passed to every runner.
	ProviderMirror string
	// MaxConcurrentPlans bounds the plan runs of one Stack at once (0: 2).
	MaxConcurrentPlans int
}

// Defaults of pull-request plans.
const (
	defaultPullRequestInterval = time.Minute
	defaultConcurrentPlans     = 2
	// stalePullRequestRecheck: a head pushed to during its plan is planned
	// again this soon.
	stalePullRequestRecheck = time.Second
)

// Event reasons of pull-request plans.
const (
	PullRequestPlansFailedReason = "PullRequestPlansFailed"
	PullRequestPlannedReason     = "PullRequestPlanned"
)

// SetupWithManager registers the reconciler with mgr.
func (r *PullRequestReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("stack-pullrequests").
		For(&terracev1.Stack{}, builder.WithPredicates(outcome.GenerationOrRequestChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2, RecoverPanic: ptrTo(true)}).
		Complete(r)
}

func ptrTo[T any](v T) *T { return &v }

func (r *PullRequestReconciler) now() time.Time { return r.Stacks.now() }

// pullRequestsOf is the Stack's pull-request settings when its pull
// requests are to be planned now.
func pullRequestsOf(stack *terracev1.Stack) *terracev1.GitPullRequests {
	g := stack.Spec.Source.Git
	if g == nil || g.PullRequests == nil || !g.PullRequests.Enabled || stack.Spec.Suspend || !stack.DeletionTimestamp.IsZero() {
		return nil
	}
	return g.PullRequests
}

// Reconcile asks the forge for the Stack's open pull requests, decides
// what each needs (pullrequest.Decide), records that in
// status.pullRequests, and plans each head that needs it, posting the
// result. A reconcile's runs end within it; the next comes at the
// interval, or at once on a reconcile request (the webhook receiver's).
func (r *PullRequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	stack := &terracev1.Stack{}
	if err := r.Stacks.Client.Get(ctx, req.NamespacedName, stack); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	log := ctrl.LoggerFrom(ctx).WithValues("stack", klog.KObj(stack))
	ctx = ctrl.LoggerInto(ctx, log)
	patcher := &lockedPatcher{p: outcome.NewStatusPatcher(r.Stacks.Client, stack), stack: stack}

	settings := pullRequestsOf(stack)
	if settings == nil {
		// Turned off (or suspended, or going away): nothing is planned and
		// nothing remembered. The runs of a reconcile end within it, so
		// nothing else is left but the entries.
		if len(stack.Status.PullRequests) == 0 {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, patcher.update(ctx, func(st *terracev1.Stack) { st.Status.PullRequests = nil })
	}
	interval := defaultPullRequestInterval
	if settings.Interval != nil && settings.Interval.Duration > 0 {
		interval = settings.Interval.Duration
	}
	p, err := r.resolve(ctx, stack, settings, log)
	if err != nil {
		return r.failed(stack, interval, err)
	}

	forge, err := r.openForge(ctx, p)
	if err != nil {
		return r.failed(stack, interval, err)
	}
	defer forge.close(ctx)
	open, err := forge.list(ctx)
	if err != nil {
		return r.failed(stack, interval, err)
	}

	status := interruptedRuns(stack.Status.PullRequests)
	decisions := pullrequest.Decide(settings.Trigger, stack.Spec.Path, status, open)
	var runs []pullRequestPlanRun
	if err := patcher.update(ctx, func(st *terracev1.Stack) {
		st.Status.PullRequests, runs = nextPullRequests(stack.Spec.Path, status, decisions, newPullRequestRunID)
	}); err != nil {
		return ctrl.Result{}, err
	}
	stale := r.planAll(ctx, p, forge, patcher, runs)
	if stale {
		return ctrl.Result{RequeueAfter: stalePullRequestRecheck}, nil
	}
	return ctrl.Result{RequeueAfter: interval}, nil
}

// planAll runs the plans, a few at a time, and posts each: pending when it
// starts, then its result. It reports whether a head moved meanwhile.
func (r *PullRequestReconciler) planAll(ctx context.Context, p *pullRequestScope, forge *forgeSession, patcher *lockedPatcher, runs []pullRequestPlanRun) (stale bool) {
	limit := r.MaxConcurrentPlans
	if limit <= 0 {
		limit = defaultConcurrentPlans
	}
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			if err := forge.publish(ctx, run.pr, terracev1.PullRequestPlanPending, pullRequestPlanResult{}, ""); err != nil {
				p.log.Error(err, "failed to post the pending plan", "pullRequest", run.pr.Number)
			}
			res, human := r.planPullRequest(ctx, p, run)
			if err := patcher.update(ctx, func(st *terracev1.Stack) { pullRequestPlanned(st.Status.PullRequests, run.pr.Number, run.runID, res) }); err != nil {
				p.log.Error(err, "failed to record the plan", "pullRequest", run.pr.Number)
			}
			if res.stale {
				mu.Lock()
				stale = true
				mu.Unlock()
				return
			}
			st := terracev1.PullRequestPlanPlanned
			if res.failed {
				st = terracev1.PullRequestPlanFailed
			}
			p.log.Info("pull request planned", "pullRequest", run.pr.Number, "head", run.pr.HeadSHA, "status", st, "add", res.add, "change", res.change, "destroy", res.destroy)
			if err := forge.publish(ctx, run.pr, st, res, human); err != nil {
				p.log.Error(err, "failed to post the plan", "pullRequest", run.pr.Number)
			}
		}()
	}
	wg.Wait()
	return stale
}

// resolve gathers what the runs need: the effective config under the
// pull-request ServiceAccount, the access reviews of every Secret the
// pods get, and the Stack's inputs.
func (r *PullRequestReconciler) resolve(ctx context.Context, stack *terracev1.Stack, settings *terracev1.GitPullRequests, log logr.Logger) (*pullRequestScope, error) {
	s := &scope{stack: stack, log: log, source: resolveGitSource(stack)}
	eff, err := r.Stacks.Configs.Resolve(ctx, stack)
	if err != nil {
		return nil, fmt.Errorf("failed to resolve the TerraceConfig for %s: %w", stack.Namespace, err)
	}
	if settings.ServiceAccountName != "" {
		eff.ServiceAccountName, eff.ServiceAccountField = settings.ServiceAccountName, "spec.source.git.pullRequests.serviceAccountName"
	}
	s.config = eff
	if stack.Spec.Backend != nil {
		// Its credentials would reach the pull request's code, and that
		// backend's server cannot be told to allow reads only.
		return nil, outcome.Terminalf(PullRequestPlansFailedReason, "pull requests are not planned for a Stack with spec.backend: only Terrace's state server gives a pull request's run read-only access")
	}
	if err := checkRunnerPolicy(s); err != nil {
		return nil, err
	}
	if err := r.Stacks.checkRunnerAccess(ctx, s); err != nil {
		return nil, err
	}
	sa := runnerServiceAccount(s)
	ok, err := r.Stacks.serviceAccountMay(ctx, sa, stack.Namespace, runnerpolicy.Access{Verb: "get", Resource: "secrets", Name: settings.SecretRef.Name})
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, outcome.Terminal(RunnerObjectForbiddenReason, runnerAccessError(stack.Namespace, sa, []runnerpolicy.Reference{{
			Access: runnerpolicy.Access{Verb: "get", Resource: "secrets", Name: settings.SecretRef.Name},
			Fields: []string{"spec.source.git.pullRequests.secretRef"},
		}}))
	}
	if err := r.Stacks.gatherInputs(ctx, s); err != nil {
		return nil, err
	}
	if _, err := r.Stacks.gatherFileMappings(ctx, s); err != nil {
		return nil, err
	}
	base := defaultGitBranch
	if ref := stack.Spec.Source.Git.Ref; ref != nil {
		switch {
		case ref.Branch != "":
			base = ref.Branch
		case ref.Tag != "" || ref.SemVer != "" || ref.Commit != "":
			return nil, outcome.Terminalf(PullRequestPlansFailedReason, "pull requests are planned for a Stack that follows a branch; spec.source.git.ref names no branch")
		}
	}
	return &pullRequestScope{scope: s, settings: settings, base: base}, nil
}

// newPullRequestRunID names a plan run (pod name, certificate).
func newPullRequestRunID() string { return launcher.NewRunID() }

// defaultGitBranch is the branch of a Git source without a ref.
const defaultGitBranch = "main"

// failed reports a reconcile that could not look at the pull requests: a
// Warning event (status.pullRequests keeps what it knew) and, whatever the
// kind, the next look at the interval, so a forge or a Secret that is
// fixed is picked up without a retry storm.
func (r *PullRequestReconciler) failed(stack *terracev1.Stack, interval time.Duration, err error) (ctrl.Result, error) {
	var terminal *outcome.TerminalError
	if !errors.As(err, &terminal) && apierrors.IsConflict(err) {
		return ctrl.Result{}, err
	}
	r.Stacks.Recorder.Eventf(stack, nil, corev1.EventTypeWarning, PullRequestPlansFailedReason, PullRequestPlansFailedReason, "%s", clipMessage(err.Error()))
	return ctrl.Result{RequeueAfter: interval}, nil
}

func isPatchConflict(err error) bool {
	return apierrors.IsConflict(errors.Unwrap(err)) || apierrors.IsConflict(err)
}

// lockedPatcher lets the plan runs of one reconcile, which end
// concurrently, write their results one at a time.
type lockedPatcher struct {
	mu    sync.Mutex
	p     *outcome.StatusPatcher
	stack *terracev1.Stack
}

func (l *lockedPatcher) update(ctx context.Context, change func(*terracev1.Stack)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	change(l.stack)
	return l.p.Patch(ctx, l.stack)
}
