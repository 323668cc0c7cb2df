package artifactserver

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
)

// ProgramPath is the path a Program generation's tarball is served at.
func ProgramPath(namespace, name string, generation int64) string {
	return "/programs/" + url.PathEscape(namespace) + "/" + url.PathEscape(name) + "/" + strconv.FormatInt(generation, 10) + ".tar.gz"
}

// ProgramURL is ProgramPath under the server's advertised base URL.
func ProgramURL(baseURL, namespace, name string, generation int64) string {
	return strings.TrimSuffix(baseURL, "/") + ProgramPath(namespace, name, generation)
}

// ProgramRevision is the artifact revision of a Program generation,
// "<generation>@sha256:<hex>".
func ProgramRevision(generation int64, digest string) string {
	return strconv.FormatInt(generation, 10) + "@" + digest
}

// BuildProgram builds the tarball of the Program's current files. The
// controller (to advertise the digest) and the server (to serve the bytes)
// both call it; artifact.Build's determinism makes them agree.
func BuildProgram(p *terracev1.Program) (data []byte, digest string, err error) {
	start := time.Now()
	files := make(map[string][]byte, len(p.Spec.Files))
	for name, content := range p.Spec.Files {
		files[name] = []byte(content)
	}
	data, digest, err = artifact.Build(files)
	buildDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, "", fmt.Errorf("failed to build artifact of program %s/%s: %w", p.Namespace, p.Name, err)
	}
	return data, digest, nil
}

// Programs builds Program tarballs and keeps the recent ones, bounded by
// their total size. The server serves from it, and the Stack controller
// uploads from the same cache to the runners of Program Stacks.
type Programs struct {
	cache *lruCache
}

// NewPrograms returns a builder that keeps at most cacheBytes of tarballs;
// 0 or less keeps none.
func NewPrograms(cacheBytes int64) *Programs {
	return &Programs{cache: newLRUCache(cacheBytes)}
}

// Artifact is the tarball of the Program's current generation and its
// digest. A nil Programs builds it at every call.
func (p *Programs) Artifact(prog *terracev1.Program) (data []byte, digest string, err error) {
	if p == nil {
		return BuildProgram(prog)
	}
	key := string(prog.UID) + "/" + strconv.FormatInt(prog.Generation, 10)
	if a, ok := p.cache.get(key); ok {
		return a.data, a.digest, nil
	}
	if data, digest, err = BuildProgram(prog); err != nil {
		return nil, "", err
	}
	p.cache.add(key, builtArtifact{data: data, digest: digest})
	return data, digest, nil
}
