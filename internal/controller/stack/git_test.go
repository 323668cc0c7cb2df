package stack

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

var (
	commitA = strings.Repeat("a", 40)
	commitB = strings.Repeat("b", 40)
)

func gitStack(ref *terracev1.GitRef, status *terracev1.GitStatus) *terracev1.Stack {
	s := &terracev1.Stack{}
	s.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example.com/acme/infra.git", Ref: ref}
	s.Status.Git = status
	return s
}

// The Stack is assumed at the commit the last clone of the same ref
// resolved; a clone of another ref is not evidence of anything.
func TestResolveGitSourceAssumesTheLastClonedCommitOfTheRef(t *testing.T) {
	cases := []struct {
		name     string
		ref      *terracev1.GitRef
		revision string
		want     string
	}{
		{"never cloned", nil, "", ""},
		{"default branch", nil, "main@sha1:" + commitA, "main@sha1:" + commitA},
		{"branch renamed in the spec", &terracev1.GitRef{Branch: "prod"}, "main@sha1:" + commitA, ""},
		{"tag", &terracev1.GitRef{Tag: "v1.0.0"}, "v1.0.0@sha1:" + commitA, "v1.0.0@sha1:" + commitA},
		{"other tag", &terracev1.GitRef{Tag: "v1.1.0"}, "v1.0.0@sha1:" + commitA, ""},
		{"semver", &terracev1.GitRef{SemVer: "~1.0"}, "v1.0.3@sha1:" + commitA, "v1.0.3@sha1:" + commitA},
		{"bare commit", &terracev1.GitRef{Commit: commitA}, "sha1:" + commitA, "sha1:" + commitA},
		{"commit changed in the spec", &terracev1.GitRef{Commit: commitB}, "sha1:" + commitA, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var st *terracev1.GitStatus
			if tc.revision != "" {
				st = &terracev1.GitStatus{Revision: tc.revision}
			}
			src := resolveGitSource(gitStack(tc.ref, st))
			if src.revision != tc.want || src.digest != gitDigest(tc.want) || src.origin != fromGit {
				t.Fatalf("source at %q (digest %q), want %q", src.revision, src.digest, tc.want)
			}
			if tc.want != "" && src.digest != "git:sha1:"+tc.want[len(tc.want)-40:] {
				t.Fatalf("digest %q does not name the commit", src.digest)
			}
		})
	}
}

// adoptClonedSource puts the cloned commit in place: a check that found
// the applied commit ends, a new commit makes a check or a drift check a
// plan, and an approved plan's apply refuses a tag that moved.
func TestAdoptClonedSource(t *testing.T) {
	applied := func(revision string) string {
		s := &scope{stack: gitStack(nil, nil), inputs: &inputs{}, source: &source{digest: gitDigest(revision)}}
		return desiredDigest(s)
	}
	cases := []struct {
		name      string
		kind      runKind
		pinned    bool
		assumed   string
		cloned    string
		wantKind  runKind
		unchanged bool
		terminal  string
	}{
		{"check finds the applied commit", runSourceCheck, false, "main@sha1:" + commitA, "main@sha1:" + commitA, runSourceCheck, true, ""},
		{"check finds a new commit", runSourceCheck, false, "main@sha1:" + commitA, "main@sha1:" + commitB, runPlan, false, ""},
		{"drift check finds a new commit", runDrift, false, "main@sha1:" + commitA, "main@sha1:" + commitB, runPlan, false, ""},
		{"drift check finds the applied commit", runDrift, false, "main@sha1:" + commitA, "main@sha1:" + commitA, runDrift, false, ""},
		{"plan of a first clone", runPlan, false, "", "main@sha1:" + commitB, runPlan, false, ""},
		{"approved plan's commit", runApplyPending, true, "main@sha1:" + commitB, "main@sha1:" + commitB, runApplyPending, false, ""},
		{"approved plan's tag moved", runApplyPending, true, "v1@sha1:" + commitA, "v1@sha1:" + commitB, runApplyPending, false, PlanNoLongerValidReason},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stack := gitStack(nil, nil)
			stack.Status.LastAppliedInputsDigest = applied("main@sha1:" + commitA)
			src := &source{description: "Git repository x", revision: tc.assumed, digest: gitDigest(tc.assumed), origin: fromGit,
				git: &gitClone{pinned: tc.pinned, cloned: &runnerv1.CloneResponse{Commit: &runnerv1.GitCommit{Revision: tc.cloned, Message: "fix", CommittedAtUnix: 1700000000}}}}
			s := &scope{stack: stack, source: src, inputs: &inputs{}}
			s.run = &runScope{kind: tc.kind, facts: runFacts{kind: tc.kind, sourceCloned: true}}
			err := (&Reconciler{}).adoptClonedSource(context.Background(), s)
			if tc.terminal != "" {
				var terminal *outcome.TerminalError
				if !errors.As(err, &terminal) || terminal.Reason != tc.terminal {
					t.Fatalf("adopt: %v, want terminal %s", err, tc.terminal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.run.kind != tc.wantKind || s.run.facts.kind != tc.wantKind || s.run.facts.sourceUnchanged != tc.unchanged || s.run.facts.sourceCloned {
				t.Fatalf("run %s (facts %+v), want %s, unchanged %v", s.run.kind, s.run.facts, tc.wantKind, tc.unchanged)
			}
			if src.revision != tc.cloned || s.observed.attempted != tc.cloned || s.observed.git.Revision != tc.cloned || s.observed.git.CommittedAt == nil {
				t.Fatalf("adopted %q, attempted %q, status.git %+v; want %q", src.revision, s.observed.attempted, s.observed.git, tc.cloned)
			}
			if s.inputs.digest != applied(tc.cloned) {
				t.Fatal("the desired digest is not the cloned commit's")
			}
		})
	}
}

// Each way a clone fails has its reason; which ones wait for the user and
// which are retried.
func TestClassifyGitErrors(t *testing.T) {
	s := &scope{stack: &terracev1.Stack{}, source: &source{description: "Git repository https://git.example.com/infra.git (tag v9)", origin: fromGit}}
	cases := []struct {
		name   string
		err    error
		reason string // "" for a transient failure
	}{
		{"missing tag", runnerError(t, codes.NotFound, runner.ReasonGitRefNotFound, `https://git.example.com/infra.git: tag "v9" not found`), SourceRefNotFoundReason},
		{"refused credentials", runnerError(t, codes.PermissionDenied, runner.ReasonGitAuthFailed, "git.example.com refused the credentials"), SourceAuthFailedReason},
		{"unknown host key", runnerError(t, codes.FailedPrecondition, runner.ReasonGitHostKeyUnknown, "the ssh host key of git.example.com is not in known_hosts"), SourceHostKeyUnknownReason},
		{"too large", runnerError(t, codes.InvalidArgument, runner.ReasonTooLarge, "larger than the runner's clone limit"), SourceTooLargeReason},
		{"link out of the tree", runnerError(t, codes.InvalidArgument, runner.ReasonUnsafeArchive, "unsafe archive entry"), SourceUnsafeReason},
		{"ssh without known_hosts", runnerError(t, codes.InvalidArgument, runner.ReasonInvalidArgument, "needs identity and known_hosts"), SourceInvalidReason},
		{"unreachable", runnerError(t, codes.Unavailable, runner.ReasonFetchFailed, "dial tcp: connection refused"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := classifySourceError(s, tc.err)
			var terminal *outcome.TerminalError
			switch {
			case tc.reason == "":
				if errors.As(err, &terminal) || errors.As(err, new(*outcome.WaitingError)) {
					t.Fatalf("%v, want a transient failure, retried with the failure backoff", err)
				}
			case !errors.As(err, &terminal) || terminal.Reason != tc.reason:
				t.Fatalf("%v, want terminal %s", err, tc.reason)
			}
			if !strings.Contains(err.Error(), s.source.description) {
				t.Errorf("message %q does not name the repository and ref", err)
			}
		})
	}
}
