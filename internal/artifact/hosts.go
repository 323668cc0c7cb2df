package artifact

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// HostAllowlist is the set of hosts a client may download from. An entry
// "host" allows any port of host, "host:port" only that port. Hosts
// compare as written in the URL, case-insensitively and without a
// trailing dot, before any name is resolved: the list names servers the
// operator trusts, not addresses.
type HostAllowlist struct {
	anyPort map[string]bool
	ports   map[string]bool // "host:port"
	entries []string
}

// ParseHostAllowlist reads entries of the form host or host:port (IPv6
// addresses in brackets when a port follows).
func ParseHostAllowlist(entries []string) (*HostAllowlist, error) {
	a := &HostAllowlist{anyPort: map[string]bool{}, ports: map[string]bool{}}
	for _, raw := range entries {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			continue
		}
		if strings.Contains(entry, "/") || strings.Contains(entry, "@") {
			return nil, fmt.Errorf("source host %q must be host or host:port, without scheme, credentials or path", raw)
		}
		host, port, err := net.SplitHostPort(entry)
		if err != nil {
			// No port (or a bare IPv6 address): the whole entry is the host.
			host, port = strings.TrimSuffix(strings.TrimPrefix(entry, "["), "]"), ""
		}
		host = normalizeHost(host)
		if host == "" {
			return nil, fmt.Errorf("source host %q has no host name", raw)
		}
		if port == "" {
			a.anyPort[host] = true
		} else {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return nil, fmt.Errorf("source host %q has an invalid port", raw)
			}
			a.ports[net.JoinHostPort(host, port)] = true
		}
		a.entries = append(a.entries, entry)
	}
	return a, nil
}

// Allows reports whether u's host (and port) is on the list. A nil or
// empty list allows nothing; only http and https URLs are allowed.
func (a *HostAllowlist) Allows(u *url.URL) bool {
	if a == nil || u == nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	host := normalizeHost(u.Hostname())
	if host == "" {
		return false
	}
	if a.anyPort[host] {
		return true
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return a.ports[net.JoinHostPort(host, port)]
}

// String lists the entries as given, for messages.
func (a *HostAllowlist) String() string {
	if a == nil || len(a.entries) == 0 {
		return "(none)"
	}
	return strings.Join(a.entries, ",")
}

func normalizeHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}
