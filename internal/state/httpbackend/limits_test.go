package httpbackend_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// rawConn is one TLS connection to the state server as id, on which the
// test writes requests byte by byte as an attacker would.
type rawConn struct {
	conn *tls.Conn
	r    *bufio.Reader
	url  *url.URL
}

func (f *fixture) dial(t *testing.T, id pki.Identity, target string) *rawConn {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	cfg := f.tlsConfig(t, id)
	cfg.ServerName = "localhost"
	conn, err := tls.Dial("tcp", u.Host, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	return &rawConn{conn: conn, r: bufio.NewReader(conn), url: u}
}

// send writes a request's headers and the first bytes of its body.
func (c *rawConn) send(t *testing.T, method string, length int, body []byte) {
	t.Helper()
	if _, err := fmt.Fprintf(c.conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", method, c.url.RequestURI(), c.url.Host, length, body); err != nil {
		t.Fatal(err)
	}
}

// answer reads the response to the request sent.
func (c *rawConn) answer(t *testing.T) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, strings.TrimSpace(string(body))
}

// The attack: a run keeps many connections open, idle or with a request
// whose body never comes, to take the server's connections from others.
// Its connections beyond the per-run cap, then its namespace's beyond the
// per-namespace cap, are answered 429 with Retry-After and closed; a body
// that does not come in time is answered 408; another namespace's run is
// not touched, and a closed connection gives its place back.
func TestConnectionCapsPerRunAndNamespace(t *testing.T) {
	opts := httpbackend.Options{MaxConnectionsPerRun: 2, MaxConnectionsPerNamespace: 3, BodyTimeout: time.Second}
	f := newFixture(t, opts)
	ns, other := uniqueName("conns-"), uniqueName("other-")
	urlOf := func(ns, stack string) string {
		return httpbackend.Address(f.baseURL, state.Key{Namespace: ns, Stack: stack, Workspace: "default"})
	}
	for _, s := range []string{"a", "b"} {
		f.runs.startRun(t, ns, s, "run-1")
	}
	f.runs.startRun(t, other, "app", "run-1")
	runA, runB := pki.RunnerIdentity(ns, "a", "run-1"), pki.RunnerIdentity(ns, "b", "run-1")

	// Two connections of run a, each with a request: one idle after its
	// answer, one waiting for a lock info that never comes.
	idle := f.dial(t, runA, urlOf(ns, "a"))
	idle.send(t, http.MethodGet, 0, nil)
	if resp, body := idle.answer(t); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("run a's first GET: %d %s", resp.StatusCode, body)
	}
	waiting := f.dial(t, runA, urlOf(ns, "a"))
	waiting.send(t, httpbackend.MethodLock, 100, []byte(`{"ID":`))
	// Once its body is being read, its connection counts.
	deadline := time.Now().Add(10 * time.Second)
	for inflightSmall(t) < 100 {
		if time.Now().After(deadline) {
			t.Fatal("the server never started reading the lock info")
		}
		time.Sleep(10 * time.Millisecond)
	}

	third := f.dial(t, runA, urlOf(ns, "a"))
	third.send(t, http.MethodGet, 0, nil)
	resp, body := third.answer(t)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !resp.Close || !strings.Contains(body, "at most 2 per run") {
		t.Fatalf("run a's third connection: %d Retry-After %q close %v: %s, want 429 naming the per-run cap", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, body)
	}
	// Run b has a connection of its own, then the namespace is full.
	b1 := f.dial(t, runB, urlOf(ns, "b"))
	b1.send(t, http.MethodGet, 0, nil)
	if resp, body := b1.answer(t); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("run b's first connection: %d %s", resp.StatusCode, body)
	}
	b2 := f.dial(t, runB, urlOf(ns, "b"))
	b2.send(t, http.MethodGet, 0, nil)
	if resp, body := b2.answer(t); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "at most 3 per namespace") {
		t.Fatalf("a fourth connection of the namespace: %d %s, want 429 naming the per-namespace cap", resp.StatusCode, body)
	}
	// Another namespace's run is not touched.
	victim := f.client(t, pki.RunnerIdentity(other, "app", "run-1"))
	if r := do(t, victim, http.MethodPost, urlOf(other, "app"), storetest.StateJSON("victim", 1, 0, 1000)); r.code != http.StatusOK {
		t.Fatalf("another namespace's upload: %d %s", r.code, r.body)
	}

	// The lock info that never came: 408, and the connection is closed.
	resp, body = waiting.answer(t)
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close || !strings.Contains(body, "lock info must arrive within 1s") {
		t.Fatalf("a lock info that never came: %d close %v: %s, want 408", resp.StatusCode, resp.Close, body)
	}
	_ = waiting.conn.Close()
	// Its place is given back to run a.
	deadline = time.Now().Add(10 * time.Second)
	for {
		again := f.dial(t, runA, urlOf(ns, "a"))
		again.send(t, http.MethodGet, 0, nil)
		resp, body := again.answer(t)
		if resp.StatusCode == http.StatusNoContent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run a after one of its connections closed: %d %s", resp.StatusCode, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The attack: small uploads, which never waited for admission, are sent
// slowly by many clients of one namespace to hold memory. Their bytes
// count against the namespace's share of the small-body budget as they
// arrive: beyond it the namespace's next upload is answered 503 with
// Retry-After, and another namespace's upload still goes through.
func TestSmallBodiesCountAgainstTheNamespaceBudget(t *testing.T) {
	opts := httpbackend.Options{MaxSmallInflightBytes: 4 << 20, MaxSmallInflightBytesPerNamespace: 1 << 20, AdmissionWait: 100 * time.Millisecond, BodyTimeout: 30 * time.Second}
	f := newFixture(t, opts)
	ns, other := uniqueName("small-"), uniqueName("other-")
	f.runs.startRun(t, ns, "app", "run-1")
	f.runs.startRun(t, other, "app", "run-1")
	id := pki.RunnerIdentity(ns, "app", "run-1")
	target := httpbackend.Address(f.baseURL, state.Key{Namespace: ns, Stack: "app", Workspace: "default"})

	// 900 KiB of a 1 MiB state arrive, then nothing: the body holds 1 MiB.
	slow := f.dial(t, id, target)
	slow.send(t, http.MethodPost, 1<<20, make([]byte, 900<<10))
	deadline := time.Now().Add(10 * time.Second)
	for inflightSmall(t) < 1<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the slow upload holds %.0f bytes of the small budget, want 1 MiB", inflightSmall(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	next := f.dial(t, id, target)
	next.send(t, http.MethodPost, 1000, []byte("{"))
	resp, body := next.answer(t)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "namespace "+ns) {
		t.Fatalf("an upload beyond the namespace's small budget: %d %s, want 503 naming the namespace", resp.StatusCode, body)
	}
	victim := f.client(t, pki.RunnerIdentity(other, "app", "run-1"))
	if r := do(t, victim, http.MethodPost, httpbackend.Address(f.baseURL, state.Key{Namespace: other, Stack: "app", Workspace: "default"}), storetest.StateJSON("victim", 1, 0, 100<<10)); r.code != http.StatusOK {
		t.Fatalf("another namespace's upload: %d %s", r.code, r.body)
	}
}

func inflightSmall(t *testing.T) float64 {
	t.Helper()
	return gauge(t, "terrace_state_inflight_small_bytes")
}

// gauge reads a gauge of the state server's metrics.
func gauge(t *testing.T, name string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// slowStore takes delay to write a state, and gives up when the request's
// context ends, as the real stores do.
type slowStore struct {
	*memStore
	delay time.Duration
}

func (s slowStore) Put(ctx context.Context, key state.Key, data []byte, opts state.PutOptions) (state.StateMeta, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return state.StateMeta{}, ctx.Err()
	}
	return s.memStore.Put(ctx, key, data, opts)
}

// A body that arrived in time is stored however long the store takes
// afterwards: its deadline ends with the body.
func TestBodyDeadlineEndsWithTheBody(t *testing.T) {
	f := newFixtureWithStore(t, httpbackend.Options{BodyTimeout: 300 * time.Millisecond, MaxStateBytes: 64 << 10}, slowStore{memStore: newMemStore(), delay: time.Second})
	ns := uniqueName("slow-")
	f.runs.startRun(t, ns, "app", "run-1")
	c := f.client(t, pki.RunnerIdentity(ns, "app", "run-1"))
	target := httpbackend.Address(f.baseURL, state.Key{Namespace: ns, Stack: "app", Workspace: "default"})
	if r := do(t, c, http.MethodPost, target, storetest.StateJSON("slow", 1, 0, 1000)); r.code != http.StatusOK {
		t.Fatalf("an upload the store took longer than the body timeout to write: %d %s", r.code, r.body)
	}
	// Of unknown length, the body is read to its end, and net/http goes on
	// reading in the background, under the connection's deadline.
	req, err := http.NewRequest(http.MethodPost, target, io.MultiReader(bytes.NewReader(storetest.StateJSON("slow", 2, 0, 1000))))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("a chunked upload the store took longer than the body timeout to write: %d %s", resp.StatusCode, body)
	}
}
