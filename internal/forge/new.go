package forge

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Provider is the forge's API, as spec.source.git.pullRequests.provider
// names it (the runner, which calls the forge, links no Kubernetes types).
type Provider string

const (
	GitHub Provider = "github"
	GitLab Provider = "gitlab"
	Gitea  Provider = "gitea"
)

// Config is what New needs of a Stack's spec.source.git.pullRequests.
type Config struct {
	Provider Provider
	// APIURL of the forge; derived for github.com and gitlab.com when empty.
	APIURL string
}

// Keys of the pull-request Secret.
const (
	SecretToken          = "token"
	SecretAppID          = "appID"
	SecretInstallationID = "installationID"
	SecretPrivateKey     = "privateKey"
)

// credentials read from the Secret: a token, or a GitHub App.
type credentials struct {
	token          string
	appID          int64
	installationID int64
	privateKey     []byte
}

func readCredentials(provider Provider, data map[string][]byte) (credentials, error) {
	var c credentials
	c.token = strings.TrimSpace(string(data[SecretToken]))
	_, hasApp := data[SecretAppID]
	if c.token != "" {
		if hasApp {
			return c, fmt.Errorf("%w: the Secret has both %s and %s: keep one", ErrInvalidConfig, SecretToken, SecretAppID)
		}
		return c, nil
	}
	if !hasApp {
		return c, fmt.Errorf("%w: the Secret has no %s (or, for a GitHub App, %s, %s and %s)", ErrInvalidConfig, SecretToken, SecretAppID, SecretInstallationID, SecretPrivateKey)
	}
	if provider != GitHub {
		return c, fmt.Errorf("%w: GitHub App credentials (%s) work only with provider github; give %s a %s", ErrInvalidConfig, SecretAppID, provider, SecretToken)
	}
	var err error
	if c.appID, err = strconv.ParseInt(strings.TrimSpace(string(data[SecretAppID])), 10, 64); err != nil || c.appID <= 0 {
		return c, fmt.Errorf("%w: the Secret's %s is not a positive number", ErrInvalidConfig, SecretAppID)
	}
	if c.installationID, err = strconv.ParseInt(strings.TrimSpace(string(data[SecretInstallationID])), 10, 64); err != nil || c.installationID <= 0 {
		return c, fmt.Errorf("%w: the Secret's %s is missing or not a positive number", ErrInvalidConfig, SecretInstallationID)
	}
	if c.privateKey = data[SecretPrivateKey]; len(c.privateKey) == 0 {
		return c, fmt.Errorf("%w: the Secret has no %s (the GitHub App's PEM private key)", ErrInvalidConfig, SecretPrivateKey)
	}
	return c, nil
}

// New returns the Forge of a Stack's repository: pr is from its
// spec.source.git.pullRequests, secret the data of the Secret it names and
// repoURL its spec.source.git.url. The API URL is pr.APIURL, or derived for
// github.com and gitlab.com.
func New(pr Config, secret map[string][]byte, repoURL string, opts Options) (Forge, error) {
	repo, err := ParseRepository(repoURL)
	if err != nil {
		return nil, err
	}
	creds, err := readCredentials(pr.Provider, secret)
	if err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	api, err := apiURL(pr, repo)
	if err != nil {
		return nil, err
	}
	switch pr.Provider {
	case GitHub:
		return newGitHub(repo, api, creds, opts)
	case GitLab:
		return newGitLab(repo, api, creds, opts)
	case Gitea:
		return newGitea(repo, api, creds, opts)
	}
	return nil, fmt.Errorf("%w: unknown provider %q: use github, gitlab or gitea", ErrInvalidConfig, pr.Provider)
}

// apiURL is the forge's API base URL, ending in a slash.
func apiURL(pr Config, repo Repository) (*url.URL, error) {
	raw := pr.APIURL
	if raw == "" {
		switch {
		case pr.Provider == GitHub && repo.Host == "github.com":
			raw = "https://api.github.com/"
		case pr.Provider == GitLab && repo.Host == "gitlab.com":
			raw = "https://gitlab.com/api/v4/"
		default:
			return nil, fmt.Errorf("%w: set pullRequests.apiURL for %s on %s (e.g. https://%s/api/v3 for GitHub Enterprise, https://%s/api/v4 for GitLab, https://%s for Gitea)",
				ErrInvalidConfig, pr.Provider, repo.Host, repo.Host, repo.Host, repo.Host)
		}
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: pullRequests.apiURL %q is not an http(s) URL of a host", ErrInvalidConfig, clip(raw, 256))
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	return u, nil
}
