package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"

	"github.com/terrace-dev/terrace/internal/forge"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// MaxPullRequests is the most open pull requests one ListPullRequests
// looks at.
const MaxPullRequests = 100

// maxPublishedPlan bounds the human plan a publish carries; the forge's
// comment limit cuts it further.
const maxPublishedPlan = 1 << 20

// The forge is called from the runner pod, never from the controller: its
// API URL is the Stack author's choice (docs/git-pull-requests.md), and its
// token is a Secret mounted in this pod only.

// ListPullRequests implements runnerv1.RunnerServiceServer.
func (s *Server) ListPullRequests(ctx context.Context, req *runnerv1.ListPullRequestsRequest) (*runnerv1.ListPullRequestsResponse, error) {
	release, err := s.acquire("list-pull-requests")
	if err != nil {
		return nil, err
	}
	defer release()
	f, err := s.forgeOf(req.GetForge())
	if err != nil {
		return nil, err
	}
	if req.GetBase() == "" {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "base names no branch")
	}
	limit := int(req.GetMaxPullRequests())
	if limit <= 0 || limit > MaxPullRequests {
		limit = MaxPullRequests
	}
	open, err := f.OpenPullRequests(ctx, req.GetBase())
	if err != nil {
		return nil, forgeStatus(err)
	}
	resp := &runnerv1.ListPullRequestsResponse{}
	if len(open) > limit {
		open, resp.Truncated = open[:limit], true
	}
	writers := writerCache{f: f, known: map[string]bool{}}
	for _, pr := range open {
		files, complete, err := f.ChangedFiles(ctx, pr.Number)
		if err != nil {
			return nil, forgeStatus(err)
		}
		canWrite, err := writers.canWrite(ctx, pr.Author)
		if err != nil {
			return nil, forgeStatus(err)
		}
		o := &runnerv1.ObservedPullRequest{
			Number: pr.Number, Title: pr.Title, Url: pr.URL, HeadSha: pr.HeadSHA, HeadBranch: pr.HeadBranch,
			Files: files, FilesComplete: complete, AuthorCanWrite: canWrite,
		}
		if req.GetPlanCommands() {
			if o.PlanCommanded, err = planCommanded(ctx, f, &writers, pr.Number); err != nil {
				return nil, forgeStatus(err)
			}
		}
		resp.PullRequests = append(resp.PullRequests, o)
	}
	return resp, nil
}

// planCommanded: someone who may push commented the plan command.
func planCommanded(ctx context.Context, f forge.Forge, writers *writerCache, number int64) (bool, error) {
	comments, err := f.Comments(ctx, number)
	if err != nil {
		return false, err
	}
	for _, c := range comments {
		if !forge.IsPlanCommand(c.Body) {
			continue
		}
		ok, err := writers.canWrite(ctx, c.Author)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// writerCache asks the forge once per user.
type writerCache struct {
	f     forge.Forge
	known map[string]bool
}

func (w *writerCache) canWrite(ctx context.Context, u forge.User) (bool, error) {
	key := fmt.Sprintf("%s/%d", u.Login, u.ID)
	if v, ok := w.known[key]; ok {
		return v, nil
	}
	v, err := w.f.CanWrite(ctx, u)
	if err != nil {
		return false, err
	}
	w.known[key] = v
	return v, nil
}

// PublishPullRequestPlan implements runnerv1.RunnerServiceServer.
func (s *Server) PublishPullRequestPlan(ctx context.Context, req *runnerv1.PublishPullRequestPlanRequest) (*runnerv1.PublishPullRequestPlanResponse, error) {
	release, err := s.acquire("publish-pull-request-plan")
	if err != nil {
		return nil, err
	}
	defer release()
	if req.GetNumber() <= 0 || req.GetNamespace() == "" || req.GetStack() == "" || len(req.GetPlan()) > maxPublishedPlan {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "a publish needs the pull request's number, the Stack's namespace and name, and a plan of at most 1 MiB")
	}
	f, err := s.forgeOf(req.GetForge())
	if err != nil {
		return nil, err
	}
	ns, stack := req.GetNamespace(), req.GetStack()
	st, description := commitStatusOf(req)
	// The status first: it is what a branch protection waits on, and it
	// is small; a comment the forge refuses must not leave it pending.
	if req.GetHeadSha() != "" {
		if err := f.SetCommitStatus(ctx, req.GetHeadSha(), forge.CommitStatus{State: st, Context: forge.StatusContext(ns, stack), Description: description}); err != nil {
			return nil, forgeStatus(err)
		}
	}
	body := forge.RenderPlanComment(forge.PlanComment{
		Namespace: ns, Stack: stack, Revision: req.GetRevision(), Status: req.GetStatus(),
		Add: req.GetAdd(), Change: req.GetChange(), Destroy: req.GetDestroy(),
		Message: s.exec.Redactor().String(req.GetMessage()), Plan: req.GetPlan(),
	}, f.MaxCommentLength())
	if err := f.UpsertComment(ctx, req.GetNumber(), forge.Marker(ns, stack), body); err != nil {
		return nil, forgeStatus(err)
	}
	return &runnerv1.PublishPullRequestPlanResponse{}, nil
}

// commitStatusOf words a plan's status as a commit status: GitHub keeps
// 140 characters of a description.
func commitStatusOf(req *runnerv1.PublishPullRequestPlanRequest) (forge.State, string) {
	switch req.GetStatus() {
	case runner.PullRequestPlanned:
		return forge.StateSuccess, fmt.Sprintf("Plan: +%d ~%d -%d", req.GetAdd(), req.GetChange(), req.GetDestroy())
	case runner.PullRequestFailed:
		return forge.StateFailure, clipDescription("Plan failed: " + req.GetMessage())
	}
	return forge.StatePending, "Planning"
}

func clipDescription(s string) string {
	r := []rune(s)
	if len(r) > 140 {
		return string(r[:139]) + "…"
	}
	return string(r)
}

// forgeOf builds the forge client from the request and the Secret mounted
// at its credentials_dir.
func (s *Server) forgeOf(f *runnerv1.Forge) (forge.Forge, error) {
	if f == nil || f.GetCredentialsDir() == "" {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "the forge and the directory of its credentials must be set")
	}
	data := map[string][]byte{}
	for _, key := range []string{forge.SecretToken, forge.SecretAppID, forge.SecretInstallationID, forge.SecretPrivateKey} {
		b, err := os.ReadFile(filepath.Join(f.GetCredentialsDir(), key))
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, statusError(codes.FailedPrecondition, runner.ReasonForgeFailed, fmt.Sprintf("failed to read the forge credentials' key %s: %v", key, err))
		}
		data[key] = b
	}
	cfg := forge.Config{Provider: forge.Provider(f.GetProvider()), APIURL: f.GetApiUrl()}
	fg, err := forge.New(cfg, data, f.GetRepositoryUrl(), forge.Options{})
	if err != nil {
		return nil, forgeStatus(err)
	}
	return fg, nil
}

// forgeStatus classifies a forge error; its text is internal/forge's,
// which never quotes the forge's answer.
func forgeStatus(err error) error {
	if isStatus(err) {
		return err
	}
	code := codes.Unavailable
	switch {
	case errors.Is(err, forge.ErrInvalidConfig):
		code = codes.InvalidArgument
	case errors.Is(err, forge.ErrUnauthorized), errors.Is(err, forge.ErrForbidden):
		code = codes.PermissionDenied
	case errors.Is(err, forge.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return statusError(code, runner.ReasonForgeFailed, err.Error())
}
