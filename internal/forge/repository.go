package forge

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Repository is where a repository lives, read from its clone URL.
type Repository struct {
	// Host is the forge's host name, lowercase, without a port.
	Host string
	// Path is the repository's path on the host without ".git":
	// owner/name, or group/subgroup/project on GitLab.
	Path string
}

// ParseRepository reads a clone URL in any of the forms Git accepts for a
// forge: https://host/owner/name(.git), ssh://user@host[:port]/owner/name,
// or scp-like user@host:owner/name.
func ParseRepository(raw string) (Repository, error) {
	raw = strings.TrimSpace(raw)
	var host, path string
	switch {
	case strings.Contains(raw, "://"):
		u, err := url.Parse(raw)
		if err != nil {
			return Repository{}, fmt.Errorf("%w: repository URL %q: %v", ErrInvalidConfig, clip(raw, 256), err)
		}
		switch u.Scheme {
		case "https", "http", "ssh", "git":
		default:
			return Repository{}, fmt.Errorf("%w: repository URL %q: scheme %q is not https, http or ssh", ErrInvalidConfig, clip(raw, 256), u.Scheme)
		}
		host, path = u.Hostname(), u.Path
	default:
		// scp-like: [user@]host:path; a colon before any slash.
		colon := strings.IndexByte(raw, ':')
		if colon < 0 || strings.Contains(raw[:colon], "/") {
			return Repository{}, fmt.Errorf("%w: repository URL %q is neither https://, ssh:// nor user@host:path", ErrInvalidConfig, clip(raw, 256))
		}
		host, path = raw[:colon], raw[colon+1:]
		if at := strings.LastIndexByte(host, '@'); at >= 0 {
			host = host[at+1:]
		}
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	path = strings.TrimSuffix(strings.Trim(path, "/"), ".git")
	path = strings.TrimSuffix(path, "/")
	if host == "" || path == "" {
		return Repository{}, fmt.Errorf("%w: repository URL %q names no host and path", ErrInvalidConfig, clip(raw, 256))
	}
	for seg := range strings.SplitSeq(path, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return Repository{}, fmt.Errorf("%w: repository URL %q has an empty, . or .. path segment", ErrInvalidConfig, clip(raw, 256))
		}
	}
	return Repository{Host: host, Path: path}, nil
}

// Key is the repository's identity for comparing URLs of any form: host and
// path, lowercase (the forges route owner and name case-insensitively).
func (r Repository) Key() string {
	return strings.ToLower(r.Host + "/" + r.Path)
}

// OwnerName splits a GitHub or Gitea path into owner and name: the last
// two segments, so that a forge served under a sub-path still works.
func (r Repository) OwnerName() (owner, name string, err error) {
	segs := strings.Split(r.Path, "/")
	if len(segs) < 2 {
		return "", "", fmt.Errorf("%w: repository path %q is not owner/name", ErrInvalidConfig, r.Path)
	}
	return segs[len(segs)-2], segs[len(segs)-1], nil
}
