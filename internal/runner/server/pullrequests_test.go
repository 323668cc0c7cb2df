package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// fakeGitea answers the few Gitea API calls pull-request plans make, and
// keeps the comments and statuses it was sent.
type fakeGitea struct {
	mu       sync.Mutex
	token    string
	comments []map[string]any
	statuses []map[string]any
}

func (g *fakeGitea) serve(t *testing.T) *httptest.Server {
	const sha = "7a3c2b1d4e5f60718293a4b5c6d7e8f901234567"
	mux := http.NewServeMux()
	js := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	pr := func(n int, login, base string) map[string]any {
		return map[string]any{"number": n, "title": "change " + login, "state": "open", "html_url": "https://git.example/o/r/pulls/" + string(rune('0'+n)),
			"user": map[string]any{"id": n, "login": login}, "base": map[string]any{"ref": base}, "head": map[string]any{"ref": "feature", "sha": sha}}
	}
	mux.HandleFunc("GET /api/v1/repos/o/r/pulls", func(w http.ResponseWriter, r *http.Request) {
		js(w, []any{pr(1, "writer", "main"), pr(2, "outsider", "main"), pr(3, "writer", "release")})
	})
	mux.HandleFunc("GET /api/v1/repos/o/r/pulls/{n}/files", func(w http.ResponseWriter, r *http.Request) {
		js(w, []any{map[string]any{"filename": "network/main.tf", "status": "changed"}})
	})
	mux.HandleFunc("GET /api/v1/repos/o/r/collaborators/{user}/permission", func(w http.ResponseWriter, r *http.Request) {
		perm := "read"
		if r.PathValue("user") == "writer" {
			perm = "write"
		}
		js(w, map[string]any{"permission": perm})
	})
	mux.HandleFunc("GET /api/v1/repos/o/r/issues/{n}/comments", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if r.PathValue("n") == "2" && len(g.comments) == 0 {
			js(w, []any{map[string]any{"id": 1, "body": "/terrace plan", "user": map[string]any{"id": 1, "login": "writer"}}})
			return
		}
		js(w, g.comments)
	})
	mux.HandleFunc("GET /api/v1/user", func(w http.ResponseWriter, r *http.Request) {
		js(w, map[string]any{"id": 9, "login": "terrace"})
	})
	mux.HandleFunc("POST /api/v1/repos/o/r/issues/{n}/comments", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		g.mu.Lock()
		c := map[string]any{"id": 100 + len(g.comments), "body": body["body"], "user": map[string]any{"id": 9, "login": "terrace"}}
		g.comments = append(g.comments, c)
		g.mu.Unlock()
		js(w, c)
	})
	mux.HandleFunc("PATCH /api/v1/repos/o/r/issues/comments/{id}", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, c := range g.comments {
			if jsonID(c["id"]) == r.PathValue("id") {
				c["body"] = body["body"]
				js(w, c)
				return
			}
		}
		http.NotFound(w, r)
	})
	mux.HandleFunc("POST /api/v1/repos/o/r/statuses/{sha}", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		body["sha"] = r.PathValue("sha")
		g.mu.Lock()
		g.statuses = append(g.statuses, body)
		g.mu.Unlock()
		js(w, body)
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "token "+g.token {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"message":"token is required"}`)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func jsonID(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// forgeCredentials writes a Secret's keys as the kubelet mounts them.
func forgeCredentials(t *testing.T, token string) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o400); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestListPullRequestsAsksTheForgeFromTheRunner(t *testing.T) {
	g := &fakeGitea{token: "s3cret"}
	srv := g.serve(t)
	tr := startRunner(t, nil)
	f := &runnerv1.Forge{Provider: "gitea", ApiUrl: srv.URL, RepositoryUrl: "https://git.example/o/r.git", CredentialsDir: forgeCredentials(t, "s3cret")}
	resp, err := tr.client.ListPullRequests(context.Background(), &runnerv1.ListPullRequestsRequest{Forge: f, Base: "main", PlanCommands: true})
	if err != nil {
		t.Fatal(err)
	}
	prs := resp.GetPullRequests()
	if len(prs) != 2 || prs[0].GetNumber() != 1 || prs[1].GetNumber() != 2 {
		t.Fatalf("want pull requests 1 and 2 into main, got %v", prs)
	}
	if !prs[0].GetAuthorCanWrite() || prs[1].GetAuthorCanWrite() {
		t.Errorf("author may write: #1 %v (want true), #2 %v (want false)", prs[0].GetAuthorCanWrite(), prs[1].GetAuthorCanWrite())
	}
	if !prs[1].GetPlanCommanded() {
		t.Error("#2 has a writer's /terrace plan comment, not seen")
	}
	if got := prs[0].GetFiles(); len(got) != 1 || got[0] != "network/main.tf" || !prs[0].GetFilesComplete() {
		t.Errorf("files %v complete %v", got, prs[0].GetFilesComplete())
	}

	f.CredentialsDir = forgeCredentials(t, "wrong")
	_, err = tr.client.ListPullRequests(context.Background(), &runnerv1.ListPullRequestsRequest{Forge: f, Base: "main"})
	if status.Code(err) != codes.PermissionDenied || strings.Contains(err.Error(), "token is required") {
		t.Fatalf("a refused token: want PermissionDenied without the forge's text, got %v", err)
	}
}

func TestPublishPullRequestPlanEditsOneCommentAndSetsTheStatus(t *testing.T) {
	g := &fakeGitea{token: "s3cret"}
	srv := g.serve(t)
	tr := startRunner(t, nil)
	f := &runnerv1.Forge{Provider: "gitea", ApiUrl: srv.URL, RepositoryUrl: "https://git.example/o/r.git", CredentialsDir: forgeCredentials(t, "s3cret")}
	const sha = "7a3c2b1d4e5f60718293a4b5c6d7e8f901234567"
	for _, req := range []*runnerv1.PublishPullRequestPlanRequest{
		{Status: "Pending"},
		{Status: "Planned", Add: 1, Change: 2, Destroy: 0, Plan: "  # null_resource.a will be created"},
		{Status: "Failed", Message: "Error: Unsupported block type"},
	} {
		req.Forge, req.Number, req.HeadSha, req.Namespace, req.Stack, req.Revision = f, 1, sha, "team-a", "network", "feature@sha1:"+sha
		if err := tr.client.PublishPullRequestPlan(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.comments) != 1 {
		t.Fatalf("want one comment edited in place, got %d", len(g.comments))
	}
	body := g.comments[0]["body"].(string)
	if !strings.HasPrefix(body, "<!-- terrace:team-a/network -->") || !strings.Contains(body, "Plan failed") || !strings.Contains(body, "Unsupported block type") {
		t.Errorf("comment:\n%s", body)
	}
	var states []string
	for _, s := range g.statuses {
		states = append(states, s["state"].(string)+" "+s["description"].(string))
		if s["context"] != "terrace/team-a/network" || s["sha"] != sha {
			t.Errorf("status %v", s)
		}
	}
	want := []string{"pending Planning", "success Plan: +1 ~2 -0", "failure Plan failed: Error: Unsupported block type"}
	if strings.Join(states, "|") != strings.Join(want, "|") {
		t.Errorf("statuses %q, want %q", states, want)
	}
}
