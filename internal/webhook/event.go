package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// Forges, as told by the request's headers.
const (
	forgeGitHub = "github"
	forgeGitea  = "gitea"
	forgeGitLab = "gitlab"
)

// Kinds of events that concern Stacks.
const (
	kindPush        = "push"
	kindPullRequest = "pull_request"
	kindComment     = "comment"
	kindPing        = "ping"
)

// delivery is a request's forge, event name and signature, read from its
// headers alone.
type delivery struct {
	forge     string
	event     string
	signature string // GitHub and Gitea: the HMAC's hex; GitLab: the token
}

var (
	errNoForge     = errors.New("not a GitHub, GitLab, Gitea or Forgejo webhook")
	errUnsigned    = errors.New("the webhook is not signed: give the webhook the secret of the Stack's spec.source.git.webhook.secretRef")
	errUnknownKind = errors.New("event not handled: send push and pull request events")
)

// readDelivery reads the headers. Gitea and Forgejo send GitHub's headers
// too, so theirs are looked at first.
func readDelivery(h http.Header) (delivery, error) {
	switch {
	case h.Get("X-Forgejo-Event") != "" || h.Get("X-Gitea-Event") != "":
		d := delivery{forge: forgeGitea, event: first(h.Get("X-Forgejo-Event"), h.Get("X-Gitea-Event"))}
		d.signature = first(h.Get("X-Forgejo-Signature"), h.Get("X-Gitea-Signature"))
		if d.signature == "" {
			// A Gitea whose webhook has no secret still sends the header, empty.
			return d, errUnsigned
		}
		return d, nil
	case h.Get("X-Gitlab-Event") != "":
		d := delivery{forge: forgeGitLab, event: h.Get("X-Gitlab-Event"), signature: h.Get("X-Gitlab-Token")}
		if d.signature == "" {
			return d, errUnsigned
		}
		return d, nil
	case h.Get("X-GitHub-Event") != "":
		d := delivery{forge: forgeGitHub, event: h.Get("X-GitHub-Event")}
		sig, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256=")
		if !ok || sig == "" {
			return d, errUnsigned
		}
		d.signature = sig
		return d, nil
	}
	return delivery{}, errNoForge
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// verify checks the delivery's signature of body against one secret:
// HMAC-SHA256 for GitHub and Gitea, the token itself for GitLab; both in
// constant time.
func (d delivery) verify(body, secret []byte) bool {
	if len(secret) == 0 {
		return false
	}
	if d.forge == forgeGitLab {
		// Comparing digests keeps the secret's length out of the timing.
		a, b := sha256.Sum256([]byte(d.signature)), sha256.Sum256(secret)
		return subtle.ConstantTimeCompare(a[:], b[:]) == 1
	}
	got, err := hex.DecodeString(strings.ToLower(d.signature))
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}

// event is what a delivery says that decides which Stacks it concerns.
type event struct {
	kind string
	// repoURLs are the repository's URLs as the forge gave them (https,
	// ssh, web).
	repoURLs []string
	// ref is a push's full ref (refs/heads/main, refs/tags/v1).
	ref string
	// base is a pull request's base branch, when the event names it.
	base    string
	number  int64
	action  string
	headSHA string
}

// kindOf names the event's kind from its header, or "" when Terrace does
// not act on it.
func kindOf(d delivery) string {
	switch d.forge {
	case forgeGitHub, forgeGitea:
		switch d.event {
		case "push", "create":
			return kindPush
		case "pull_request", "pull_request_sync":
			return kindPullRequest
		case "issue_comment", "pull_request_comment":
			return kindComment
		case "ping":
			return kindPing
		}
	case forgeGitLab:
		switch d.event {
		case "Push Hook", "Tag Push Hook", "System Hook":
			return kindPush
		case "Merge Request Hook":
			return kindPullRequest
		case "Note Hook":
			return kindComment
		}
	}
	return ""
}

// Payloads, as much of them as Terrace reads. GitHub and Gitea share one
// shape (Gitea's is GitHub's, by design).
type hubPayload struct {
	Ref        string `json:"ref"`
	After      string `json:"after"`
	Action     string `json:"action"`
	Number     int64  `json:"number"`
	Repository struct {
		CloneURL string `json:"clone_url"`
		SSHURL   string `json:"ssh_url"`
		HTMLURL  string `json:"html_url"`
	} `json:"repository"`
	PullRequest *struct {
		Number int64 `json:"number"`
		Head   struct {
			Ref string `json:"ref"`
			SHA string `json:"sha"`
		} `json:"head"`
		Base struct {
			Ref string `json:"ref"`
		} `json:"base"`
	} `json:"pull_request"`
	Issue *struct {
		Number      int64            `json:"number"`
		PullRequest *json.RawMessage `json:"pull_request"`
	} `json:"issue"`
}

type labPayload struct {
	ObjectKind  string `json:"object_kind"`
	Ref         string `json:"ref"`
	After       string `json:"after"`
	CheckoutSHA string `json:"checkout_sha"`
	Project     struct {
		GitHTTPURL string `json:"git_http_url"`
		GitSSHURL  string `json:"git_ssh_url"`
		WebURL     string `json:"web_url"`
	} `json:"project"`
	ObjectAttributes *struct {
		IID          int64  `json:"iid"`
		Action       string `json:"action"`
		TargetBranch string `json:"target_branch"`
		NoteableType string `json:"noteable_type"`
		LastCommit   struct {
			ID string `json:"id"`
		} `json:"last_commit"`
	} `json:"object_attributes"`
	MergeRequest *struct {
		IID          int64  `json:"iid"`
		TargetBranch string `json:"target_branch"`
	} `json:"merge_request"`
}

var errBadPayload = errors.New("the payload is not the JSON of a push or pull request event")

// parseEvent reads the payload of a delivery of a known kind.
func parseEvent(d delivery, kind string, body []byte) (event, error) {
	ev := event{kind: kind}
	switch d.forge {
	case forgeGitHub, forgeGitea:
		var p hubPayload
		if err := json.Unmarshal(body, &p); err != nil {
			return ev, errBadPayload
		}
		ev.repoURLs = nonEmpty(p.Repository.CloneURL, p.Repository.SSHURL, p.Repository.HTMLURL)
		ev.action = p.Action
		switch kind {
		case kindPush:
			ev.ref, ev.headSHA = p.Ref, p.After
			if d.event == "create" && !strings.HasPrefix(ev.ref, "refs/") {
				// A create event names a tag or branch by its short name;
				// only tags matter (a new branch has no Stack yet).
				ev.ref = "refs/tags/" + ev.ref
			}
		case kindPullRequest:
			if p.PullRequest == nil {
				return ev, errBadPayload
			}
			ev.number = first64(p.Number, p.PullRequest.Number)
			ev.base, ev.headSHA = p.PullRequest.Base.Ref, p.PullRequest.Head.SHA
		case kindComment:
			if p.Issue == nil || (d.forge == forgeGitHub && p.Issue.PullRequest == nil) {
				// A comment on an issue, not a pull request.
				ev.kind = ""
				return ev, nil
			}
			ev.number = p.Issue.Number
		}
	case forgeGitLab:
		var p labPayload
		if err := json.Unmarshal(body, &p); err != nil {
			return ev, errBadPayload
		}
		ev.repoURLs = nonEmpty(p.Project.GitHTTPURL, p.Project.GitSSHURL, p.Project.WebURL)
		switch kind {
		case kindPush:
			ev.ref, ev.headSHA = p.Ref, first(p.CheckoutSHA, p.After)
		case kindPullRequest:
			if p.ObjectAttributes == nil {
				return ev, errBadPayload
			}
			a := p.ObjectAttributes
			ev.number, ev.action, ev.base, ev.headSHA = a.IID, a.Action, a.TargetBranch, a.LastCommit.ID
		case kindComment:
			if p.ObjectAttributes == nil || p.ObjectAttributes.NoteableType != "MergeRequest" || p.MergeRequest == nil {
				ev.kind = ""
				return ev, nil
			}
			ev.number, ev.base = p.MergeRequest.IID, p.MergeRequest.TargetBranch
		}
	}
	if len(ev.repoURLs) == 0 {
		return ev, errBadPayload
	}
	return ev, nil
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, v := range s {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

func first64(a, b int64) int64 {
	if a != 0 {
		return a
	}
	return b
}
