package forge

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// GitLab's client escapes the project path: /projects/my-group%2Fmy-project.
const glProject = "/api/v4/projects/my-group%2Fsub%2Fmy-project"

func newTestGitLab(t *testing.T, f *fakeForge) Forge {
	t.Helper()
	g, err := New(Config{Provider: GitLab, APIURL: f.server.URL + "/api/v4"},
		map[string][]byte{SecretToken: []byte("glpat-test")}, "git@gitlab.example.com:my-group/sub/my-project.git", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// glHandle routes on the escaped path, as GitLab does.
func glHandle(f *fakeForge, method, path string, h http.HandlerFunc) {
	f.handle(method+" "+strings.Replace(path, glProject, "/api/v4/projects/{project}", 1), func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("project") != "my-group/sub/my-project" {
			http.Error(w, `{"message":"404 Project Not Found"}`, http.StatusNotFound)
			return
		}
		h(w, r)
	})
}

func TestGitLabOpenMergeRequestsFollowsPages(t *testing.T) {
	f := newFakeForge(t)
	glHandle(f, "GET", glProject+"/merge_requests", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Private-Token") != "glpat-test" {
			t.Errorf("headers %v", r.Header)
		}
		if !strings.HasPrefix(r.URL.EscapedPath(), glProject) {
			t.Errorf("path %s: the project path must be escaped", r.URL.EscapedPath())
		}
		q := r.URL.Query()
		if q.Get("state") != "opened" || q.Get("target_branch") != "main" {
			t.Errorf("query %v", q)
		}
		if q.Get("page") == "2" {
			w.Write(testdata(t, "gitlab/merge-requests-page2.json"))
			return
		}
		w.Header().Set("X-Next-Page", "2")
		w.Header().Set("X-Page", "1")
		w.Header().Set("X-Total-Pages", "2")
		w.Write(testdata(t, "gitlab/merge-requests-page1.json"))
	})
	prs, err := newTestGitLab(t, f).OpenPullRequests(context.Background(), "main")
	if err != nil {
		t.Fatal(err)
	}
	if len(prs) != 2 {
		t.Fatalf("%+v", prs)
	}
	want := PullRequest{Number: 1, Title: "test1", URL: "http://gitlab.example.com/my-group/my-project/merge_requests/1", Author: User{Login: "admin", ID: 1},
		HeadSHA: "8888888888888888888888888888888888888888", HeadBranch: "test1", BaseBranch: "main"}
	if prs[0] != want || prs[1].Number != 2 || prs[1].Author.Login != "pipin" {
		t.Fatalf("got %+v", prs)
	}
}

func TestGitLabErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		file   string
		status int
		want   error
	}{
		"a project that does not exist": {"gitlab/not-found.json", 404, ErrNotFound},
		"a token the forge refuses":     {"gitlab/unauthorized.json", 401, ErrUnauthorized},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeForge(t)
			body := testdata(t, tc.file)
			glHandle(f, "GET", glProject+"/merge_requests", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				w.Write(body)
			})
			_, err := newTestGitLab(t, f).OpenPullRequests(context.Background(), "main")
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

func TestGitLabChangedFiles(t *testing.T) {
	f := newFakeForge(t)
	glHandle(f, "GET", glProject+"/merge_requests/1/diffs", func(w http.ResponseWriter, r *http.Request) {
		w.Write(testdata(t, "gitlab/diffs.json"))
	})
	files, complete, err := newTestGitLab(t, f).ChangedFiles(context.Background(), 1)
	if err != nil || !complete || strings.Join(files, ",") != "README,infra/network/main.tf,infra/old.tf" {
		t.Fatalf("%v %v %v", files, complete, err)
	}
}

func TestGitLabCanWrite(t *testing.T) {
	f := newFakeForge(t)
	glHandle(f, "GET", glProject+"/members/all/1", func(w http.ResponseWriter, r *http.Request) { w.Write(testdata(t, "gitlab/member-developer.json")) })
	glHandle(f, "GET", glProject+"/members/all/7", func(w http.ResponseWriter, r *http.Request) { w.Write(testdata(t, "gitlab/member-reporter.json")) })
	glHandle(f, "GET", glProject+"/members/all/8", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		w.Write([]byte(`{"message":"404 Not found"}`))
	})
	f.handle("GET /api/v4/users", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("username") == "raymond_smith" {
			w.Write([]byte(`[{"id":1,"username":"raymond_smith","name":"Raymond Smith","state":"active"}]`))
			return
		}
		w.Write([]byte(`[]`))
	})
	g := newTestGitLab(t, f)
	for _, tc := range []struct {
		user User
		want bool
	}{{User{ID: 1}, true}, {User{ID: 7, Login: "pipin"}, false}, {User{ID: 8}, false}, {User{Login: "raymond_smith"}, true}, {User{Login: "nobody"}, false}} {
		got, err := g.CanWrite(context.Background(), tc.user)
		if err != nil || got != tc.want {
			t.Errorf("%+v: %v, %v; want %v", tc.user, got, err, tc.want)
		}
	}
}

func TestGitLabCommentsLeaveSystemNotesOut(t *testing.T) {
	f := newFakeForge(t)
	glHandle(f, "GET", glProject+"/merge_requests/1/notes", func(w http.ResponseWriter, r *http.Request) { w.Write(testdata(t, "gitlab/notes.json")) })
	comments, err := newTestGitLab(t, f).Comments(context.Background(), 1)
	if err != nil || len(comments) != 1 || comments[0].Body != "/terrace plan" || comments[0].Author != (User{Login: "admin", ID: 1}) {
		t.Fatalf("%+v %v", comments, err)
	}
}

func TestGitLabUpsertNoteCreatesOnceThenEdits(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v4/user", "gitlab/user.json", 200)
	f.seedComments("gitlab/notes.json")
	f.commentStore("GET /api/v4/projects/{project}/merge_requests/1/notes",
		"POST /api/v4/projects/{project}/merge_requests/1/notes",
		"PUT /api/v4/projects/{project}/merge_requests/1/notes/{id}",
		"author", map[string]any{"id": 42, "username": "terrace-bot"})
	g := newTestGitLab(t, f)
	for _, body := range []string{"first", "second"} {
		if err := g.UpsertComment(context.Background(), 1, Marker("team-a", "network"), body); err != nil {
			t.Fatal(err)
		}
	}
	bodies := f.commentBodies()
	if len(bodies) != 3 || bodies[2] != Marker("team-a", "network")+"\nsecond" || f.count("POST") != 1 || f.count("PUT") != 1 {
		t.Fatalf("notes %q, requests %v", bodies, f.requestLog())
	}
}

func TestGitLabSetCommitStatus(t *testing.T) {
	f := newFakeForge(t)
	var got map[string]any
	glHandle(f, "POST", glProject+"/statuses/{sha}", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(201)
		w.Write([]byte(`{"id":93,"sha":"8888888888888888888888888888888888888888","status":"failed","name":"terrace/team-a/network"}`))
	})
	err := newTestGitLab(t, f).SetCommitStatus(context.Background(), "8888888888888888888888888888888888888888",
		CommitStatus{State: StateFailure, Context: "terrace/team-a/network", Description: "plan failed"})
	if err != nil || got["state"] != "failed" || got["name"] != "terrace/team-a/network" {
		t.Fatalf("%v %v", got, err)
	}
}
