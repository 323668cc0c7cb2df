package stack

import (
	"testing"
	"time"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pullrequest"
	"github.com/terrace-dev/terrace/internal/runner"
)

func TestPullRequestStatusBookkeeping(t *testing.T) {
	const a, b = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	open := []pullrequest.Observed{
		{Number: 1, Title: "new", HeadSHA: a, HeadBranch: "f1", Files: []string{"net/main.tf"}, FilesComplete: true, AuthorCanWrite: true},
		{Number: 2, Title: "pushed again", HeadSHA: b, HeadBranch: "f2", Files: []string{"net/main.tf"}, FilesComplete: true, AuthorCanWrite: true},
		{Number: 3, Title: "planned", HeadSHA: a, HeadBranch: "f3", Files: []string{"net/main.tf"}, FilesComplete: true, AuthorCanWrite: true},
		{Number: 4, Title: "outsider", HeadSHA: a, HeadBranch: "f4", Files: []string{"net/main.tf"}, FilesComplete: true},
		{Number: 5, Title: "docs only", HeadSHA: a, HeadBranch: "f5", Files: []string{"README.md"}, FilesComplete: true, AuthorCanWrite: true},
		{Number: 6, Title: "interrupted", HeadSHA: a, HeadBranch: "f6", Files: []string{"net/main.tf"}, FilesComplete: true, AuthorCanWrite: true},
	}
	status := []terracev1.PullRequestPlan{
		{Number: 2, HeadRevision: "f2@sha1:" + a, Status: terracev1.PullRequestPlanPlanned, Add: 1},
		{Number: 3, HeadRevision: "f3@sha1:" + a, Status: terracev1.PullRequestPlanPlanned, Add: 3},
		{Number: 6, HeadRevision: "f6@sha1:" + a, Status: terracev1.PullRequestPlanPending, RunID: "cutshort"},
		{Number: 9, HeadRevision: "f9@sha1:" + a, Status: terracev1.PullRequestPlanPlanned},
	}
	status = interruptedRuns(status)
	ids := 0
	next, runs := nextPullRequests("net", status, pullrequest.Decide(terracev1.PullRequestTriggerWriters, "net", status, open), func() string {
		ids++
		return "run" + string(rune('0'+ids))
	})
	got := map[int64]terracev1.PullRequestPlan{}
	for _, p := range next {
		got[p.Number] = p
	}
	if len(next) != 5 {
		t.Fatalf("entries %+v: want #1, #2, #3, #4 and #6 (#5 touches nothing of the Stack, #9 is closed)", next)
	}
	var planned []int64
	for _, r := range runs {
		planned = append(planned, r.pr.Number)
		if got[r.pr.Number].RunID != r.runID || got[r.pr.Number].Status != terracev1.PullRequestPlanPending {
			t.Errorf("#%d runs as %s but its entry is %+v", r.pr.Number, r.runID, got[r.pr.Number])
		}
	}
	if len(planned) != 3 || planned[0] != 1 || planned[1] != 2 || planned[2] != 6 {
		t.Fatalf("planned %v, want the new #1, the pushed #2 and the interrupted #6", planned)
	}
	if p := got[3]; p.RunID != "" || p.Status != terracev1.PullRequestPlanPlanned || p.Add != 3 {
		t.Errorf("#3's plan of its head is kept: %+v", p)
	}
	if p := got[4]; p.Status != terracev1.PullRequestPlanPending || p.RunID != "" || p.Message == "" {
		t.Errorf("#4 waits for its trigger, with the reason: %+v", p)
	}

	at := time.Unix(1_800_000_000, 0)
	pullRequestPlanned(next, 1, got[1].RunID, pullRequestPlanResult{add: 2, change: 1, at: at})
	pullRequestPlanned(next, 2, got[2].RunID, pullRequestPlanResult{failed: true, message: "Error: Unsupported block type", at: at})
	pullRequestPlanned(next, 6, got[6].RunID, pullRequestPlanResult{stale: true, message: "pushed to meanwhile", at: at})
	pullRequestPlanned(next, 3, "not-its-run", pullRequestPlanResult{failed: true, at: at})
	for _, p := range next {
		got[p.Number] = p
	}
	if p := got[1]; p.Status != terracev1.PullRequestPlanPlanned || p.Add != 2 || p.Change != 1 || p.RunID != "" || !p.PlannedAt.Time.Equal(at) {
		t.Errorf("#1 planned: %+v", p)
	}
	if p := got[2]; p.Status != terracev1.PullRequestPlanFailed || p.Add != 0 || p.Message != "Error: Unsupported block type" {
		t.Errorf("#2 failed: %+v", p)
	}
	if p := got[6]; p.Status != terracev1.PullRequestPlanPending || p.RunID != "" {
		t.Errorf("#6 moved while planned, to be planned again: %+v", p)
	}
	if p := got[3]; p.Status != terracev1.PullRequestPlanPlanned {
		t.Errorf("a result of a run #3 no longer names changed it: %+v", p)
	}
}

// The runner words a commit status from the status the controller sends:
// the protocol's values are the API's.
func TestPullRequestStatusesMatchTheRunnerProtocol(t *testing.T) {
	if runner.PullRequestPlanned != terracev1.PullRequestPlanPlanned || runner.PullRequestFailed != terracev1.PullRequestPlanFailed {
		t.Fatalf("runner protocol %q/%q, API %q/%q", runner.PullRequestPlanned, runner.PullRequestFailed, terracev1.PullRequestPlanPlanned, terracev1.PullRequestPlanFailed)
	}
}
