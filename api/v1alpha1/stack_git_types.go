package v1alpha1

// The Git source of a Stack (spec.source.git): the repository, the ref, pull
// request plans and webhooks.

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GitSource is a Git repository cloned by the runner pod: a shallow clone of
// one ref, with the tenant's credentials mounted in that pod only. The
// resolved revision is written as Flux writes it: "main@sha1:<40 hex>".
type GitSource struct {
	// URL of the repository: https://host/path, ssh://user@host/path or
	// user@host:path.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern="^(https?://|ssh://|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:)"
	URL string `json:"url"`

	// Ref to check out; the branch main when empty.
	// +optional
	Ref *GitRef `json:"ref,omitempty"`

	// SecretRef names a Secret in the Stack's namespace with the
	// credentials: username and password (a token as the password), or
	// bearerToken, for https; identity (a private key) and known_hosts for
	// ssh. Flux's GitRepository uses the same keys.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`

	// PullRequests plans the repository's open pull requests read-only and
	// posts each plan to its pull request.
	// +optional
	PullRequests *GitPullRequests `json:"pullRequests,omitempty"`

	// Webhook lets the forge's push and pull-request webhooks reconcile the
	// Stack at once instead of at its interval.
	// +optional
	Webhook *GitWebhook `json:"webhook,omitempty"`
}

// GitRef is one of branch, tag, semver and commit. A commit may come with
// the branch it is on, as in Flux.
// +kubebuilder:validation:XValidation:rule="[has(self.tag), has(self.semver), has(self.commit) && !has(self.branch)].filter(x, x).size() <= 1 && !(has(self.branch) && (has(self.tag) || has(self.semver)))",message="set one of branch, tag, semver and commit (a commit may name its branch)"
type GitRef struct {
	// Branch to follow: each new commit on it is a new revision.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	Branch string `json:"branch,omitempty"`

	// Tag to check out.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	Tag string `json:"tag,omitempty"`

	// SemVer range; the highest tag in it is checked out.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	SemVer string `json:"semver,omitempty"`

	// Commit SHA-1 to check out.
	// +optional
	// +kubebuilder:validation:Pattern="^[a-f0-9]{40}$"
	Commit string `json:"commit,omitempty"`
}

// GitProvider is the forge that hosts a repository.
// +kubebuilder:validation:Enum=github;gitlab;gitea
type GitProvider string

const (
	GitProviderGitHub GitProvider = "github"
	GitProviderGitLab GitProvider = "gitlab"
	GitProviderGitea  GitProvider = "gitea"
)

// PullRequestTrigger says whose pull requests are planned.
// +kubebuilder:validation:Enum=writers;comment;anyone
type PullRequestTrigger string

const (
	// PullRequestTriggerWriters plans pull requests whose author may write
	// to the repository.
	PullRequestTriggerWriters PullRequestTrigger = "writers"
	// PullRequestTriggerComment plans a pull request after someone who
	// may write to the repository comments "/terrace plan" on it.
	PullRequestTriggerComment PullRequestTrigger = "comment"
	// PullRequestTriggerAnyone plans every pull request.
	PullRequestTriggerAnyone PullRequestTrigger = "anyone"
)

// GitPullRequests configures plans of pull requests. A pull-request run only
// plans: the state server gives it read-only access to the Stack's state,
// bound to that run's certificate, and it never writes outputs.
type GitPullRequests struct {
	// Enabled turns pull-request plans on.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// Provider is the forge's API: github, gitlab or gitea.
	// +required
	Provider GitProvider `json:"provider"`

	// APIURL of the forge when it is not the public one (GitHub
	// Enterprise, a self-hosted GitLab, any Gitea or Forgejo).
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern="^https?://"
	APIURL string `json:"apiURL,omitempty"`

	// SecretRef names a Secret with the forge's credentials: token, or for
	// a GitHub App appID, installationID and privateKey.
	// +required
	SecretRef LocalObjectReference `json:"secretRef"`

	// Trigger says whose pull requests are planned; writers when empty.
	// +optional
	Trigger PullRequestTrigger `json:"trigger,omitempty"`

	// ServiceAccountName runs pull-request runners under another
	// ServiceAccount than the Stack's.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Interval between polls of the forge for pull requests; 1m when empty.
	// +optional
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// GitWebhook names the Secret whose token signs the forge's webhooks.
type GitWebhook struct {
	// SecretRef names a Secret in the Stack's namespace whose key token
	// is the webhook secret (GitHub and Gitea sign the body with it as an
	// HMAC; GitLab sends it as X-Gitlab-Token).
	// +required
	SecretRef LocalObjectReference `json:"secretRef"`
}
