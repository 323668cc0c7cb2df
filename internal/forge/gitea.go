package forge

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"code.gitea.io/sdk/gitea"
)

// giteaForge is a repository on Gitea or Forgejo, through Gitea's SDK. The
// SDK takes a context per client, not per call, so each call gets a client
// of its own (cheap: the server's version is not asked).
type giteaForge struct {
	baseURL     string
	token       string
	http        *http.Client
	owner, name string
	maxPages    int
	self        cachedUser
}

// giteaPageSize is Gitea's default MAX_RESPONSE_ITEMS.
const giteaPageSize = 50

func newGitea(repo Repository, api *url.URL, creds credentials, opts Options) (*giteaForge, error) {
	owner, name, err := repo.OwnerName()
	if err != nil {
		return nil, err
	}
	// The SDK appends /api/v1 itself; accept the API URL with or without it.
	base := strings.TrimSuffix(strings.TrimSuffix(api.String(), "/"), "/api/v1")
	return &giteaForge{baseURL: base, token: creds.token, http: opts.httpClient(), owner: owner, name: name, maxPages: opts.MaxPages}, nil
}

func (g *giteaForge) client(ctx context.Context) (*gitea.Client, error) {
	c, err := gitea.NewClient(g.baseURL, gitea.SetToken(g.token), gitea.SetHTTPClient(g.http), gitea.SetContext(ctx), gitea.SetGiteaVersion(""))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return c, nil
}

func giteaResponse(r *gitea.Response) *http.Response {
	if r == nil {
		return nil
	}
	return r.Response
}

func (g *giteaForge) MaxCommentLength() int { return GiteaMaxComment }

// OpenPullRequests filters by base here: Gitea's list has no base filter.
func (g *giteaForge) OpenPullRequests(ctx context.Context, base string) ([]PullRequest, error) {
	c, err := g.client(ctx)
	if err != nil {
		return nil, err
	}
	opts := gitea.ListPullRequestsOptions{State: gitea.StateOpen, ListOptions: gitea.ListOptions{PageSize: giteaPageSize}}
	var out []PullRequest
	for page := 1; page <= g.maxPages; page++ {
		opts.Page = page
		prs, resp, err := c.ListRepoPullRequests(g.owner, g.name, opts)
		if err != nil {
			return nil, apiError("list pull requests", giteaResponse(resp), err)
		}
		for _, p := range prs {
			if p == nil || p.Head == nil || p.Base == nil {
				continue
			}
			author := User{}
			if p.Poster != nil {
				author = User{Login: p.Poster.UserName, ID: p.Poster.ID}
			}
			pr, ok := pullRequest(PullRequest{
				Number: p.Index, Title: p.Title, URL: p.HTMLURL, Author: author,
				HeadSHA: p.Head.Sha, HeadBranch: p.Head.Ref, BaseBranch: p.Base.Ref,
			})
			if ok && pr.BaseBranch == base {
				out = append(out, pr)
			}
		}
		if len(prs) < giteaPageSize || resp.NextPage == 0 {
			break
		}
	}
	return out, nil
}

func (g *giteaForge) ChangedFiles(ctx context.Context, number int64) ([]string, bool, error) {
	c, err := g.client(ctx)
	if err != nil {
		return nil, false, err
	}
	var out []string
	for page := 1; page <= g.maxPages; page++ {
		files, resp, err := c.ListPullRequestFiles(g.owner, g.name, number, gitea.ListPullRequestFilesOptions{ListOptions: gitea.ListOptions{Page: page, PageSize: giteaPageSize}})
		if err != nil {
			return nil, false, apiError("list the pull request's files", giteaResponse(resp), err)
		}
		for _, f := range files {
			if f != nil {
				out = appendPaths(out, f.Filename, f.PreviousFilename)
			}
		}
		if len(files) < giteaPageSize || resp.NextPage == 0 {
			return out, true, nil
		}
	}
	return out, false, nil
}

func (g *giteaForge) CanWrite(ctx context.Context, user User) (bool, error) {
	if !validLogin(user.Login) {
		return false, nil
	}
	c, err := g.client(ctx)
	if err != nil {
		return false, err
	}
	perm, resp, err := c.CollaboratorPermission(g.owner, g.name, user.Login)
	if err != nil {
		if r := giteaResponse(resp); r != nil && (r.StatusCode == http.StatusNotFound || r.StatusCode == http.StatusForbidden) {
			// Gitea answers 403 for a user who is no collaborator.
			return false, nil
		}
		return false, apiError("read the user's permission", giteaResponse(resp), err)
	}
	switch perm.Permission {
	case gitea.AccessModeWrite, gitea.AccessModeAdmin, gitea.AccessModeOwner:
		return true, nil
	}
	return false, nil
}

func (g *giteaForge) Comments(ctx context.Context, number int64) ([]Comment, error) {
	c, err := g.client(ctx)
	if err != nil {
		return nil, err
	}
	var out []Comment
	for page := 1; page <= g.maxPages; page++ {
		comments, resp, err := c.ListIssueComments(g.owner, g.name, number, gitea.ListIssueCommentOptions{ListOptions: gitea.ListOptions{Page: page, PageSize: giteaPageSize}})
		if err != nil {
			return nil, apiError("list the pull request's comments", giteaResponse(resp), err)
		}
		for _, cm := range comments {
			if cm == nil {
				continue
			}
			author := User{}
			if cm.Poster != nil {
				author = User{Login: cm.Poster.UserName, ID: cm.Poster.ID}
			}
			out = append(out, comment(Comment{ID: cm.ID, Author: author, Body: cm.Body}))
		}
		if len(comments) < giteaPageSize || resp.NextPage == 0 {
			break
		}
	}
	return out, nil
}

func (g *giteaForge) whoami(ctx context.Context) (User, error) {
	c, err := g.client(ctx)
	if err != nil {
		return User{}, err
	}
	u, resp, err := c.GetMyUserInfo()
	if err != nil {
		return User{}, apiError("read the token's user", giteaResponse(resp), err)
	}
	return User{Login: u.UserName, ID: u.ID}, nil
}

func (g *giteaForge) UpsertComment(ctx context.Context, number int64, marker, body string) error {
	self, err := g.self.get(ctx, g.whoami)
	if err != nil {
		return err
	}
	comments, err := g.Comments(ctx, number)
	if err != nil {
		return err
	}
	c, err := g.client(ctx)
	if err != nil {
		return err
	}
	body = commentBody(marker, body, g.MaxCommentLength())
	if own, ok := findOwnComment(comments, self, marker); ok {
		_, resp, err := c.EditIssueComment(g.owner, g.name, own.ID, gitea.EditIssueCommentOption{Body: body})
		return apiError("update the plan comment", giteaResponse(resp), err)
	}
	_, resp, err := c.CreateIssueComment(g.owner, g.name, number, gitea.CreateIssueCommentOption{Body: body})
	return apiError("create the plan comment", giteaResponse(resp), err)
}

func (g *giteaForge) SetCommitStatus(ctx context.Context, sha string, st CommitStatus) error {
	if !validSHA(sha) {
		return fmt.Errorf("failed to set a commit status: %q is not a commit SHA", clip(sha, 80))
	}
	c, err := g.client(ctx)
	if err != nil {
		return err
	}
	s := commitStatus(st)
	state := map[State]gitea.StatusState{StatePending: gitea.StatusPending, StateSuccess: gitea.StatusSuccess, StateFailure: gitea.StatusFailure}[s.State]
	_, resp, err := c.CreateStatus(g.owner, g.name, sha, gitea.CreateStatusOption{State: state, TargetURL: s.TargetURL, Description: s.Description, Context: s.Context})
	return apiError("set the commit status", giteaResponse(resp), err)
}
