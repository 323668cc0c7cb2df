package forge

import (
	"strings"
	"testing"
)

func TestRenderPlanComment(t *testing.T) {
	got := RenderPlanComment(PlanComment{Namespace: "team-a", Stack: "network", Revision: "feature@sha1:6dcb09b5b57875f334f61aebed695e2e4193db5e",
		Status: "Planned", Add: 1, Change: 2, Destroy: 3, Plan: "  # terraform_data.x will be created\n  + input = (sensitive value)\n"}, GitHubMaxComment)
	for _, want := range []string{
		"<!-- terrace:team-a/network -->\n",
		"**Plan: +1 ~2 -3**",
		"` feature@sha1:6dcb09b5b57875f334f61aebed695e2e4193db5e `",
		"<details><summary>Show plan</summary>\n\n```text\n  # terraform_data.x will be created",
		"(sensitive value)\n```\n\n</details>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "truncated") {
		t.Error("a short plan said truncated")
	}
}

func TestRenderPlanCommentKeepsThePlanInItsBlock(t *testing.T) {
	// Module output can hold backticks and HTML: it must not leave the block.
	got := RenderPlanComment(PlanComment{Namespace: "a", Stack: "b", Status: "Failed", Message: "Error: ```\n</details><img src=x>",
		Plan: "x = \"````\"\n</details>\n"}, GitHubMaxComment)
	if !strings.Contains(got, "`````text\n") || !strings.Contains(got, "````\nError: ```\n</details><img src=x>\n````\n") {
		t.Fatalf("the fences do not enclose the text:\n%s", got)
	}
}

func TestRenderPlanCommentTruncatesThePlan(t *testing.T) {
	plan := strings.Repeat("  + resource \"terraform_data\" \"x\" { input = \"é\" }\n", 5000)
	for _, limit := range []int{GitHubMaxComment, 2000} {
		got := RenderPlanComment(PlanComment{Namespace: "team-a", Stack: "network", Revision: "main@sha1:abc", Status: "Planned", Add: 5000, Plan: plan}, limit)
		if n := textLen(got); n > limit {
			t.Errorf("limit %d: %d characters", limit, n)
		}
		if !strings.HasSuffix(got, "\n```\n\n</details>\n\n_The plan is truncated: see `terrace plan team-a/network` or the console._\n") {
			t.Errorf("limit %d: ends %q", limit, got[len(got)-200:])
		}
		if !strings.HasPrefix(got, Marker("team-a", "network")) {
			t.Errorf("limit %d: the marker is gone", limit)
		}
	}
}

func TestTruncateCommentCountsUTF16(t *testing.T) {
	body := strings.Repeat("😀", 40000) // two UTF-16 units each
	got := TruncateComment(body, GitHubMaxComment)
	if n := textLen(got); n > GitHubMaxComment || n < GitHubMaxComment-100 {
		t.Fatalf("%d characters", n)
	}
	if TruncateComment("short", 10) != "short" {
		t.Fatal("a short body changed")
	}
}

func TestIsPlanCommand(t *testing.T) {
	for body, want := range map[string]bool{
		"/terrace plan":             true,
		"  /terrace plan  \nplease": true,
		"\n/terrace plan":           true,
		"please /terrace plan":      false,
		"/terrace planet":           false,
		"/terrace apply":            false,
		"> /terrace plan":           false,
		"<!-- x -->\n/terrace plan": false,
	} {
		if got := IsPlanCommand(body); got != want {
			t.Errorf("IsPlanCommand(%q) = %v, want %v", body, got, want)
		}
	}
}
