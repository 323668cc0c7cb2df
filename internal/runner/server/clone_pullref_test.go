package server

import (
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// A pull request's head is cloned from the ref the forge keeps for it,
// and only when that ref is still at the commit the forge announced.
func TestCloneOfAPullRequestHeadChecksTheCommit(t *testing.T) {
	repo := newTestRepo(t)
	repo.commit("main", "base", map[string]string{"main.tf": "locals {}\n"})
	head := repo.commit("feature", "change", map[string]string{"main.tf": "output \"a\" { value = 2 }\n"})
	repo.git(filepath.Join(repo.root, "repo.git"), "update-ref", "refs/pull/7/head", head)
	url := repo.serveHTTP()
	tr := startRunner(t, nil)
	ctx := cloneCtx(t)

	resp, err := tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "feature", Commit: head, PullRef: "refs/pull/7/head"}, "")
	if err != nil {
		t.Fatalf("clone failed: %v", err)
	}
	if resp.GetCommit().GetRevision() != "feature@sha1:"+head || readSource(t, tr)["main.tf"] != "output \"a\" { value = 2 }\n" {
		t.Fatalf("cloned %v, %v", resp.GetCommit(), readSource(t, tr))
	}

	moved := repo.commit("feature", "pushed meanwhile", map[string]string{"main.tf": "locals {}\n"})
	repo.git(filepath.Join(repo.root, "repo.git"), "update-ref", "refs/pull/7/head", moved)
	_, err = tr.client.Clone(ctx, url, &runnerv1.GitRef{Branch: "feature", Commit: head, PullRef: "refs/pull/7/head"}, "")
	wantCloneError(t, err, codes.FailedPrecondition, runner.ReasonPlanStale, []string{"refs/pull/7/head", moved, "pushed to meanwhile"})

	for _, bad := range []*runnerv1.GitRef{
		{PullRef: "refs/pull/7/head"},                // no commit to check
		{Commit: head, PullRef: "refs/heads/main"},   // not a pull request's head
		{Commit: head, PullRef: "refs/pull/../head"}, // not a number
	} {
		_, err := tr.client.Clone(ctx, url, bad, "")
		wantCloneError(t, err, codes.InvalidArgument, runner.ReasonInvalidArgument, nil)
	}
}
