package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// describe shows a Git source's ref, the commit it resolved with its
// message, and each pull request's plan with its link.
func TestDescribeShowsTheGitCommitAndPullRequestPlans(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	committed := metav1.NewTime(now.Add(-3 * time.Hour))
	st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"}}
	st.Spec.Source.Git = &terracev1.GitSource{URL: "https://git.example/team/infra.git", Ref: &terracev1.GitRef{Tag: "v1.2.0"},
		PullRequests: &terracev1.GitPullRequests{Enabled: true, Provider: terracev1.GitProviderGitea, SecretRef: terracev1.LocalObjectReference{Name: "forge"}}}
	st.Status.Git = &terracev1.GitStatus{Revision: "v1.2.0@sha1:0123456789abcdef0123456789abcdef01234567", Message: "Grow the pool", Author: "Ada <ada@example.com>", CommittedAt: &committed}
	st.Status.PullRequests = []terracev1.PullRequestPlan{{Number: 12, Title: "Add a bucket", URL: "https://git.example/team/infra/pulls/12",
		HeadRevision: "add-bucket@sha1:89abcdef0123456789abcdef0123456789abcdef", Status: terracev1.PullRequestPlanPlanned, Add: 1, PlannedAt: &committed}}
	var out bytes.Buffer
	if err := printDescription(&out, &description{Stack: st, Releases: []release.Release{}}, now); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"Git https://git.example/team/infra.git tag v1.2.0",
		`v1.2.0@sha1:0123456789abcdef0123456789abcdef01234567 "Grow the pool" by Ada <ada@example.com>, 3h`,
		"Pull request plans:",
		"#12 Add a bucket", "add-bucket@sha1:89abcdef", "Planned", "+1 ~0 -0", "https://git.example/team/infra/pulls/12",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("describe lacks %q:\n%s", want, text)
		}
	}
	// Without pull-request plans enabled there is no such section.
	st.Spec.Source.Git.PullRequests = nil
	out.Reset()
	_ = printDescription(&out, &description{Stack: st, Releases: []release.Release{}}, now)
	if strings.Contains(out.String(), "Pull request plans") {
		t.Errorf("describe lists pull request plans of a Stack that has none enabled:\n%s", out.String())
	}
}
