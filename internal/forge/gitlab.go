package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	gl "gitlab.com/gitlab-org/api/client-go/v2"
)

// gitLab is a project on GitLab, through GitLab's own client.
type gitLab struct {
	client   *gl.Client
	project  string
	maxPages int
	self     cachedUser
}

func newGitLab(repo Repository, api *url.URL, creds credentials, opts Options) (*gitLab, error) {
	client, err := gl.NewClient(creds.token,
		gl.WithBaseURL(api.String()),
		gl.WithHTTPClient(opts.httpClient()),
		// A retried POST could post a second comment.
		gl.WithOnlyIdempotentRetries(),
		gl.WithCustomRetryMax(2),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	project := repo.Path
	// A GitLab under a relative URL root (https://host/gitlab/api/v4)
	// serves https://host/gitlab/group/project: the project is
	// group/project.
	if root := strings.Trim(strings.TrimSuffix(strings.Trim(api.Path, "/"), "api/v4"), "/"); root != "" {
		project = strings.TrimPrefix(project, root+"/")
	}
	return &gitLab{client: client, project: project, maxPages: opts.MaxPages}, nil
}

func glResponse(r *gl.Response) *http.Response {
	if r == nil {
		return nil
	}
	return r.Response
}

func (g *gitLab) MaxCommentLength() int { return GitLabMaxComment }

func (g *gitLab) OpenPullRequests(ctx context.Context, base string) ([]PullRequest, error) {
	opts := &gl.ListProjectMergeRequestsOptions{State: gl.Ptr("opened"), TargetBranch: gl.Ptr(base), ListOptions: gl.ListOptions{PerPage: 100}}
	var out []PullRequest
	for page := 0; page < g.maxPages; page++ {
		mrs, resp, err := g.client.MergeRequests.ListProjectMergeRequests(g.project, opts, gl.WithContext(ctx))
		if err != nil {
			return nil, apiError("list merge requests", glResponse(resp), err)
		}
		for _, m := range mrs {
			author := User{}
			if m.Author != nil {
				author = User{Login: m.Author.Username, ID: m.Author.ID}
			}
			pr, ok := pullRequest(PullRequest{
				Number: m.IID, Title: m.Title, URL: m.WebURL, Author: author,
				HeadSHA: m.SHA, HeadBranch: m.SourceBranch, BaseBranch: m.TargetBranch,
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

// ChangedFiles reads the merge request's diffs, which carry each file's
// diff text too: small pages, and a page too large to read ends the list
// as incomplete rather than as an error.
func (g *gitLab) ChangedFiles(ctx context.Context, number int64) ([]string, bool, error) {
	opts := &gl.ListMergeRequestDiffsOptions{ListOptions: gl.ListOptions{PerPage: 20}}
	var out []string
	for page := 0; page < g.maxPages; page++ {
		diffs, resp, err := g.client.MergeRequests.ListMergeRequestDiffs(g.project, number, opts, gl.WithContext(ctx))
		var tooLarge *responseTooLargeError
		if errors.As(err, &tooLarge) {
			return out, false, nil
		}
		if err != nil {
			return nil, false, apiError("list the merge request's files", glResponse(resp), err)
		}
		for _, d := range diffs {
			out = appendPaths(out, d.NewPath)
			if d.OldPath != d.NewPath {
				out = appendPaths(out, d.OldPath)
			}
		}
		if resp.NextPage == 0 {
			return out, true, nil
		}
		opts.Page = resp.NextPage
	}
	return out, false, nil
}

// CanWrite: Developer or more, direct or inherited from a group, may push.
func (g *gitLab) CanWrite(ctx context.Context, user User) (bool, error) {
	id := user.ID
	if id == 0 {
		if !validLogin(user.Login) {
			return false, nil
		}
		users, resp, err := g.client.Users.ListUsers(&gl.ListUsersOptions{Username: gl.Ptr(user.Login)}, gl.WithContext(ctx))
		if err != nil {
			return false, apiError("look the user up", glResponse(resp), err)
		}
		for _, u := range users {
			if strings.EqualFold(u.Username, user.Login) {
				id = u.ID
			}
		}
		if id == 0 {
			return false, nil
		}
	}
	m, resp, err := g.client.ProjectMembers.GetInheritedProjectMember(g.project, id, gl.WithContext(ctx))
	if err != nil {
		if r := glResponse(resp); r != nil && r.StatusCode == http.StatusNotFound {
			return false, nil
		}
		return false, apiError("read the user's membership", glResponse(resp), err)
	}
	return m.AccessLevel >= gl.DeveloperPermissions, nil
}

func (g *gitLab) Comments(ctx context.Context, number int64) ([]Comment, error) {
	opts := &gl.ListMergeRequestNotesOptions{OrderBy: gl.Ptr("created_at"), Sort: gl.Ptr("asc"), ListOptions: gl.ListOptions{PerPage: 100}}
	var out []Comment
	for page := 0; page < g.maxPages; page++ {
		notes, resp, err := g.client.Notes.ListMergeRequestNotes(g.project, number, opts, gl.WithContext(ctx))
		if err != nil {
			return nil, apiError("list the merge request's notes", glResponse(resp), err)
		}
		for _, n := range notes {
			if n.System {
				continue
			}
			out = append(out, comment(Comment{ID: n.ID, Author: User{Login: n.Author.Username, ID: n.Author.ID}, Body: n.Body}))
		}
		if resp.NextPage == 0 {
			break
		}
		opts.Page = resp.NextPage
	}
	return out, nil
}

func (g *gitLab) whoami(ctx context.Context) (User, error) {
	u, resp, err := g.client.Users.CurrentUser(gl.WithContext(ctx))
	if err != nil {
		return User{}, apiError("read the token's user", glResponse(resp), err)
	}
	return User{Login: u.Username, ID: u.ID}, nil
}

func (g *gitLab) UpsertComment(ctx context.Context, number int64, marker, body string) error {
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
		_, resp, err := g.client.Notes.UpdateMergeRequestNote(g.project, number, c.ID, &gl.UpdateMergeRequestNoteOptions{Body: &body}, gl.WithContext(ctx))
		return apiError("update the plan note", glResponse(resp), err)
	}
	_, resp, err := g.client.Notes.CreateMergeRequestNote(g.project, number, &gl.CreateMergeRequestNoteOptions{Body: &body}, gl.WithContext(ctx))
	return apiError("create the plan note", glResponse(resp), err)
}

func (g *gitLab) SetCommitStatus(ctx context.Context, sha string, st CommitStatus) error {
	if !validSHA(sha) {
		return fmt.Errorf("failed to set a commit status: %q is not a commit SHA", clip(sha, 80))
	}
	s := commitStatus(st)
	state := map[State]gl.BuildStateValue{StatePending: gl.Pending, StateSuccess: gl.Success, StateFailure: gl.Failed}[s.State]
	opts := &gl.SetCommitStatusOptions{State: state, Name: &s.Context, Description: &s.Description}
	if s.TargetURL != "" {
		opts.TargetURL = &s.TargetURL
	}
	_, resp, err := g.client.Commits.SetCommitStatus(g.project, sha, opts, gl.WithContext(ctx))
	return apiError("set the commit status", glResponse(resp), err)
}
