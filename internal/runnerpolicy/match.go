package runnerpolicy

import (
	"regexp"
	"strings"
)

// matchAny reports whether name matches one of patterns. In a pattern '*'
// matches any characters but '/', '**' any characters at all, '?' one
// character but '/'; everything else matches itself. So "ghcr.io/acme/*"
// allows ghcr.io/acme/runner:v1 but not ghcr.io/acme/team/runner, and
// "ghcr.io/acme/**" allows both. (path.Match is close, but its "*" never
// crosses '/', which leaves no way to say "any image".)
func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if patternRegexp(p).MatchString(name) {
			return true
		}
	}
	return false
}

func patternRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); i++ {
		switch {
		case strings.HasPrefix(pattern[i:], "**"):
			b.WriteString(".*")
			i++
		case pattern[i] == '*':
			b.WriteString("[^/]*")
		case pattern[i] == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}
