package stack

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/stackview"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// A Git source (spec.source.git) is cloned by the runner, so its commit is
// known only once a run's runner has cloned it. Until then the Stack is
// taken to be at the commit the last clone resolved (status.git.revision):
// the desired-state digest names that commit, and a run is due when that
// digest was not applied, when the spec or a request asks, or, for a
// branch or semver range, an interval after the last look (status.git.
// checkedAt). The run's first step after the clone (StateSourceCloned)
// puts the cloned commit in place of the assumed one and decides again: a
// check whose commit was applied already ends there (StateSourceUnchanged),
// any other run plans the commit it cloned.

// Condition reasons of a Git source.
const (
	// SourceRefNotFoundReason: the repository, or its branch, tag, commit
	// or a tag in the semver range, does not exist.
	SourceRefNotFoundReason = "SourceRefNotFound"
	// SourceAuthFailedReason: the server refused the credentials of
	// spec.source.git.secretRef, or asked for some.
	SourceAuthFailedReason = "SourceAuthFailed"
	// SourceHostKeyUnknownReason: the ssh host key is not the one the
	// Secret's known_hosts names.
	SourceHostKeyUnknownReason = "SourceHostKeyUnknown"
)

// gitClone is what a run's runner clones.
type gitClone struct {
	ref *runnerv1.GitRef
	// credentials: spec.source.git.secretRef is mounted in the runner pod.
	credentials bool
	// pinned: the run must deploy exactly the assumed commit (an approved
	// plan's apply), not whatever the ref now names.
	pinned bool
	// cloned is the runner's answer, once the clone succeeded. Written by
	// the goroutine that loads the runner, read after it is done.
	cloned *runnerv1.CloneResponse
}

// resolveGitSource is the Stack's Git source at the commit the last clone
// resolved, when that clone was of the ref the spec names now.
func resolveGitSource(stack *terracev1.Stack) *source {
	g := stack.Spec.Source.Git
	ref := gitRef(g.Ref)
	var revision string
	if st := stack.Status.Git; st != nil && revisionOfRef(st.Revision, ref) {
		revision = st.Revision
	}
	return &source{
		description: fmt.Sprintf("Git repository %s (%s)", describeURL(g.URL), describeGitRef(ref)),
		url:         g.URL,
		digest:      gitDigest(revision),
		revision:    revision,
		origin:      fromGit,
		git:         &gitClone{ref: ref, credentials: g.SecretRef != nil},
	}
}

// gitRef is the spec's ref as the runner takes it: the branch main when
// none is set.
func gitRef(r *terracev1.GitRef) *runnerv1.GitRef {
	if r == nil || (r.Branch == "" && r.Tag == "" && r.SemVer == "" && r.Commit == "") {
		return &runnerv1.GitRef{Branch: "main"}
	}
	return &runnerv1.GitRef{Branch: r.Branch, Tag: r.Tag, Semver: r.SemVer, Commit: r.Commit}
}

func describeGitRef(r *runnerv1.GitRef) string {
	switch {
	case r.GetCommit() != "" && r.GetBranch() != "":
		return fmt.Sprintf("commit %s on branch %s", r.GetCommit(), r.GetBranch())
	case r.GetCommit() != "":
		return "commit " + r.GetCommit()
	case r.GetTag() != "":
		return "tag " + r.GetTag()
	case r.GetSemver() != "":
		return "semver " + r.GetSemver()
	}
	return "branch " + r.GetBranch()
}

// revisionOfRef says a revision ("<name>@sha1:<hex>" or "sha1:<hex>")
// can be what ref resolves to.
func revisionOfRef(revision string, ref *runnerv1.GitRef) bool {
	name, hash := stackview.SplitRevision(revision)
	switch {
	case hash == "":
		return false
	case ref.GetCommit() != "":
		return hash == ref.GetCommit() && name == ref.GetBranch()
	case ref.GetTag() != "":
		return name == ref.GetTag()
	case ref.GetSemver() != "":
		return name != ""
	}
	return name == ref.GetBranch()
}

// gitDigest names a commit's content in the desired-state digest. A
// commit's hash fixes its tree, and the runner builds the same tarball of
// the same tree every time, so the commit stands for the tarball's digest
// before any clone, on every replica. "" when no commit is known.
func gitDigest(revision string) string {
	if _, hash := stackview.SplitRevision(revision); hash != "" {
		return "git:sha1:" + hash
	}
	return ""
}

// followsRef says the Stack's Git ref can move to another commit: a
// branch, tag or semver range (a commit never does), so it is looked at
// again every interval.
func followsRef(stack *terracev1.Stack) bool {
	g := stack.Spec.Source.Git
	return g != nil && (g.Ref == nil || g.Ref.Commit == "")
}

// gitCheckDue says an interval passed since a runner last looked at the ref.
func gitCheckDue(stack *terracev1.Stack, interval time.Duration, now time.Time) bool {
	if !followsRef(stack) {
		return false
	}
	st := stack.Status.Git
	return st == nil || st.CheckedAt == nil || !now.Before(st.CheckedAt.Add(interval))
}

// untilGitCheck is how long until the next look at the ref, or 0 when the
// Stack follows none.
func untilGitCheck(stack *terracev1.Stack, interval time.Duration, now time.Time) time.Duration {
	if !followsRef(stack) {
		return 0
	}
	st := stack.Status.Git
	if st == nil || st.CheckedAt == nil {
		return interval
	}
	return st.CheckedAt.Add(interval).Sub(now)
}

// pinGitCommit makes the run clone exactly the assumed commit: an
// approved plan is applied to the module it was made from, whatever the
// branch holds now.
func pinGitCommit(s *scope) {
	src := s.source
	if src == nil || src.git == nil {
		return
	}
	name, hash := stackview.SplitRevision(src.revision)
	if hash == "" {
		return
	}
	ref := src.git.ref
	switch {
	case ref.GetTag() != "" || ref.GetSemver() != "":
		// A tag names one commit; adoptClonedSource checks it still does.
		src.git.ref = &runnerv1.GitRef{Tag: name}
	default:
		src.git.ref = &runnerv1.GitRef{Branch: name, Commit: hash}
	}
	src.git.pinned = true
}

// cloneInto has the runner clone the repository, reading the credentials
// from where the launcher mounted the Secret: the controller neither
// reads them nor connects to the repository.
func cloneInto(ctx context.Context, src *source, cl *runner.Client) error {
	dir := ""
	if src.git.credentials {
		dir = launcher.GitCredentialsPath
	}
	resp, err := cl.Clone(ctx, src.url, src.git.ref, dir)
	if err != nil {
		return err
	}
	src.git.cloned = resp
	return nil
}

// startSourceCheckRun starts a run that clones the ref to see whether it
// moved: a new commit makes it a plan of it.
func (r *Reconciler) startSourceCheckRun(ctx context.Context, s *scope) error {
	return r.startRun(ctx, s, runSourceCheck)
}

// adoptClonedSource puts the commit the runner cloned in place of the
// assumed one, and with it the desired-state digest; a check or drift
// run whose commit was not applied becomes a plan of it.
func (r *Reconciler) adoptClonedSource(_ context.Context, s *scope) error {
	run, src := s.run, s.source
	c := src.git.cloned
	run.facts.sourceCloned = false
	revision := c.GetCommit().GetRevision()
	if src.git.pinned && gitDigest(revision) != src.digest {
		return outcome.Terminalf(PlanNoLongerValidReason, "%s now names %s, not %s, which the approved plan was made from; approve the new plan once it is made",
			src.description, revision, src.revision)
	}
	src.revision, src.digest = revision, gitDigest(revision)
	s.inputs.digest = desiredDigest(s)
	s.observed.attempted = revision
	s.observed.git = gitStatusOf(c.GetCommit())
	if s.recorded().LastAppliedInputsDigest == s.inputs.digest {
		run.facts.sourceUnchanged = run.kind == runSourceCheck
		return nil
	}
	if run.kind == runSourceCheck || run.kind == runDrift {
		run.kind, run.facts.kind, s.observed.kind = runPlan, runPlan, runPlan
	}
	return nil
}

// finishSourceCheck ends a check that found the applied commit: nothing
// to plan until the next interval, as a drift check finds no drift.
func (r *Reconciler) finishSourceCheck(ctx context.Context, s *scope) error {
	return r.finishRun(ctx, s)
}

func gitStatusOf(c *runnerv1.GitCommit) *terracev1.GitStatus {
	st := &terracev1.GitStatus{Revision: c.GetRevision(), Message: c.GetMessage(), Author: c.GetAuthor()}
	if c.GetCommittedAtUnix() != 0 {
		t := metav1.NewTime(time.Unix(c.GetCommittedAtUnix(), 0).UTC())
		st.CommittedAt = &t
	}
	return st
}

// classifyGitError gives a failed clone its reason. The ref, the host and
// the repository are named; a credential never is (the runner's messages
// hold none). A missing ref, refused credentials and an unknown host key
// are terminal: Stalled until the spec or the Secret changes (the Stack
// looks again at its interval, or at once on a reconcile request); an
// unreachable host is retried with the stored failure backoff.
func classifyGitError(s *scope, err error) (error, bool) {
	desc, msg := s.source.description, runnerMessage(err)
	switch runner.Reason(err) {
	case runner.ReasonGitRefNotFound:
		return outcome.Terminalf(SourceRefNotFoundReason, "%s: %s; fix spec.source.git", desc, msg), true
	case runner.ReasonGitAuthFailed:
		return outcome.Terminalf(SourceAuthFailedReason, "%s: %s", desc, msg), true
	case runner.ReasonGitHostKeyUnknown:
		return outcome.Terminalf(SourceHostKeyUnknownReason, "%s: %s", desc, msg), true
	case runner.ReasonFetchFailed:
		return fmt.Errorf("%s is unavailable to the runner: %s", desc, msg), true
	}
	return nil, false
}
