package forge

import (
	"context"
	"crypto/rsa"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	gh "github.com/google/go-github/v75/github"
	"golang.org/x/oauth2"
)

// gitHub is a repository on GitHub or GitHub Enterprise, through go-github.
type gitHub struct {
	client      *gh.Client
	owner, name string
	maxPages    int
	// whoami names the identity Terrace comments as: the token's user, or
	// the App's bot user.
	whoami func(context.Context) (User, error)
	self   cachedUser
}

func newGitHub(repo Repository, api *url.URL, creds credentials, opts Options) (*gitHub, error) {
	owner, name, err := repo.OwnerName()
	if err != nil {
		return nil, err
	}
	g := &gitHub{owner: owner, name: name, maxPages: opts.MaxPages}
	hc := opts.httpClient()
	if creds.token != "" {
		g.client, err = gitHubClient(hc, api)
		if err != nil {
			return nil, err
		}
		g.client = g.client.WithAuthToken(creds.token)
		g.whoami = func(ctx context.Context) (User, error) {
			u, resp, err := g.client.Users.Get(ctx, "")
			if err != nil {
				return User{}, apiError("read the token's user", responseOf(resp), err)
			}
			return User{Login: u.GetLogin(), ID: u.GetID()}, nil
		}
		return g, nil
	}
	// A GitHub App: a JWT signed with the App's key authenticates as the
	// App, which exchanges it for an installation token (an hour long)
	// that every other call uses. ghinstallation is not served by the
	// module proxy here, so the JWT is signed with golang-jwt and the
	// exchange made with go-github itself.
	key, err := jwt.ParseRSAPrivateKeyFromPEM(creds.privateKey)
	if err != nil {
		return nil, fmt.Errorf("%w: the Secret's %s is not an RSA private key in PEM", ErrInvalidConfig, SecretPrivateKey)
	}
	appHTTP := opts.httpClient()
	appHTTP.Transport = &appJWTTransport{next: appHTTP.Transport, appID: creds.appID, key: key}
	appClient, err := gitHubClient(appHTTP, api)
	if err != nil {
		return nil, err
	}
	tokens := oauth2.ReuseTokenSourceWithExpiry(nil, installationTokens{apps: appClient.Apps, id: creds.installationID, timeout: opts.Timeout}, 2*time.Minute)
	hc.Transport = &oauth2.Transport{Source: tokens, Base: hc.Transport}
	if g.client, err = gitHubClient(hc, api); err != nil {
		return nil, err
	}
	g.whoami = func(ctx context.Context) (User, error) {
		app, resp, err := appClient.Apps.Get(ctx, "")
		if err != nil {
			return User{}, apiError("read the GitHub App", responseOf(resp), err)
		}
		return User{Login: app.GetSlug() + "[bot]"}, nil
	}
	return g, nil
}

func gitHubClient(hc *http.Client, api *url.URL) (*gh.Client, error) {
	c := gh.NewClient(hc)
	if api.String() == "https://api.github.com/" {
		return c, nil
	}
	c, err := c.WithEnterpriseURLs(api.String(), api.String())
	if err != nil {
		return nil, fmt.Errorf("%w: pullRequests.apiURL: %v", ErrInvalidConfig, err)
	}
	return c, nil
}

// appJWTTransport authenticates as the GitHub App: a JWT of at most ten
// minutes, issued a minute in the past against clock drift, as GitHub
// documents.
type appJWTTransport struct {
	next  http.RoundTripper
	appID int64
	key   *rsa.PrivateKey
}

func (t *appJWTTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	signed, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.RegisteredClaims{
		Issuer:    strconv.FormatInt(t.appID, 10),
		IssuedAt:  jwt.NewNumericDate(now.Add(-time.Minute)),
		ExpiresAt: jwt.NewNumericDate(now.Add(9 * time.Minute)),
	}).SignedString(t.key)
	if err != nil {
		return nil, fmt.Errorf("failed to sign the GitHub App's JWT: %w", err)
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+signed)
	return t.next.RoundTrip(req)
}

// installationTokens makes installation tokens of a GitHub App.
type installationTokens struct {
	apps    *gh.AppsService
	id      int64
	timeout time.Duration
}

func (s installationTokens) Token() (*oauth2.Token, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	tok, resp, err := s.apps.CreateInstallationToken(ctx, s.id, nil)
	if err != nil {
		return nil, apiError("create a GitHub App installation token", responseOf(resp), err)
	}
	return &oauth2.Token{AccessToken: tok.GetToken(), TokenType: "Bearer", Expiry: tok.GetExpiresAt().Time}, nil
}

func responseOf(r *gh.Response) *http.Response {
	if r == nil {
		return nil
	}
	return r.Response
}

func (g *gitHub) MaxCommentLength() int { return GitHubMaxComment }

func (g *gitHub) OpenPullRequests(ctx context.Context, base string) ([]PullRequest, error) {
	opts := &gh.PullRequestListOptions{State: "open", Base: base, ListOptions: gh.ListOptions{PerPage: 100}}
	var out []PullRequest
	for page := 0; page < g.maxPages; page++ {
		prs, resp, err := g.client.PullRequests.List(ctx, g.owner, g.name, opts)
		if err != nil {
			return nil, apiError("list pull requests", responseOf(resp), err)
		}
		for _, p := range prs {
			pr, ok := pullRequest(PullRequest{
				Number: int64(p.GetNumber()), Title: p.GetTitle(), URL: p.GetHTMLURL(),
				Author:  User{Login: p.GetUser().GetLogin(), ID: p.GetUser().GetID()},
				HeadSHA: p.GetHead().GetSHA(), HeadBranch: p.GetHead().GetRef(), BaseBranch: p.GetBase().GetRef(),
			})
			if ok && pr.BaseBranch == base {
				out = append(out, pr)
			}
		}
		if resp.NextPage == 0 {
			break
		}
		opts.Page = resp.NextPage
	}
	return out, nil
}

func (g *gitHub) ChangedFiles(ctx context.Context, number int64) ([]string, bool, error) {
	opts := &gh.ListOptions{PerPage: 100}
	var out []string
	for page := 0; page < g.maxPages; page++ {
		files, resp, err := g.client.PullRequests.ListFiles(ctx, g.owner, g.name, int(number), opts)
		if err != nil {
			return nil, false, apiError("list the pull request's files", responseOf(resp), err)
		}
		for _, f := range files {
			out = appendPaths(out, f.GetFilename(), f.GetPreviousFilename())
		}
		if resp.NextPage == 0 {
			return out, true, nil
		}
		opts.Page = resp.NextPage
	}
	return out, false, nil
}

func (g *gitHub) CanWrite(ctx context.Context, user User) (bool, error) {
	if !validLogin(user.Login) {
		return false, nil
	}
	perm, resp, err := g.client.Repositories.GetPermissionLevel(ctx, g.owner, g.name, user.Login)
	if err != nil {
		if r := responseOf(resp); r != nil && r.StatusCode == http.StatusNotFound {
			return false, nil
		}
		return false, apiError("read the user's permission", responseOf(resp), err)
	}
	switch perm.GetPermission() {
	case "admin", "write":
		return true, nil
	}
	return false, nil
}

func (g *gitHub) Comments(ctx context.Context, number int64) ([]Comment, error) {
	opts := &gh.IssueListCommentsOptions{Sort: gh.Ptr("created"), Direction: gh.Ptr("asc"), ListOptions: gh.ListOptions{PerPage: 100}}
	var out []Comment
	for page := 0; page < g.maxPages; page++ {
		comments, resp, err := g.client.Issues.ListComments(ctx, g.owner, g.name, int(number), opts)
		if err != nil {
			return nil, apiError("list the pull request's comments", responseOf(resp), err)
		}
		for _, c := range comments {
			out = append(out, comment(Comment{ID: c.GetID(), Author: User{Login: c.GetUser().GetLogin(), ID: c.GetUser().GetID()}, Body: c.GetBody()}))
		}
		if resp.NextPage == 0 {
			break
		}
		opts.Page = resp.NextPage
	}
	return out, nil
}

func (g *gitHub) UpsertComment(ctx context.Context, number int64, marker, body string) error {
	self, err := g.self.get(ctx, g.whoami)
	if err != nil {
		return err
	}
	comments, err := g.Comments(ctx, number)
	if err != nil {
		return err
	}
	body = commentBody(marker, body, g.MaxCommentLength())
	if c, ok := findOwnComment(comments, self, marker); ok {
		_, resp, err := g.client.Issues.EditComment(ctx, g.owner, g.name, c.ID, &gh.IssueComment{Body: &body})
		return apiError("update the plan comment", responseOf(resp), err)
	}
	_, resp, err := g.client.Issues.CreateComment(ctx, g.owner, g.name, int(number), &gh.IssueComment{Body: &body})
	return apiError("create the plan comment", responseOf(resp), err)
}

func (g *gitHub) SetCommitStatus(ctx context.Context, sha string, st CommitStatus) error {
	if !validSHA(sha) {
		return fmt.Errorf("failed to set a commit status: %q is not a commit SHA", clip(sha, 80))
	}
	s := commitStatus(st)
	status := &gh.RepoStatus{State: gh.Ptr(string(s.State)), Context: &s.Context, Description: &s.Description}
	if s.TargetURL != "" {
		status.TargetURL = &s.TargetURL
	}
	_, resp, err := g.client.Repositories.CreateStatus(ctx, g.owner, g.name, sha, status)
	return apiError("set the commit status", responseOf(resp), err)
}

// cachedUser remembers who Terrace is on the forge once it was asked.
type cachedUser struct {
	mu   sync.Mutex
	user *User
}

func (c *cachedUser) get(ctx context.Context, whoami func(context.Context) (User, error)) (User, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.user != nil {
		return *c.user, nil
	}
	u, err := whoami(ctx)
	if err != nil {
		return User{}, err
	}
	if u.Login == "" && u.ID == 0 {
		return User{}, fmt.Errorf("failed to read who the credentials are: the forge named nobody")
	}
	c.user = &u
	return u, nil
}

// validLogin accepts the user names the forges allow (GitHub's bots end in
// [bot]); anything else never reaches a URL path.
func validLogin(s string) bool {
	if s == "" || len(s) > maxLogin {
		return false
	}
	s = strings.TrimSuffix(s, "[bot]")
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return s != "" && s != "." && s != ".."
}

func appendPaths(out []string, paths ...string) []string {
	for _, p := range paths {
		if p != "" {
			out = append(out, clip(p, maxPath))
		}
	}
	return out
}

// commitStatus bounds a status to what every forge accepts: a description
// of 140 characters (GitHub's limit) and an http(s) target URL.
func commitStatus(st CommitStatus) CommitStatus {
	st.Description = cutText(strings.ToValidUTF8(st.Description, "\uFFFD"), 140)
	st.Context = clip(st.Context, 255)
	if u, err := url.Parse(st.TargetURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || len(st.TargetURL) > maxURL {
		st.TargetURL = ""
	}
	switch st.State {
	case StatePending, StateSuccess, StateFailure:
	default:
		st.State = StateFailure
	}
	return st
}
