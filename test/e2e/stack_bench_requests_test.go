package e2e

// The controller's API requests, counted and traced for the benchmark.

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/scheme"
)

// controllerRequests counts the API requests of a controller started by
// startCountedController (a watch counts once).
var (
	controllerRequests atomic.Int64
	countingRequests   atomic.Bool
)

type countingTransport struct{ next http.RoundTripper }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	controllerRequests.Add(1)
	requestKinds.add(requestKind(r))
	if !tracingRequests {
		return c.next.RoundTrip(r)
	}
	start := time.Now()
	resp, err := c.next.RoundTrip(r)
	requestKinds.trace(fmt.Sprintf("%s %5.1fms %s %s", start.Format("15:04:05.000"), float64(time.Since(start).Microseconds())/1000, r.Method, r.URL.RequestURI()))
	return resp, err
}

// tracingRequests (TERRACE_BENCH_TRACE=1) logs every request of a 1-Stack
// measurement in order, to see which step makes which call.
var tracingRequests = os.Getenv("TERRACE_BENCH_TRACE") != ""

// requestKinds counts the controller's requests by verb and resource, for
// the breakdown the benchmark logs.
var requestKinds = &kindCounter{counts: map[string]int{}}

type kindCounter struct {
	mu     sync.Mutex
	counts map[string]int
	traced []string
}

func (k *kindCounter) add(kind string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.counts[kind]++
}

func (k *kindCounter) trace(request string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.traced = append(k.traced, request)
}

// takeTrace returns the traced requests, in the order they started, and
// forgets them. Each is traced when its answer comes.
func (k *kindCounter) takeTrace() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.traced
	k.traced = nil
	slices.Sort(t) // each starts with the time it was sent
	return t
}

func (k *kindCounter) snapshot() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.counts)
}

// requestKind is "VERB resource[/subresource]" of an API request.
func requestKind(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// /api/v1/... or /apis/group/version/...; then namespaces/ns/...
	if len(parts) > 0 && parts[0] == "apis" && len(parts) > 2 {
		parts = parts[3:]
	} else if len(parts) > 1 {
		parts = parts[2:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	verb := r.Method
	if len(parts) == 1 {
		verb = map[string]string{http.MethodGet: "LIST", http.MethodPost: "CREATE"}[r.Method]
		if r.URL.Query().Get("watch") == "true" {
			verb = "WATCH"
		}
	}
	resource := ""
	if len(parts) > 0 {
		resource = parts[0]
	}
	if len(parts) > 2 {
		resource += "/" + parts[2]
	}
	return verb + " " + resource
}

// logRequestKinds logs the requests made since before, per Stack.
func logRequestKinds(b *testing.B, before map[string]int, n int) {
	after := requestKinds.snapshot()
	var lines []string
	for kind, c := range after {
		if d := c - before[kind]; d > 0 {
			lines = append(lines, fmt.Sprintf("%8.2f  %s", float64(d)/float64(n), kind))
		}
	}
	slices.Sort(lines)
	b.Logf("API requests per Stack by kind:\n%s", strings.Join(lines, "\n"))
}

// startCountedController starts the shared controller, unless a test
// already did, with a client configuration that counts its requests.
func startCountedController(b *testing.B) {
	b.Helper()
	dev := sharedDev(b)
	stackCtl.mu.Lock()
	defer stackCtl.mu.Unlock()
	if stackCtl.ctrl != nil {
		return
	}
	c, err := client.New(dev.Cluster.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	(&stackEnv{dev: dev, c: c}).installOperatorConfig(b)
	counted := *dev
	cluster := *dev.Cluster
	cluster.Config = rest.CopyConfig(dev.Cluster.Config)
	cluster.Config.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt} })
	counted.Cluster = &cluster
	controllerRuns = benchConcurrency()
	stackCtl.ctrl = startController(b, &counted)
	countingRequests.Store(true)
}
