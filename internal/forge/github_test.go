package forge

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const octoRepo = "https://github.com/octocat/Hello-World.git"

func newTestGitHub(t *testing.T, f *fakeForge, opts Options) Forge {
	t.Helper()
	g, err := New(Config{Provider: GitHub, APIURL: f.server.URL + "/api/v3"},
		map[string][]byte{SecretToken: []byte("ghp_test\n")}, octoRepo, opts)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGitHubOpenPullRequestsFollowsPages(t *testing.T) {
	f := newFakeForge(t)
	f.handle("GET /api/v3/repos/octocat/Hello-World/pulls", func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Authorization"); got != "Bearer ghp_test" {
			t.Errorf("Authorization %q", got)
		}
		q := r.URL.Query()
		if q.Get("state") != "open" || q.Get("base") != "master" {
			t.Errorf("query %v", q)
		}
		if q.Get("page") == "2" {
			w.Write(testdata(t, "github/pulls-page2.json"))
			return
		}
		w.Header().Set("Link", `<`+"http://"+r.Host+r.URL.Path+`?page=2>; rel="next", <`+"http://"+r.Host+r.URL.Path+`?page=2>; rel="last"`)
		w.Write(testdata(t, "github/pulls-page1.json"))
	})
	prs, err := newTestGitHub(t, f, Options{}).OpenPullRequests(context.Background(), "master")
	if err != nil {
		t.Fatal(err)
	}
	want := []PullRequest{
		{Number: 1347, Title: "Amazing new feature", URL: "https://github.com/octocat/Hello-World/pull/1347", Author: User{Login: "octocat", ID: 1},
			HeadSHA: "6dcb09b5b57875f334f61aebed695e2e4193db5e", HeadBranch: "new-topic", BaseBranch: "master"},
		{Number: 1348, Title: "Another feature", URL: "https://github.com/octocat/Hello-World/pull/1348", Author: User{Login: "hubot", ID: 2},
			HeadSHA: "c5b97d5ae6c19d5c5df71a34c7fbeeda2479ccbc", HeadBranch: "other", BaseBranch: "master"},
	}
	if len(prs) != len(want) {
		t.Fatalf("got %d pull requests (%+v), want 2: the one whose head is no SHA is dropped", len(prs), prs)
	}
	for i := range want {
		if prs[i] != want[i] {
			t.Errorf("pull request %d:\n got %+v\nwant %+v", i, prs[i], want[i])
		}
	}
}

func TestGitHubListsStopAtMaxPages(t *testing.T) {
	f := newFakeForge(t)
	f.handle("GET /api/v3/repos/octocat/Hello-World/pulls/{n}/files", func(w http.ResponseWriter, r *http.Request) {
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		w.Header().Set("Link", `<http://`+r.Host+r.URL.Path+`?page=`+strconv.Itoa(max(page, 1)+1)+`>; rel="next"`)
		w.Write(testdata(t, "github/pull-files.json"))
	})
	files, complete, err := newTestGitHub(t, f, Options{MaxPages: 3}).ChangedFiles(context.Background(), 1347)
	if err != nil {
		t.Fatal(err)
	}
	if complete || len(files) != 9 || f.count("GET /api/v3/repos/octocat/Hello-World/pulls/1347/files") != 3 {
		t.Fatalf("complete %v, %d files, %d requests: want an incomplete list of 3 pages", complete, len(files), f.count("GET"))
	}
}

func TestGitHubChangedFilesNamesBothSidesOfARename(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v3/repos/octocat/Hello-World/pulls/1347/files", "github/pull-files.json", 200)
	files, complete, err := newTestGitHub(t, f, Options{}).ChangedFiles(context.Background(), 1347)
	if err != nil || !complete {
		t.Fatal(complete, err)
	}
	if got := strings.Join(files, ","); got != "infra/network/main.tf,modules/vpc/main.tf,modules/net/main.tf" {
		t.Fatalf("files %s", got)
	}
}

func TestGitHubErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		file   string
		status int
		want   error
	}{
		"a repository that does not exist": {"github/not-found.json", 404, ErrNotFound},
		"a token the forge refuses":        {"github/bad-credentials.json", 401, ErrUnauthorized},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeForge(t)
			f.file("GET /api/v3/repos/octocat/Hello-World/pulls", tc.file, tc.status)
			_, err := newTestGitHub(t, f, Options{}).OpenPullRequests(context.Background(), "master")
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), "documentation_url") || strings.Contains(err.Error(), "Bad credentials") {
				t.Fatalf("the forge's text passed on: %v", err)
			}
		})
	}
}

func TestGitHubResponseSizeIsBounded(t *testing.T) {
	f := newFakeForge(t)
	f.handle("GET /api/v3/repos/octocat/Hello-World/pulls", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("[" + strings.Repeat(" ", 4096) + "]"))
	})
	_, err := newTestGitHub(t, f, Options{MaxResponseBytes: 1024}).OpenPullRequests(context.Background(), "master")
	var tooLarge *responseTooLargeError
	if !errors.As(err, &tooLarge) {
		t.Fatalf("error %v, want the response refused as too large", err)
	}
}

func TestGitHubCallsTimeOut(t *testing.T) {
	f := newFakeForge(t)
	f.handle("GET /api/v3/repos/octocat/Hello-World/pulls", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	start := time.Now()
	_, err := newTestGitHub(t, f, Options{Timeout: 100 * time.Millisecond}).OpenPullRequests(context.Background(), "master")
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("error %v after %s, want a timeout", err, time.Since(start))
	}
}

func TestGitHubCanWrite(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v3/repos/octocat/Hello-World/collaborators/octocat/permission", "github/permission-admin.json", 200)
	f.file("GET /api/v3/repos/octocat/Hello-World/collaborators/hubot/permission", "github/permission-read.json", 200)
	f.file("GET /api/v3/repos/octocat/Hello-World/collaborators/ghost/permission", "github/not-found.json", 404)
	g := newTestGitHub(t, f, Options{})
	for login, want := range map[string]bool{"octocat": true, "hubot": false, "ghost": false, "../../admin": false} {
		got, err := g.CanWrite(context.Background(), User{Login: login})
		if err != nil || got != want {
			t.Errorf("%s: %v, %v; want %v", login, got, err, want)
		}
	}
	if f.count("GET /api/v3/repos/octocat/Hello-World/collaborators/..") != 0 || len(f.requestLog()) != 3 {
		t.Errorf("requests %v: a login that is no user name must not reach the forge", f.requestLog())
	}
}

func TestGitHubUpsertCommentCreatesOnceThenEdits(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v3/user", "github/user.json", 200)
	f.seedComments("github/issue-comments.json")
	f.commentStore("GET /api/v3/repos/octocat/Hello-World/issues/1347/comments",
		"POST /api/v3/repos/octocat/Hello-World/issues/1347/comments",
		"PATCH /api/v3/repos/octocat/Hello-World/issues/comments/{id}",
		"user", map[string]any{"login": "terrace-bot", "id": 99})
	g := newTestGitHub(t, f, Options{})
	marker := Marker("team-a", "network")
	if err := g.UpsertComment(context.Background(), 1347, marker, "first plan"); err != nil {
		t.Fatal(err)
	}
	if err := g.UpsertComment(context.Background(), 1347, marker, "second plan"); err != nil {
		t.Fatal(err)
	}
	bodies := f.commentBodies()
	if len(bodies) != 3 || bodies[2] != marker+"\nsecond plan" {
		t.Fatalf("comments %q: want the planted one left alone and ours created once, then edited", bodies)
	}
	if !strings.Contains(bodies[1], "planted") {
		t.Fatalf("someone else's comment with the marker was edited: %q", bodies[1])
	}
	if f.count("POST ") != 1 || f.count("PATCH ") != 1 || f.count("GET /api/v3/user") != 1 {
		t.Fatalf("requests %v", f.requestLog())
	}
}

func TestGitHubUpsertCommentTruncatesAtTheLimit(t *testing.T) {
	f := newFakeForge(t)
	f.file("GET /api/v3/user", "github/user.json", 200)
	f.commentStore("GET /api/v3/repos/octocat/Hello-World/issues/1/comments",
		"POST /api/v3/repos/octocat/Hello-World/issues/1/comments",
		"PATCH /api/v3/repos/octocat/Hello-World/issues/comments/{id}",
		"user", map[string]any{"login": "terrace-bot", "id": 99})
	if err := newTestGitHub(t, f, Options{}).UpsertComment(context.Background(), 1, "<!-- m -->", strings.Repeat("ü", 70000)); err != nil {
		t.Fatal(err)
	}
	body := f.commentBodies()[0]
	if n := textLen(body); n > GitHubMaxComment || !strings.HasSuffix(body, "characters._") || !strings.HasPrefix(body, "<!-- m -->\n") {
		t.Fatalf("a body of %d characters ending %q", n, body[len(body)-40:])
	}
}

func TestGitHubSetCommitStatus(t *testing.T) {
	f := newFakeForge(t)
	var got map[string]string
	f.handle("POST /api/v3/repos/octocat/Hello-World/statuses/{sha}", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":1,"state":"success","context":"terrace/team-a/network"}`))
	})
	g := newTestGitHub(t, f, Options{})
	sha := "6dcb09b5b57875f334f61aebed695e2e4193db5e"
	err := g.SetCommitStatus(context.Background(), sha, CommitStatus{State: StateSuccess, Context: StatusContext("team-a", "network"),
		Description: "+1 ~0 -0 " + strings.Repeat("x", 200), TargetURL: "https://console.example.com/stacks/team-a/network"})
	if err != nil {
		t.Fatal(err)
	}
	if got["state"] != "success" || got["context"] != "terrace/team-a/network" || len(got["description"]) != 140 || got["target_url"] == "" {
		t.Fatalf("status %v", got)
	}
	if err := g.SetCommitStatus(context.Background(), "../../x", CommitStatus{State: StateFailure}); err == nil || f.count("POST") != 1 {
		t.Fatal("a status set on something that is no SHA")
	}
}

func TestGitHubAppAuthenticatesWithAnInstallationToken(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	f := newFakeForge(t)
	checkJWT := func(r *http.Request) bool {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return false
		}
		var claims jwt.RegisteredClaims
		_, err := jwt.ParseWithClaims(raw, &claims, func(*jwt.Token) (any, error) { return &key.PublicKey, nil }, jwt.WithValidMethods([]string{"RS256"}))
		return err == nil && claims.Issuer == "12345" && claims.ExpiresAt.Sub(claims.IssuedAt.Time) <= 10*time.Minute
	}
	f.handle("POST /api/v3/app/installations/678/access_tokens", func(w http.ResponseWriter, r *http.Request) {
		if !checkJWT(r) {
			http.Error(w, `{"message":"A JSON web token could not be decoded"}`, http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write(testdata(t, "github/installation-token.json"))
	})
	f.handle("GET /api/v3/app", func(w http.ResponseWriter, r *http.Request) {
		if !checkJWT(r) {
			http.Error(w, `{}`, http.StatusUnauthorized)
			return
		}
		w.Write(testdata(t, "github/app.json"))
	})
	f.handle("GET /api/v3/repos/octocat/Hello-World/pulls", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer ghs_16C7e42F292c6912E7710c838347Ae178B4a" {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		w.Write(testdata(t, "github/pulls-page1.json"))
	})
	f.seedComments("github/issue-comments.json")
	f.commentStore("GET /api/v3/repos/octocat/Hello-World/issues/1347/comments",
		"POST /api/v3/repos/octocat/Hello-World/issues/1347/comments",
		"PATCH /api/v3/repos/octocat/Hello-World/issues/comments/{id}",
		"user", map[string]any{"login": "terrace-plans[bot]", "id": 7})
	g, err := New(Config{Provider: GitHub, APIURL: f.server.URL + "/api/v3/"},
		map[string][]byte{SecretAppID: []byte("12345"), SecretInstallationID: []byte("678"), SecretPrivateKey: keyPEM}, "git@github.com:octocat/Hello-World.git", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		prs, err := g.OpenPullRequests(context.Background(), "master")
		if err != nil || len(prs) != 1 {
			t.Fatalf("%v, %v", prs, err)
		}
	}
	if n := f.count("POST /api/v3/app/installations/678/access_tokens"); n != 1 {
		t.Fatalf("%d installation tokens made for two calls: want the token reused", n)
	}
	for range 2 {
		if err := g.UpsertComment(context.Background(), 1347, Marker("a", "b"), "plan"); err != nil {
			t.Fatal(err)
		}
	}
	if f.count("POST /api/v3/repos/octocat/Hello-World/issues/1347/comments") != 1 || f.count("PATCH") != 1 {
		t.Fatalf("the App's bot comment was not found again: %v", f.requestLog())
	}
}
