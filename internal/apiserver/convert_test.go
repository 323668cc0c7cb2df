package apiserver

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// A Stack with a Git source shows the repository, the commit it resolved
// (with its message) and the plans of its pull requests.
func TestInstallationShowsTheGitCommitAndPullRequestPlans(t *testing.T) {
	committed := metav1.NewTime(time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC))
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"}}
	stack.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example/team/infra.git"}
	stack.Status.Git = &terracev1.GitStatus{Revision: "main@sha1:0123456789abcdef0123456789abcdef01234567", Message: "Grow the pool", Author: "Ada <ada@example.com>", CommittedAt: &committed}
	stack.Status.PullRequests = []terracev1.PullRequestPlan{{Number: 12, Title: "Add a bucket", URL: "https://git.example/team/infra/pulls/12",
		HeadRevision: "add-bucket@sha1:89abcdef0123456789abcdef0123456789abcdef", Status: terracev1.PullRequestPlanPlanned, Add: 1, PlannedAt: &committed}}

	in := installationOf(stack)
	if in.GetSource().GetGitUrl() != "https://git.example/team/infra.git" {
		t.Errorf("source git url = %q", in.GetSource().GetGitUrl())
	}
	if g := in.GetGit(); g.GetRevision() != stack.Status.Git.Revision || g.GetMessage() != "Grow the pool" || g.GetAuthor() != "Ada <ada@example.com>" || !g.GetCommittedAt().AsTime().Equal(committed.Time) {
		t.Errorf("git = %+v", g)
	}
	prs := in.GetPullRequests()
	if len(prs) != 1 || prs[0].GetNumber() != 12 || prs[0].GetUrl() != "https://git.example/team/infra/pulls/12" || prs[0].GetStatus() != "Planned" || prs[0].GetAdd() != 1 {
		t.Errorf("pull requests = %+v", prs)
	}
	if in2 := installationOf(&terracev1.Stack{}); in2.GetGit() != nil || len(in2.GetPullRequests()) != 0 {
		t.Errorf("a Stack without a Git source shows git %+v and pull requests %+v", in2.GetGit(), in2.GetPullRequests())
	}
}
