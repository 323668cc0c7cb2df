package stack

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/pullrequest"
)

// The pull-request reconciler (pullrequests.go) writes status.pullRequests
// and nothing else of a Stack. These pure functions are its bookkeeping:
// what the status says after the forge was asked (nextPullRequests), and
// after a plan run ended (pullRequestPlanned).

// pullRequestPlanResult is how one pull request's plan run ended.
type pullRequestPlanResult struct {
	// failed: the plan failed (message says why); stale: the pull
	// request was pushed to meanwhile, so the head was not planned.
	failed, stale        bool
	add, change, destroy int32
	message              string
	at                   time.Time
}

// interruptedRuns forgets the run IDs that status names but no run of this
// reconcile holds: a run is the reconcile's own (they run within it), so
// one named at its start was cut short by a restart; its head is planned
// again.
func interruptedRuns(status []terracev1.PullRequestPlan) []terracev1.PullRequestPlan {
	out := make([]terracev1.PullRequestPlan, 0, len(status))
	for _, p := range status {
		if p.RunID != "" {
			p.RunID, p.Status, p.Message = "", terracev1.PullRequestPlanPending, "the plan run was interrupted; planning again"
		}
		out = append(out, p)
	}
	return out
}

// pullRequestPlanRun is a pull request to plan, under the run ID status
// now names.
type pullRequestPlanRun struct {
	pr    pullrequest.Observed
	runID string
}

// nextPullRequests is status.pullRequests after the decisions: a Forget
// drops the entry; a Skip of a pull request that does not touch the
// Stack's path has none, one waiting for its trigger is Pending with the
// reason; a Keep keeps its entry (title and URL refreshed); a Plan is
// Pending under a new run ID, and is returned to be run. The order is the
// forge's.
func nextPullRequests(stackPath string, status []terracev1.PullRequestPlan, decisions []pullrequest.Decision, newRunID func() string) ([]terracev1.PullRequestPlan, []pullRequestPlanRun) {
	known := map[int64]terracev1.PullRequestPlan{}
	for _, p := range status {
		known[p.Number] = p
	}
	var out []terracev1.PullRequestPlan
	var runs []pullRequestPlanRun
	for _, d := range decisions {
		pr := d.PR
		switch d.Action {
		case pullrequest.Forget:
			continue
		case pullrequest.Skip:
			if !pullrequest.Touches(stackPath, pr.Files, pr.FilesComplete) {
				continue
			}
			out = append(out, terracev1.PullRequestPlan{
				Number: pr.Number, Title: pr.Title, URL: pr.URL, HeadRevision: pullrequest.Revision(pr),
				Status: terracev1.PullRequestPlanPending, Message: clipMessage(d.Reason),
			})
		case pullrequest.Keep:
			p := known[d.Number]
			p.Title, p.URL = pr.Title, pr.URL
			out = append(out, p)
		case pullrequest.Plan:
			id := newRunID()
			p := known[d.Number]
			p.Number, p.Title, p.URL, p.HeadRevision = pr.Number, pr.Title, pr.URL, pullrequest.Revision(pr)
			p.Status, p.Message, p.RunID = terracev1.PullRequestPlanPending, "", id
			out = append(out, p)
			runs = append(runs, pullRequestPlanRun{pr: pr, runID: id})
		}
	}
	return out, runs
}

// pullRequestPlanned records how run runID of pull request number ended,
// if status still names that run.
func pullRequestPlanned(status []terracev1.PullRequestPlan, number int64, runID string, res pullRequestPlanResult) {
	for i := range status {
		p := &status[i]
		if p.Number != number || p.RunID != runID {
			continue
		}
		p.RunID = ""
		switch {
		case res.stale:
			// Planned again at the next look, which comes at once.
			p.Status, p.Message = terracev1.PullRequestPlanPending, clipMessage(res.message)
		case res.failed:
			at := metav1.NewTime(res.at)
			p.Status, p.Message, p.PlannedAt = terracev1.PullRequestPlanFailed, clipMessage(res.message), &at
			p.Add, p.Change, p.Destroy = 0, 0, 0
		default:
			at := metav1.NewTime(res.at)
			p.Status, p.Message, p.PlannedAt = terracev1.PullRequestPlanPlanned, "", &at
			p.Add, p.Change, p.Destroy = res.add, res.change, res.destroy
		}
	}
}

// clipMessage keeps a message within the API's 1024 bytes.
func clipMessage(s string) string {
	if len(s) <= 1024 {
		return s
	}
	cut := 1021
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "..."
}
