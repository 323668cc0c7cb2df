package httpbackend_test

import (
	"bufio"
	"bytes"
	"crypto/md5" //nolint:gosec // Content-MD5 is what the protocol carries.
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/fuzzcorpus"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
)

// fuzzMaxStateBytes keeps the 413 path reachable for the fuzzer.
const fuzzMaxStateBytes = 4096

// The keys the fuzz store holds a state at, each with a marker no response
// about another key may carry; "locked" also holds a lock.
var fuzzKeys = []state.Key{
	{Namespace: "team-a", Stack: "app", Workspace: "default"},
	{Namespace: "team-a", Stack: "app", Workspace: "locked"},
	{Namespace: "team-a", Stack: "other", Workspace: "default"},
	{Namespace: "team-b", Stack: "app", Workspace: "default"},
}

func fuzzMarker(k state.Key) string {
	return "marker-" + k.Namespace + "-" + k.Stack + "-" + k.Workspace
}

func newFuzzStore(t *testing.T) *memStore {
	store := newMemStore()
	for _, k := range fuzzKeys {
		doc := fmt.Sprintf(`{"version":4,"serial":3,"lineage":"lin-%s","outputs":{"secret":{"value":%q}}}`, fuzzMarker(k), fuzzMarker(k))
		if _, err := store.Put(t.Context(), k, []byte(doc), state.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	locked := fuzzKeys[1]
	if err := store.Lock(t.Context(), locked, state.LockInfo{ID: "held-lock", Who: fuzzMarker(locked)}); err != nil {
		t.Fatal(err)
	}
	store.touched = nil
	return store
}

// FuzzStateServer sends one raw HTTP/1.1 request, parsed the way net/http's
// server parses it, through the real Handler as the client identity given,
// over an in-memory store. It holds that:
//   - no input panics or gets a 5xx;
//   - an identity the PKI would not issue gets 401, a path that is not
//     /state/{ns}/{stack}/{ws} 404, another method 405, and none of them
//     reaches the store;
//   - the store is asked about the parsed key only, and a runner only about
//     its own Stack's; a runner's DELETE is 403;
//   - no response carries another key's state or lock;
//   - a malformed lock body or a Content-MD5 that does not match is 400 and
//     changes nothing; a state over the limit is 413;
//   - an accepted POST stored exactly the bytes of the body, an accepted
//     LOCK holds the lock with the body's ID.
func FuzzStateServer(f *testing.F) {
	f.Fuzz(func(t *testing.T, identity string, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // the server answers 400 before any handler runs
		}
		var sent bytes.Buffer
		req.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(req.Body, &sent), req.Body}

		store := newFuzzStore(t)
		h := &httpbackend.Handler{Store: store, MaxStateBytes: fuzzMaxStateBytes, Identify: func(*http.Request) (pki.Identity, error) {
			id := pki.Identity(identity)
			return id, id.Validate() // what IdentityFromCertificate accepts
		}}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)

		c := stateCase{t: t, id: pki.Identity(identity), req: req, raw: raw, code: rec.Code, body: rec.Body.Bytes(), sent: sent.Bytes(), store: store}
		c.check()
	})
}

// stateCase is one request and what it did.
type stateCase struct {
	t     *testing.T
	id    pki.Identity
	req   *http.Request
	raw   []byte // the whole request as sent
	code  int
	body  []byte
	sent  []byte
	store *memStore
}

func (c *stateCase) fatalf(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("%s %q as %q: %d %q: %s", c.req.Method, c.req.URL.EscapedPath(), c.id, c.code, c.body, fmt.Sprintf(format, args...))
}

func (c *stateCase) refused(want int, why string) {
	c.t.Helper()
	if c.code != want {
		c.fatalf("%s: want %d", why, want)
	}
	if touched := c.store.touchedKeys(); len(touched) != 0 {
		c.fatalf("%s, yet the store was asked about %v", why, touched)
	}
}

func (c *stateCase) check() {
	c.t.Helper()
	if c.code >= 500 {
		c.fatalf("server error")
	}
	if c.id.Validate() != nil {
		c.refused(http.StatusUnauthorized, "identity the PKI never issues")
		return
	}
	key, perr := httpbackend.ParsePath(c.req.URL.EscapedPath())
	if perr != nil {
		c.refused(http.StatusNotFound, "unparsable path ("+perr.Error()+")")
		return
	}
	c.checkConfined(key)
	switch c.req.Method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, httpbackend.MethodLock, httpbackend.MethodUnlock:
	default:
		if c.code != http.StatusForbidden {
			c.refused(http.StatusMethodNotAllowed, "unknown method")
		}
		return
	}
	if c.code >= 400 && c.code != http.StatusLocked && c.code != http.StatusConflict {
		return // refused; checkConfined and the checks below cover what was touched
	}
	switch c.req.Method {
	case http.MethodPost, http.MethodPut:
		c.checkPut(key)
	case httpbackend.MethodLock, httpbackend.MethodUnlock:
		c.checkLockBody(key)
	}
}

// checkConfined holds that only the parsed key was used, only by whom may
// use it, and that nothing of another key came back.
func (c *stateCase) checkConfined(key state.Key) {
	c.t.Helper()
	touched := c.store.touchedKeys()
	for _, k := range touched {
		if k != key {
			c.fatalf("the store was asked about %v; the path names %v", k, key)
		}
	}
	if c.id != pki.ControllerIdentity {
		ns, stack, _, ok := c.id.Runner()
		mayUse := ok && ns == key.Namespace && stack == key.Stack && c.req.Method != http.MethodDelete
		if !mayUse {
			c.refused(http.StatusForbidden, "not this identity's state")
		}
	}
	for _, k := range fuzzKeys {
		marker := []byte(fuzzMarker(k))
		// A response may quote what the client sent (a refused lineage).
		if k != key && bytes.Contains(c.body, marker) && !bytes.Contains(c.raw, marker) {
			c.fatalf("the response carries the state or lock of %v", k)
		}
	}
}

// checkPut holds the body rules of a write.
func (c *stateCase) checkPut(key state.Key) {
	c.t.Helper()
	if want := c.req.Header.Get("Content-MD5"); want != "" {
		if got := md5Base64(c.sent); got != want {
			c.fatalf("passed on a body whose Content-MD5 is %s, not the %s sent", got, want)
		}
	}
	if c.code != http.StatusOK {
		return
	}
	if len(c.sent) > fuzzMaxStateBytes {
		c.fatalf("accepted %d bytes over the %d limit", len(c.sent), fuzzMaxStateBytes)
	}
	st, err := c.store.Get(c.t.Context(), key)
	if err != nil || !bytes.Equal(st.Data, c.sent) {
		c.fatalf("an accepted write did not store the %d bytes sent (%v)", len(c.sent), err)
	}
}

// checkLockBody holds that LOCK and UNLOCK act only on a well-formed lock
// info object with an ID, and that an accepted LOCK holds that ID.
func (c *stateCase) checkLockBody(key state.Key) {
	c.t.Helper()
	var info state.LockInfo
	wellFormed := json.Valid(c.sent) && json.Unmarshal(c.sent, &info) == nil && info.ID != ""
	if !wellFormed {
		c.fatalf("a lock body that is not one JSON object with an ID (%q) was not refused with 400", c.sent)
	}
	if c.req.Method == httpbackend.MethodLock && c.code == http.StatusOK {
		held, err := c.store.GetLock(c.t.Context(), key)
		if err != nil || held == nil || held.ID != info.ID {
			c.fatalf("LOCK answered 200 but the lock is %+v (%v), want ID %q", held, err, info.ID)
		}
	}
}

func TestFuzzStateServerSeedsAreCheckedIn(t *testing.T) {
	fuzzcorpus.Check(t, "FuzzStateServer", stateServerSeeds())
}

// stateServerSeeds are requests of tofu's protocol and of an attacker's.
func stateServerSeeds() []fuzzcorpus.Seed {
	runner := string(pki.RunnerIdentity("team-a", "app", "run-1"))
	controller := string(pki.ControllerIdentity)
	req := func(method, target string, headers []string, body string) []byte {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: terrace-controller.terrace-system.svc:9444\r\n", method, target)
		for _, h := range headers {
			b.WriteString(h + "\r\n")
		}
		if body != "" && !strings.Contains(strings.Join(headers, "\n"), "Transfer-Encoding") {
			fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
		}
		b.WriteString("\r\n" + body)
		return []byte(b.String())
	}
	newState := `{"version":4,"serial":4,"lineage":"lin-marker-team-a-app-default","resources":[]}`
	lock := `{"ID":"l-1","Operation":"OperationTypeApply","Who":"runner@pod","Version":"1.12.6","Created":"2025-01-01T00:00:00Z"}`
	seed := func(name, id string, raw []byte) fuzzcorpus.Seed {
		return fuzzcorpus.Seed{Name: name, Args: []any{id, raw}}
	}
	return []fuzzcorpus.Seed{
		seed("get-own", runner, req("GET", "/state/team-a/app/default", nil, "")),
		seed("get-missing", runner, req("GET", "/state/team-a/app/new", nil, "")),
		seed("post-own", runner, req("POST", "/state/team-a/app/default", []string{"Content-Type: application/json", "Content-MD5: " + md5Base64([]byte(newState))}, newState)),
		seed("post-locked-with-id", runner, req("POST", "/state/team-a/app/locked?ID=held-lock", nil, newState)),
		seed("post-locked-without-id", runner, req("POST", "/state/team-a/app/locked", nil, newState)),
		seed("post-bad-md5", runner, req("POST", "/state/team-a/app/default", []string{"Content-MD5: AAAAAAAAAAAAAAAAAAAAAA=="}, newState)),
		seed("post-chunked", runner, req("POST", "/state/team-a/app/default", []string{"Transfer-Encoding: chunked"}, fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(newState), newState))),
		seed("post-over-limit", runner, req("POST", "/state/team-a/app/default", nil, `{"serial":9,"lineage":"x","pad":"`+strings.Repeat("x", fuzzMaxStateBytes)+`"}`)),
		seed("post-lower-serial", runner, req("POST", "/state/team-a/app/default", nil, `{"serial":1,"lineage":"lin-marker-team-a-app-default"}`)),
		seed("post-not-json", runner, req("POST", "/state/team-a/app/default", nil, "not a state")),
		seed("post-short-body", runner, append(req("POST", "/state/team-a/app/default", []string{"Content-Length: 500"}, ""), newState...)),
		seed("lock-own", runner, req("LOCK", "/state/team-a/app/default", nil, lock)),
		seed("lock-held", runner, req("LOCK", "/state/team-a/app/locked", nil, lock)),
		seed("lock-trailing-garbage", runner, req("LOCK", "/state/team-a/app/default", nil, lock+` {"ID":"second"}`)),
		seed("lock-no-id", runner, req("LOCK", "/state/team-a/app/default", nil, `{"Who":"x"}`)),
		seed("lock-not-object", runner, req("LOCK", "/state/team-a/app/default", nil, `"ID"`)),
		seed("unlock-own", runner, req("UNLOCK", "/state/team-a/app/locked", nil, `{"ID":"held-lock"}`)),
		seed("unlock-other-id", runner, req("UNLOCK", "/state/team-a/app/locked", nil, `{"ID":"guess"}`)),
		seed("delete-as-runner", runner, req("DELETE", "/state/team-a/app/default", nil, "")),
		seed("delete-as-controller", controller, req("DELETE", "/state/team-a/app/locked?ID=held-lock", nil, "")),
		seed("other-stack", runner, req("GET", "/state/team-a/other/default", nil, "")),
		seed("other-namespace", runner, req("GET", "/state/team-b/app/default", nil, "")),
		seed("dot-dot", runner, req("GET", "/state/team-a/app/../../team-b/app/default", nil, "")),
		seed("dot-dot-stack", runner, req("GET", "/state/team-a/../default", nil, "")),
		seed("escaped-slash", runner, req("GET", "/state/team-a/app%2F..%2Fother/default", nil, "")),
		seed("escaped-namespace", runner, req("GET", "/state/team-a%2Fapp/default/x", nil, "")),
		seed("double-escaped", runner, req("GET", "/state/team-a/app/%252e%252e", nil, "")),
		seed("nul-in-segment", runner, req("GET", "/state/team-a/app/de%00fault", nil, "")),
		seed("bad-escape", runner, req("GET", "/state/team-a/app/%zz", nil, "")),
		seed("empty-segment", runner, req("GET", "/state//app/default", nil, "")),
		seed("extra-segment", runner, req("GET", "/state/team-a/app/default/extra", nil, "")),
		seed("absolute-uri", runner, req("GET", "https://evil.example/state/team-b/app/default", nil, "")),
		seed("query-path", runner, req("GET", "/state/team-a/app/default?/state/team-b/app/default", nil, "")),
		seed("other-prefix", runner, req("GET", "/states/team-a/app/default", nil, "")),
		seed("unknown-method", runner, req("PATCH", "/state/team-a/app/default", nil, "{}")),
		seed("api-identity", string(pki.APIIdentity("team-a")), req("GET", "/state/team-a/app/default", nil, "")),
		seed("warm-pod-identity", "terrace://runner/team-a/class/small/pod-1", req("GET", "/state/team-a/app/default", nil, "")),
		seed("no-identity", "", req("GET", "/state/team-a/app/default", nil, "")),
		seed("forged-identity", "terrace://runner/team-a/app/run-1/../../team-b", req("GET", "/state/team-b/app/default", nil, "")),
		seed("controller-get", controller, req("GET", "/state/team-b/app/default", nil, "")),
	}
}

func md5Base64(b []byte) string {
	sum := md5.Sum(b) //nolint:gosec // Content-MD5 is what the protocol carries.
	return base64.StdEncoding.EncodeToString(sum[:])
}
