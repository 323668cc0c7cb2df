package server

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/storage/memory"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// Defaults of the clone's bounds.
const (
	// DefaultMaxCloneBytes bounds what a clone takes in: the bytes read
	// from an http(s) server, and the objects stored, uncompressed.
	DefaultMaxCloneBytes = 256 << 20
	// DefaultCloneTimeout bounds one clone, listing tags included.
	DefaultCloneTimeout = 5 * time.Minute
)

// defaultBranch is the branch cloned when spec.source.git.ref is empty.
const defaultBranch = "main"

var commitPattern = regexp.MustCompile(`^[0-9a-f]{40}$`)

// pullRefPattern is the head ref of a pull request (GitHub, Gitea) or a
// merge request (GitLab).
var pullRefPattern = regexp.MustCompile(`^refs/(pull|merge-requests)/[1-9][0-9]{0,18}/head$`)

// headMovedError: the pull request's head is no longer the commit asked for.
type headMovedError struct{ ref, want, got string }

func (e *headMovedError) Error() string {
	return fmt.Sprintf("%s is at %s, not %s: the pull request was pushed to meanwhile", e.ref, e.got, e.want)
}

// Clone clones one ref of a Git repository from the pod's network
// position and makes its commit's tree the source: the tree is built into
// the deterministic tar.gz Build makes (so the digest depends on the
// commit only) and extracted with the same checks as any uploaded module.
// Nothing of the clone is kept on disk: objects live in memory, bounded.
func (s *Server) Clone(ctx context.Context, req *runnerv1.CloneRequest) (*runnerv1.CloneResponse, error) {
	release, err := s.acquire("clone")
	if err != nil {
		return nil, err
	}
	defer release()
	ep, err := parseGitURL(req.GetUrl())
	if err != nil {
		return nil, err
	}
	ref, err := checkRef(req.GetRef())
	if err != nil {
		return nil, err
	}
	creds, err := gitAuth(ep, req.GetCredentialsDir())
	if err != nil {
		return nil, err
	}
	timeout := s.cfg.CloneTimeout
	if timeout <= 0 {
		timeout = DefaultCloneTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	limit := s.cfg.MaxCloneBytes
	if limit <= 0 {
		limit = DefaultMaxCloneBytes
	}
	c := &clone{ep: ep, url: req.GetUrl(), auth: creds.auth, ref: ref, limit: limit}
	commit, name, err := c.resolve(withCloneHTTP(cctx, limit, creds.roots))
	if err != nil {
		if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			return nil, statusError(codes.Unavailable, runner.ReasonFetchFailed,
				fmt.Sprintf("the clone of %s did not finish within %s", ep.describe(), timeout))
		}
		return nil, c.toStatus(err)
	}
	entries, err := treeEntries(commit)
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("failed to check out %s of %s: %w", commit.Hash, ep.describe(), err))
	}
	data, digest, err := artifact.BuildEntries(entries)
	if err != nil {
		return nil, s.toStatus(fmt.Errorf("%w: %s of %s: %w", artifact.ErrUnsafeEntry, commit.Hash, ep.describe(), err))
	}
	if err := s.exec.ResetSource(); err != nil {
		return nil, s.toStatus(err)
	}
	if err := artifact.ExtractBytes(data, digest, s.exec.SourceDir(), s.archiveLimits()); err != nil {
		_ = s.exec.ResetSource()
		return nil, s.toStatus(fmt.Errorf("failed to check out %s of %s: %w", commit.Hash, ep.describe(), err))
	}
	return &runnerv1.CloneResponse{
		Source: &runnerv1.SourceInfo{Digest: digest, Size: int64(len(data))},
		Commit: commitInfo(commit, name),
	}, nil
}

// checkRef refuses a ref the API would refuse too, and defaults it.
func checkRef(r *runnerv1.GitRef) (*runnerv1.GitRef, error) {
	if r == nil {
		r = &runnerv1.GitRef{}
	}
	set := 0
	for _, v := range []string{r.GetTag(), r.GetSemver(), r.GetCommit()} {
		if v != "" {
			set++
		}
	}
	if set > 1 || (r.GetBranch() != "" && (r.GetTag() != "" || r.GetSemver() != "")) {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, "set one of branch, tag, semver and commit (a commit may name its branch)")
	}
	if c := r.GetCommit(); c != "" && !commitPattern.MatchString(c) {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("commit %q must be 40 lowercase hex digits", c))
	}
	if p := r.GetPullRef(); p != "" && (r.GetCommit() == "" || !pullRefPattern.MatchString(p)) {
		return nil, statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("pull ref %q must be refs/pull/<n>/head or refs/merge-requests/<n>/head, with the expected commit", p))
	}
	if set == 0 && r.GetBranch() == "" {
		return &runnerv1.GitRef{Branch: defaultBranch}, nil
	}
	return r, nil
}

// clone is one Clone call's repository access.
type clone struct {
	ep    gitEndpoint
	url   string
	auth  transport.AuthMethod
	ref   *runnerv1.GitRef
	limit int64
}

// resolve fetches what the ref needs into memory and returns its commit
// and the name the revision carries ("" for a bare commit).
func (c *clone) resolve(ctx context.Context) (*object.Commit, string, error) {
	store := &boundedStorage{Storage: memory.NewStorage(), limit: c.limit}
	repo, err := git.Init(store, nil)
	if err != nil {
		return nil, "", err
	}
	if _, err := repo.CreateRemote(&config.RemoteConfig{Name: "origin", URLs: []string{c.url}}); err != nil {
		return nil, "", err
	}
	r := c.ref
	switch {
	case r.GetPullRef() != "":
		// A pull request's head is one ref, fetched shallow; a push after
		// the forge was asked moves it, and then the commit asked for is
		// not planned (a later look plans the new head).
		local := "refs/remotes/origin/pull"
		if err := c.fetch(ctx, repo, "+"+r.GetPullRef()+":"+local, 1); err != nil {
			return nil, "", err
		}
		commit, err := commitAt(repo, plumbing.ReferenceName(local))
		if err != nil {
			return nil, "", err
		}
		if commit.Hash.String() != r.GetCommit() {
			return nil, "", &headMovedError{ref: r.GetPullRef(), want: r.GetCommit(), got: commit.Hash.String()}
		}
		return commit, r.GetBranch(), nil
	case r.GetCommit() != "":
		// A commit may be anywhere in the history: no shallow fetch can
		// promise to reach it, so its branch (or every branch) is fetched
		// whole, within the size bound.
		spec := "+refs/heads/*:refs/remotes/origin/*"
		if r.GetBranch() != "" {
			spec = fmt.Sprintf("+refs/heads/%s:refs/remotes/origin/%s", r.GetBranch(), r.GetBranch())
		}
		if err := c.fetch(ctx, repo, spec, 0); err != nil {
			return nil, "", err
		}
		commit, err := repo.CommitObject(plumbing.NewHash(r.GetCommit()))
		if err != nil {
			return nil, "", &refNotFoundError{what: c.describeRef()}
		}
		return commit, r.GetBranch(), nil
	case r.GetBranch() != "":
		local := "refs/remotes/origin/" + r.GetBranch()
		if err := c.fetch(ctx, repo, "+refs/heads/"+r.GetBranch()+":"+local, 1); err != nil {
			return nil, "", err
		}
		commit, err := commitAt(repo, plumbing.ReferenceName(local))
		return commit, r.GetBranch(), err
	}
	tag := r.GetTag()
	if r.GetSemver() != "" {
		if tag, err = c.highestTag(ctx, r.GetSemver()); err != nil {
			return nil, "", err
		}
	}
	if err := c.fetch(ctx, repo, "+refs/tags/"+tag+":refs/tags/"+tag, 1); err != nil {
		return nil, "", err
	}
	commit, err := commitAt(repo, plumbing.NewTagReferenceName(tag))
	return commit, tag, err
}

func (c *clone) fetch(ctx context.Context, repo *git.Repository, refSpec string, depth int) error {
	err := repo.FetchContext(ctx, &git.FetchOptions{
		RemoteName: "origin",
		RefSpecs:   []config.RefSpec{config.RefSpec(refSpec)},
		Depth:      depth,
		Auth:       c.auth,
		Tags:       git.NoTags,
	})
	if errors.Is(err, git.NoMatchingRefSpecError{}) {
		return &refNotFoundError{what: c.describeRef()}
	}
	return err
}

// highestTag lists the remote's tags and picks the highest version in
// the range; tags that are not versions are ignored.
func (c *clone) highestTag(ctx context.Context, rng string) (string, error) {
	constraint, err := semver.NewConstraint(rng)
	if err != nil {
		return "", statusError(codes.InvalidArgument, runner.ReasonInvalidArgument, fmt.Sprintf("semver range %q is not valid: %v", rng, err))
	}
	remote := git.NewRemote(memory.NewStorage(), &config.RemoteConfig{Name: "origin", URLs: []string{c.url}})
	refs, err := remote.ListContext(ctx, &git.ListOptions{Auth: c.auth})
	if err != nil {
		return "", err
	}
	var best *semver.Version
	var bestTag string
	for _, ref := range refs {
		if !ref.Name().IsTag() {
			continue
		}
		name := ref.Name().Short()
		v, err := semver.NewVersion(name)
		if err != nil || !constraint.Check(v) {
			continue
		}
		if best == nil || v.GreaterThan(best) {
			best, bestTag = v, name
		}
	}
	if best == nil {
		return "", &refNotFoundError{what: fmt.Sprintf("a tag in the semver range %q", rng)}
	}
	return bestTag, nil
}

// commitAt peels a fetched ref (an annotated tag too) to its commit.
func commitAt(repo *git.Repository, name plumbing.ReferenceName) (*object.Commit, error) {
	ref, err := repo.Reference(name, true)
	if err != nil {
		return nil, fmt.Errorf("fetched ref %s is missing: %w", name, err)
	}
	if tag, err := repo.TagObject(ref.Hash()); err == nil {
		return tag.Commit()
	}
	return repo.CommitObject(ref.Hash())
}

func (c *clone) describeRef() string {
	r := c.ref
	switch {
	case r.GetPullRef() != "":
		return fmt.Sprintf("%s (commit %s)", r.GetPullRef(), r.GetCommit())
	case r.GetCommit() != "" && r.GetBranch() != "":
		return fmt.Sprintf("commit %s on branch %q", r.GetCommit(), r.GetBranch())
	case r.GetCommit() != "":
		return "commit " + r.GetCommit()
	case r.GetTag() != "":
		return fmt.Sprintf("tag %q", r.GetTag())
	case r.GetSemver() != "":
		return fmt.Sprintf("a tag in the semver range %q", r.GetSemver())
	}
	return fmt.Sprintf("branch %q", r.GetBranch())
}

// refNotFoundError: the repository has no such branch, tag or commit.
type refNotFoundError struct{ what string }

func (e *refNotFoundError) Error() string { return e.what + " not found" }

// errCloneTooLarge: the clone went over MaxCloneBytes.
var errCloneTooLarge = errors.New("clone limit exceeded")

// toStatus words a failed clone for the Stack's status: it names the
// host and the ref, never a credential (not even one in the URL) and
// never what the server answered beyond its kind.
func (c *clone) toStatus(err error) error {
	host := c.ep.describe()
	var notFound *refNotFoundError
	var keyErr *hostKeyError
	var moved *headMovedError
	switch {
	case errors.As(err, &moved):
		return statusError(codes.FailedPrecondition, runner.ReasonPlanStale, fmt.Sprintf("%s: %s", host, moved.Error()))
	case err == nil:
		return nil
	case isStatus(err):
		return err
	case errors.As(err, &notFound):
		return statusError(codes.NotFound, runner.ReasonGitRefNotFound, fmt.Sprintf("%s: %s", host, notFound.Error()))
	case errors.Is(err, transport.ErrRepositoryNotFound):
		return statusError(codes.NotFound, runner.ReasonGitRefNotFound, fmt.Sprintf("%s: repository not found (or the credentials may not read it)", host))
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return statusError(codes.NotFound, runner.ReasonGitRefNotFound, fmt.Sprintf("%s: the repository is empty, %s not found", host, c.describeRef()))
	case errors.As(err, &keyErr):
		return statusError(codes.FailedPrecondition, runner.ReasonGitHostKeyUnknown, keyErr.Error())
	case errors.Is(err, transport.ErrAuthenticationRequired), errors.Is(err, transport.ErrAuthorizationFailed), isSSHAuthFailure(err):
		return statusError(codes.PermissionDenied, runner.ReasonGitAuthFailed, fmt.Sprintf("%s refused the credentials (or asked for some): check the Secret of spec.source.git.secretRef", host))
	case errors.Is(err, errCloneTooLarge):
		return statusError(codes.InvalidArgument, runner.ReasonTooLarge, fmt.Sprintf("%s: %s is larger than the runner's clone limit of %d bytes", host, c.describeRef(), c.limit))
	case errors.Is(err, context.Canceled):
		return statusError(codes.Canceled, runner.ReasonInterrupted, "the clone of "+host+" was cancelled")
	}
	return statusError(codes.Unavailable, runner.ReasonFetchFailed, fmt.Sprintf("failed to clone %s: %s", host, c.ep.scrub(err.Error())))
}

func isStatus(err error) bool {
	_, ok := status.FromError(err)
	return ok
}

func isSSHAuthFailure(err error) bool {
	return strings.Contains(err.Error(), "ssh: unable to authenticate")
}
