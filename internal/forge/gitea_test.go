package forge

import (
	"context"
	"testing"
)

func newTestGitea(t *testing.T, f *fakeForge) Forge {
	t.Helper()
	g, err := New(Config{Provider: Gitea, APIURL: f.server.URL + "/api/v1"},
		map[string][]byte{SecretToken: []byte("gitea-token")}, "https://gitea.example.com/gitea/webhooks.git", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGiteaOpenPullRequestsFiltersTheBase(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v1/repos/gitea/webhooks/pulls", "gitea/pulls.json", 200)
	prs, err := newTestGitea(t, f).OpenPullRequests(context.Background(), "main")
	if err != nil {
		t.Fatal(err)
	}
	want := PullRequest{Number: 2, Title: "Add network", URL: "https://gitea.example.com/gitea/webhooks/pulls/2", Author: User{Login: "gitea", ID: 1},
		HeadSHA: "7a3c2b1d4e5f60718293a4b5c6d7e8f901234567", HeadBranch: "feature", BaseBranch: "main"}
	if len(prs) != 1 || prs[0] != want {
		t.Fatalf("%+v", prs)
	}
	if f.count("GET /api/v1/version") != 0 {
		t.Fatal("the server's version was asked on every call")
	}
}

func TestGiteaUpsertCommentCreatesOnceThenEdits(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v1/user", "gitea/user.json", 200)
	f.commentStore("GET /api/v1/repos/gitea/webhooks/issues/2/comments",
		"POST /api/v1/repos/gitea/webhooks/issues/2/comments",
		"PATCH /api/v1/repos/gitea/webhooks/issues/comments/{id}",
		"user", map[string]any{"id": 9, "login": "terrace"})
	g := newTestGitea(t, f)
	for _, body := range []string{"first", "second"} {
		if err := g.UpsertComment(context.Background(), 2, Marker("team-a", "network"), body); err != nil {
			t.Fatal(err)
		}
	}
	if bodies := f.commentBodies(); len(bodies) != 1 || bodies[0] != Marker("team-a", "network")+"\nsecond" || f.count("POST") != 1 {
		t.Fatalf("comments %q, requests %v", bodies, f.requestLog())
	}
}
