// Package forge is Terrace's small interface over the forges that host a
// Stack's repository (GitHub, GitLab, Gitea/Forgejo): what plans of pull
// requests need and nothing more. Each implementation uses the forge's own
// well-kept client; this package adds the bounds that make a forge's
// answers safe to act on (pages, bytes, time, comment length), since a
// forge's responses, and what pull-request authors wrote in them, are
// untrusted input.
package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Forge is what Terrace asks of a forge about one repository.
type Forge interface {
	// OpenPullRequests lists the open pull requests whose base is the
	// branch base (merge requests whose target branch it is, on GitLab).
	OpenPullRequests(ctx context.Context, base string) ([]PullRequest, error)
	// ChangedFiles lists the paths a pull request changes (old and new
	// path of a rename both). complete is false when the list was cut at
	// the bounds: a caller deciding whether the pull request touches a
	// path should then assume it does.
	ChangedFiles(ctx context.Context, number int64) (files []string, complete bool, err error)
	// CanWrite reports whether user may push to the repository.
	CanWrite(ctx context.Context, user User) (bool, error)
	// Comments lists a pull request's comments, oldest first (system notes
	// left out).
	Comments(ctx context.Context, number int64) ([]Comment, error)
	// UpsertComment makes the pull request carry one comment of Terrace's
	// that starts with marker: the one this identity wrote before is
	// edited in place, or a new one is created. The body is truncated at
	// MaxCommentLength.
	UpsertComment(ctx context.Context, number int64, marker, body string) error
	// SetCommitStatus sets a commit status on the commit sha.
	SetCommitStatus(ctx context.Context, sha string, status CommitStatus) error
	// MaxCommentLength is the longest comment body the forge accepts, in
	// characters.
	MaxCommentLength() int
}

// PullRequest is an open pull request (a merge request on GitLab).
type PullRequest struct {
	Number     int64
	Title      string
	URL        string
	Author     User
	HeadSHA    string
	HeadBranch string
	BaseBranch string
}

// User is an account on the forge. ID is set where the forge's API needs
// it (GitLab) and known.
type User struct {
	Login string
	ID    int64
}

// Comment is a comment on a pull request.
type Comment struct {
	ID     int64
	Author User
	Body   string
}

// State of a commit status.
type State string

const (
	StatePending State = "pending"
	StateSuccess State = "success"
	StateFailure State = "failure"
)

// CommitStatus is what a commit status says. Context is
// terrace/<namespace>/<stack> (StatusContext).
type CommitStatus struct {
	State       State
	Context     string
	Description string
	TargetURL   string
}

// StatusContext is the commit status context of a Stack's pull-request plans.
func StatusContext(namespace, stack string) string {
	return "terrace/" + namespace + "/" + stack
}

// Marker is the hidden line that starts a Stack's plan comment, by which it
// is found again.
func Marker(namespace, stack string) string {
	return "<!-- terrace:" + namespace + "/" + stack + " -->"
}

// Errors a caller can act on; the forge's own message is not passed on (it
// is the forge's text, untrusted and unbounded).
var (
	// ErrNotFound: the repository, pull request or user does not exist,
	// or the credentials may not see it.
	ErrNotFound = errors.New("not found on the forge")
	// ErrUnauthorized: the forge refused the credentials.
	ErrUnauthorized = errors.New("the forge refused the credentials")
	// ErrForbidden: the credentials lack a permission, or a rate limit hit.
	ErrForbidden = errors.New("the forge refused the request (permission or rate limit)")
	// ErrInvalidConfig: the Stack's pullRequests or its Secret cannot work.
	ErrInvalidConfig = errors.New("invalid forge configuration")
)

// apiError turns a forge client's error into one of the errors above (or a
// short error naming the status), keeping the operation in the message.
func apiError(op string, resp *http.Response, err error) error {
	if err == nil {
		return nil
	}
	if resp != nil {
		switch resp.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("failed to %s: %w", op, ErrNotFound)
		case http.StatusUnauthorized:
			return fmt.Errorf("failed to %s: %w", op, ErrUnauthorized)
		case http.StatusForbidden, http.StatusTooManyRequests:
			return fmt.Errorf("failed to %s: %w", op, ErrForbidden)
		}
		if resp.StatusCode >= 300 {
			return fmt.Errorf("failed to %s: the forge answered %s", op, resp.Status)
		}
	}
	var tooLarge *responseTooLargeError
	if errors.As(err, &tooLarge) {
		return fmt.Errorf("failed to %s: %w", op, tooLarge)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("failed to %s: %w", op, err)
	}
	return fmt.Errorf("failed to %s: %s", op, clip(err.Error(), 256))
}

// Bounds on what is kept of a forge's text.
const (
	maxTitle  = 256
	maxURL    = 2048
	maxRef    = 255
	maxLogin  = 255
	maxPath   = 4096
	maxBodyIn = 256 << 10 // of a comment read back: enough for a command or a marker
)

// clip cuts s to at most n bytes, on a rune boundary, and makes it valid UTF-8.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// validSHA accepts a full SHA-1 or SHA-256 object name in lowercase hex.
func validSHA(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// pullRequest bounds what the forge said of a pull request; one with an
// invalid head SHA is dropped (ok false): nothing could be planned of it.
func pullRequest(pr PullRequest) (PullRequest, bool) {
	pr.HeadSHA = strings.ToLower(pr.HeadSHA)
	if pr.Number <= 0 || !validSHA(pr.HeadSHA) {
		return PullRequest{}, false
	}
	pr.Title = clip(pr.Title, maxTitle)
	pr.URL = clip(pr.URL, maxURL)
	pr.Author.Login = clip(pr.Author.Login, maxLogin)
	pr.HeadBranch = clip(pr.HeadBranch, maxRef)
	pr.BaseBranch = clip(pr.BaseBranch, maxRef)
	return pr, true
}

func comment(c Comment) Comment {
	c.Author.Login = clip(c.Author.Login, maxLogin)
	c.Body = clip(c.Body, maxBodyIn)
	return c
}

// findOwnComment is the comment of self's that starts with marker.
func findOwnComment(comments []Comment, self User, marker string) (Comment, bool) {
	for _, c := range comments {
		if !sameUser(c.Author, self) {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(c.Body, " \r\n"), marker) {
			return c, true
		}
	}
	return Comment{}, false
}

func sameUser(a, b User) bool {
	if a.ID != 0 && b.ID != 0 {
		return a.ID == b.ID
	}
	return a.Login != "" && strings.EqualFold(a.Login, b.Login)
}

// commentBody is what UpsertComment posts: the marker on the first line,
// then the body, cut at limit characters.
func commentBody(marker, body string, limit int) string {
	if !strings.HasPrefix(body, marker) {
		body = marker + "\n" + body
	}
	return TruncateComment(body, limit)
}
