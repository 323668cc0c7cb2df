package pullrequest

import (
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

const (
	shaA = "0123456789abcdef0123456789abcdef01234567"
	shaB = "89abcdef0123456789abcdef0123456789abcdef"
)

func TestDecide(t *testing.T) {
	byWriter := Observed{Number: 7, HeadBranch: "fix", HeadSHA: shaA, Files: []string{"envs/prod/main.tf"}, FilesComplete: true, AuthorCanWrite: true}
	with := func(pr Observed, f func(*Observed)) Observed { f(&pr); return pr }
	planned := terracev1.PullRequestPlan{Number: 7, HeadRevision: "fix@sha1:" + shaA, Status: terracev1.PullRequestPlanPlanned}
	for _, tc := range []struct {
		name    string
		trigger terracev1.PullRequestTrigger
		status  []terracev1.PullRequestPlan
		open    []Observed
		want    []Action
	}{
		{"a new pull request of a writer", "", nil, []Observed{byWriter}, []Action{Plan}},
		{"its head is planned", "", []terracev1.PullRequestPlan{planned}, []Observed{byWriter}, []Action{Keep}},
		{"its head is being planned", "", []terracev1.PullRequestPlan{{Number: 7, HeadRevision: "fix@sha1:" + shaA, Status: terracev1.PullRequestPlanPending, RunID: "pr-7-x"}}, []Observed{byWriter}, []Action{Keep}},
		{"a pending entry without a run is planned", "", []terracev1.PullRequestPlan{{Number: 7, HeadRevision: "fix@sha1:" + shaA, Status: terracev1.PullRequestPlanPending}}, []Observed{byWriter}, []Action{Plan}},
		{"a new push", "", []terracev1.PullRequestPlan{planned}, []Observed{with(byWriter, func(o *Observed) { o.HeadSHA = shaB })}, []Action{Plan}},
		{"a failed plan of the same head is not retried", "", []terracev1.PullRequestPlan{{Number: 7, HeadRevision: "fix@sha1:" + shaA, Status: terracev1.PullRequestPlanFailed}}, []Observed{byWriter}, []Action{Keep}},
		{"an outsider under writers", "", nil, []Observed{with(byWriter, func(o *Observed) { o.AuthorCanWrite = false })}, []Action{Skip}},
		{"an outsider under anyone", terracev1.PullRequestTriggerAnyone, nil, []Observed{with(byWriter, func(o *Observed) { o.AuthorCanWrite = false })}, []Action{Plan}},
		{"a writer without the command under comment", terracev1.PullRequestTriggerComment, nil, []Observed{byWriter}, []Action{Skip}},
		{"an outsider after a writer's command", terracev1.PullRequestTriggerComment, nil, []Observed{with(byWriter, func(o *Observed) { o.AuthorCanWrite, o.PlanCommanded = false, true })}, []Action{Plan}},
		{"docs elsewhere only", "", nil, []Observed{with(byWriter, func(o *Observed) { o.Files = []string{"README.md", ".github/workflows/ci.yaml"} })}, []Action{Skip}},
		{"a module beside the path", "", nil, []Observed{with(byWriter, func(o *Observed) { o.Files = []string{"modules/net/main.tf"} })}, []Action{Plan}},
		{"a list cut short", "", nil, []Observed{with(byWriter, func(o *Observed) { o.Files, o.FilesComplete = []string{"README.md"}, false })}, []Action{Plan}},
		{"closed since", "", []terracev1.PullRequestPlan{planned, {Number: 9}}, []Observed{byWriter}, []Action{Keep, Forget}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.trigger, "envs/prod", tc.status, tc.open)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d decisions %+v, want %v", len(got), got, tc.want)
			}
			for i, d := range got {
				if d.Action != tc.want[i] {
					t.Errorf("decision %d: %s (%s), want %s", i, d.Action, d.Reason, tc.want[i])
				}
				if d.Reason == "" && d.Action != Plan {
					t.Errorf("decision %d: %s says no reason", i, d.Action)
				}
			}
		})
	}
}

func TestTouches(t *testing.T) {
	for _, tc := range []struct {
		path  string
		files []string
		want  bool
	}{
		{"envs/prod", []string{"envs/prod/main.tf"}, true},
		{"envs/prod", []string{"envs/prod/README.md"}, true},
		{"envs/prod", []string{"envs/production/README.md"}, false},
		{"envs/prod", []string{"docs/x.md"}, false},
		{"envs/prod", []string{"modules/db/variables.tf"}, true},
		{"envs/prod", []string{"../envs/prod/../../x.md"}, false},
		{"", []string{"README.md"}, true},
		{"./", []string{"docs/a.md"}, true},
	} {
		if got := Touches(tc.path, tc.files, true); got != tc.want {
			t.Errorf("Touches(%q, %v) = %v, want %v", tc.path, tc.files, got, tc.want)
		}
	}
}

func TestHeadSHA(t *testing.T) {
	for rev, want := range map[string]string{"fix@sha1:" + shaA: shaA, "sha1:" + shaB: shaB, "": "", "main": ""} {
		if got := HeadSHA(rev); got != want {
			t.Errorf("HeadSHA(%q) = %q, want %q", rev, got, want)
		}
	}
	if got := Revision(Observed{HeadBranch: "fix", HeadSHA: shaA}); got != "fix@sha1:"+shaA {
		t.Errorf("Revision = %q", got)
	}
}
