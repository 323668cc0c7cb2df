package stack

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pullrequest"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/warmpool"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// A pull request's plan takes two kinds of runner pods, both with the
// read-only identity and under the pull-request ServiceAccount:
//   - the forge pod asks the forge for the open pull requests and posts
//     the plans: it has the forge's token mounted and runs no module code;
//   - a plan pod per pull request head clones it, inits against the
//     Stack's state (read-only) and plans with -lock=false: it runs the
//     pull request's code, so it gets the git credentials but never the
//     forge's token.

// PullRequestRuns starts the runner pods of pull-request plans.
type PullRequestRuns interface {
	Start(ctx context.Context, spec launcher.RunSpec) (runSession, error)
}

// LauncherPullRequestRuns starts them with the launcher of the Stacks' own
// runs (so its cleanup of a Stack's leftovers knows them) and never on a
// warm pod.
type LauncherPullRequestRuns struct{ Launcher *launcher.Launcher }

// Start implements PullRequestRuns.
func (l LauncherPullRequestRuns) Start(ctx context.Context, spec launcher.RunSpec) (runSession, error) {
	run, err := l.Launcher.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return launchedRun{Run: run}, nil
}

// pullRequestScope is what one reconcile of a Stack's pull requests shares.
type pullRequestScope struct {
	*scope
	settings *terracev1.GitPullRequests
	// base is the branch the Stack follows, which pull requests target.
	base string
}

func (p *pullRequestScope) runSpec(mirror, runID string) launcher.RunSpec {
	spec := warmpool.SpecFor(p.config, mirror)
	spec.Stack, spec.RunID, spec.ReadOnly, spec.Retain = p.stack, runID, true, false
	return spec
}

func (p *pullRequestScope) forge() *runnerv1.Forge {
	return &runnerv1.Forge{
		Provider: string(p.settings.Provider), ApiUrl: p.settings.APIURL,
		RepositoryUrl: p.stack.Spec.Source.Git.URL, CredentialsDir: launcher.ForgeCredentialsPath,
	}
}

// forgeSession is the forge pod of one reconcile. Its runner takes one
// call at a time.
type forgeSession struct {
	mu   sync.Mutex
	sess runSession
	p    *pullRequestScope
}

func (r *PullRequestReconciler) openForge(ctx context.Context, p *pullRequestScope) (*forgeSession, error) {
	spec := p.runSpec(r.ProviderMirror, launcher.NewRunID())
	spec.ForgeSecretName, spec.NoGitCredentials = p.settings.SecretRef.Name, true
	sess, err := r.Runs.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("failed to start the runner that asks the forge: %w", err)
	}
	return &forgeSession{sess: sess, p: p}, nil
}

func (f *forgeSession) close(ctx context.Context) {
	if err := f.sess.Close(context.WithoutCancel(ctx)); err != nil {
		f.p.log.Error(err, "failed to remove the forge runner pod")
	}
}

// list asks for the open pull requests into the Stack's branch.
func (f *forgeSession) list(ctx context.Context) ([]pullrequest.Observed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp, err := f.sess.Client().ListPullRequests(ctx, &runnerv1.ListPullRequestsRequest{
		Forge: f.p.forge(), Base: f.p.base,
		PlanCommands: f.p.settings.Trigger == terracev1.PullRequestTriggerComment,
	})
	if err != nil {
		return nil, fmt.Errorf("failed to list the pull requests into %s: %s", f.p.base, runnerMessage(err))
	}
	var out []pullrequest.Observed
	for _, o := range resp.GetPullRequests() {
		out = append(out, pullrequest.Observed{
			Number: o.GetNumber(), Title: o.GetTitle(), URL: o.GetUrl(), HeadSHA: o.GetHeadSha(), HeadBranch: o.GetHeadBranch(),
			Files: o.GetFiles(), FilesComplete: o.GetFilesComplete(), AuthorCanWrite: o.GetAuthorCanWrite(), PlanCommanded: o.GetPlanCommanded(),
		})
	}
	return out, nil
}

// publish posts a plan (or that one is pending) to its pull request.
func (f *forgeSession) publish(ctx context.Context, pr pullrequest.Observed, st string, res pullRequestPlanResult, human string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.sess.Client().PublishPullRequestPlan(ctx, &runnerv1.PublishPullRequestPlanRequest{
		Forge: f.p.forge(), Number: pr.Number, HeadSha: pr.HeadSHA,
		Namespace: f.p.stack.Namespace, Stack: f.p.stack.Name, Revision: pullrequest.Revision(pr),
		Status: st, Add: res.add, Change: res.change, Destroy: res.destroy, Message: res.message, Plan: human,
	})
	if err != nil {
		return fmt.Errorf("failed to post the plan to pull request #%d: %s", pr.Number, runnerMessage(err))
	}
	return nil
}

// pullRef is the ref a forge keeps a pull request's head under.
func pullRef(provider terracev1.GitProvider, number int64) string {
	if provider == terracev1.GitProviderGitLab {
		return "refs/merge-requests/" + strconv.FormatInt(number, 10) + "/head"
	}
	return "refs/pull/" + strconv.FormatInt(number, 10) + "/head"
}

// maxHumanPlan bounds the human plan carried to the forge pod; the
// comment's limit (64 Ki characters on GitHub and Gitea) cuts it further.
const maxHumanPlan = 1 << 20

// planPullRequest runs one pull request head's plan in a plan pod of its
// own and returns how it ended with the redacted human plan. It never
// applies, writes no output and keeps no plan: the pod is removed at the
// end and with it the plan file.
func (r *PullRequestReconciler) planPullRequest(ctx context.Context, p *pullRequestScope, run pullRequestPlanRun) (pullRequestPlanResult, string) {
	failed := func(err error) (pullRequestPlanResult, string) {
		return pullRequestPlanResult{failed: true, message: err.Error(), at: r.now()}, ""
	}
	sess, err := r.Runs.Start(ctx, p.runSpec(r.ProviderMirror, run.runID))
	if err != nil {
		return failed(fmt.Errorf("failed to start the plan's runner: %w", err))
	}
	defer func() {
		if err := sess.Close(context.WithoutCancel(ctx)); err != nil {
			p.log.Error(err, "failed to remove the pull request's runner pod", "run", run.runID)
		}
	}()
	rctx, cl, logf := sess.Context(), sess.Client(), runLogger(ctx, run.runID)
	if l, ok := sess.(labelWaiter); ok {
		if err := l.Labelled(rctx); err != nil {
			return failed(err)
		}
	}
	dir := ""
	if p.stack.Spec.Source.Git.SecretRef != nil {
		dir = launcher.GitCredentialsPath
	}
	ref := &runnerv1.GitRef{Branch: run.pr.HeadBranch, Commit: run.pr.HeadSHA, PullRef: pullRef(p.settings.Provider, run.pr.Number)}
	if _, err := cl.Clone(rctx, p.stack.Spec.Source.Git.URL, ref, dir); err != nil {
		if runner.Reason(err) == runner.ReasonPlanStale {
			return pullRequestPlanResult{stale: true, message: runnerMessage(err), at: r.now()}, ""
		}
		return failed(fmt.Errorf("clone failed: %s", runnerMessage(err)))
	}
	if _, err := cl.Init(rctx, r.Stacks.initRequest(p.scope), logf); err != nil {
		return failed(fmt.Errorf("init failed: %s", runnerMessage(err)))
	}
	vars, err := p.variables()
	if err != nil {
		return failed(err)
	}
	plan, err := cl.Plan(rctx, &runnerv1.PlanRequest{Variables: vars, NoLock: true}, logf)
	if err != nil {
		return failed(fmt.Errorf("plan failed: %s", runnerMessage(err)))
	}
	sum := plan.GetSummary()
	res := pullRequestPlanResult{add: sum.GetAdd(), change: sum.GetChange(), destroy: sum.GetDestroy(), at: r.now()}
	human, err := cl.ShowPlan(rctx, plan.GetPlanId(), runnerv1.PlanFormat_PLAN_FORMAT_HUMAN)
	if err != nil {
		p.log.Error(err, "failed to read the pull request's plan as text", "run", run.runID)
	}
	if len(human) > maxHumanPlan {
		human = human[:maxHumanPlan]
	}
	return res, string(human)
}
