// Package pullrequest decides which of a repository's open pull requests a
// Stack plans, from what the forge says about them and what the Stack's
// status.pullRequests remembers: pure functions, so every rule is a table
// row. Talking to the forge is internal/forge; running the plan is the Stack
// controller's.
package pullrequest

import (
	"path"
	"strings"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/forge"
	"github.com/terrace-dev/terrace/internal/stackview"
)

// Observed is one open pull request as the forge describes it.
type Observed struct {
	Number     int64
	Title      string
	URL        string
	HeadSHA    string
	HeadBranch string
	// Files are the paths the pull request changes; FilesComplete is false
	// when the forge's list was cut at its bounds.
	Files         []string
	FilesComplete bool
	// AuthorCanWrite: the author may push to the repository.
	AuthorCanWrite bool
	// PlanCommanded: someone who may push to the repository commented
	// forge.PlanCommand on the pull request.
	PlanCommanded bool
}

// Action is what a Stack does about one pull request.
type Action string

const (
	// Plan: plan the head commit (a new pull request or a new push).
	Plan Action = "Plan"
	// Keep: the head commit was planned or is being planned.
	Keep Action = "Keep"
	// Skip: the pull request is not for this Stack (it does not touch its
	// path) or not allowed to trigger plans (its trigger says why).
	Skip Action = "Skip"
	// Forget: the pull request is closed or merged, or no longer targets
	// the branch: what its runs stored is deleted and its entry dropped.
	Forget Action = "Forget"
)

// Decision is the Action for one pull request, with why.
type Decision struct {
	Number int64
	Action Action
	Reason string
	// PR is the open pull request (zero for Forget).
	PR Observed
}

// Decide returns one Decision per open pull request and per pull request
// that status remembers but is no longer open, in the order of open then
// remembered. path is the Stack's spec.path.
func Decide(trigger terracev1.PullRequestTrigger, stackPath string, status []terracev1.PullRequestPlan, open []Observed) []Decision {
	known := map[int64]terracev1.PullRequestPlan{}
	for _, p := range status {
		known[p.Number] = p
	}
	var out []Decision
	seen := map[int64]bool{}
	for _, pr := range open {
		seen[pr.Number] = true
		out = append(out, decideOne(trigger, stackPath, known, pr))
	}
	for _, p := range status {
		if !seen[p.Number] {
			out = append(out, Decision{Number: p.Number, Action: Forget, Reason: "the pull request is closed or no longer targets the Stack's branch"})
		}
	}
	return out
}

func decideOne(trigger terracev1.PullRequestTrigger, stackPath string, known map[int64]terracev1.PullRequestPlan, pr Observed) Decision {
	d := Decision{Number: pr.Number, PR: pr}
	if allowed, why := triggered(trigger, pr); !allowed {
		d.Action, d.Reason = Skip, why
		return d
	}
	if !Touches(stackPath, pr.Files, pr.FilesComplete) {
		d.Action, d.Reason = Skip, "the pull request changes nothing under the Stack's path "+displayPath(stackPath)
		return d
	}
	if p, ok := known[pr.Number]; ok && HeadSHA(p.HeadRevision) == pr.HeadSHA && (p.RunID != "" || p.Status == terracev1.PullRequestPlanPlanned || p.Status == terracev1.PullRequestPlanFailed) {
		d.Action, d.Reason = Keep, "the head commit "+short(pr.HeadSHA)+" is planned"
		return d
	}
	d.Action, d.Reason = Plan, "head commit "+short(pr.HeadSHA)+" is not planned yet"
	return d
}

// triggered applies the Stack's trigger: writers (the default) plans the
// pull requests of authors who may push; comment plans a pull request once
// one of them has commented forge.PlanCommand; anyone plans every pull request.
func triggered(trigger terracev1.PullRequestTrigger, pr Observed) (bool, string) {
	switch trigger {
	case terracev1.PullRequestTriggerAnyone:
		return true, ""
	case terracev1.PullRequestTriggerComment:
		if pr.PlanCommanded {
			return true, ""
		}
		return false, "waiting for someone who may push to the repository to comment " + forge.PlanCommand
	default:
		if pr.AuthorCanWrite {
			return true, ""
		}
		return false, "the author may not push to the repository (trigger writers): someone who may can comment " + forge.PlanCommand + " under trigger comment"
	}
}

// Touches reports whether a change of files concerns the module at
// stackPath: a file under it, or an OpenTofu file anywhere else, since a
// module may read local modules beside it (source = "../modules/net") and
// their sources are not parsed here. Other files outside the path (docs,
// CI settings) do not. An incomplete list always concerns it.
func Touches(stackPath string, files []string, complete bool) bool {
	if !complete {
		return true
	}
	root := cleanDir(stackPath)
	for _, f := range files {
		f = strings.TrimPrefix(path.Clean("/"+f), "/")
		if root == "" || f == root || strings.HasPrefix(f, root+"/") || isModuleFile(f) {
			return true
		}
	}
	return false
}

func isModuleFile(f string) bool {
	for _, ext := range []string{".tf", ".tf.json", ".tfvars", ".tfvars.json", ".terraform.lock.hcl"} {
		if strings.HasSuffix(f, ext) {
			return true
		}
	}
	return false
}

func cleanDir(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "." {
		return ""
	}
	return p
}

func displayPath(p string) string {
	if p = cleanDir(p); p == "" {
		return "/"
	}
	return p
}

// HeadSHA returns the commit of a revision "<branch>@sha1:<hex>" ("" when
// it names none).
func HeadSHA(revision string) string {
	_, sha := stackview.SplitRevision(revision)
	return sha
}

// Revision is the revision of a pull request's head commit, as Flux
// writes a branch's.
func Revision(pr Observed) string {
	return pr.HeadBranch + "@sha1:" + pr.HeadSHA
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}
