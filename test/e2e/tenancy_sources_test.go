package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// internalEndpoint stands for a service only the controller's network
// position should reach (cloud metadata, an unauthenticated admin API): it
// answers /creds with a secret and /missing with a 404 whose body is the
// secret too. It records, for every connection, whether this test process
// (where the controller runs) opened it; runner pods are other processes.
type internalEndpoint struct {
	srv    *httptest.Server
	secret string

	mu       sync.Mutex
	requests []endpointRequest
	fromUs   int // connections opened by this process
	traceErr error
}

type endpointRequest struct {
	path, userAgent string
}

func newInternalEndpoint(t *testing.T) *internalEndpoint {
	t.Helper()
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		t.Fatal(err)
	}
	ep := &internalEndpoint{secret: "internal-credential-" + hex.EncodeToString(token)}
	ep.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep.mu.Lock()
		ep.requests = append(ep.requests, endpointRequest{path: r.URL.Path, userAgent: r.UserAgent()})
		ep.mu.Unlock()
		if r.URL.Path != "/creds" {
			w.WriteHeader(http.StatusNotFound)
		}
		_, _ = w.Write([]byte(ep.secret))
	}))
	ep.srv.Config.ConnState = func(c net.Conn, state http.ConnState) {
		if state != http.StateNew {
			return
		}
		ours, err := openedByThisProcess(c)
		ep.mu.Lock()
		defer ep.mu.Unlock()
		if err != nil && ep.traceErr == nil {
			ep.traceErr = err
		}
		if ours {
			ep.fromUs++
		}
	}
	_ = ep.srv.Listener.Close()
	ep.srv.Listener = linkListener(t)
	ep.srv.Start()
	t.Cleanup(ep.srv.Close)
	return ep
}

func (ep *internalEndpoint) host() string { return strings.TrimPrefix(ep.srv.URL, "http://") }

// secretDigestHex is the digest of the secret body: knowing it would let
// a tenant confirm a guess of the secret.
func (ep *internalEndpoint) secretDigestHex() string {
	return strings.TrimPrefix(artifact.Digest([]byte(ep.secret)), "sha256:")
}

func (ep *internalEndpoint) seen() (requests []endpointRequest, fromUs int, err error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return append([]endpointRequest(nil), ep.requests...), ep.fromUs, ep.traceErr
}

// openedByThisProcess finds the client end of an accepted connection in
// this network namespace's socket table and reports whether one of this
// process's file descriptors holds it. A connection from a pod comes from
// another network namespace (the node's pods' addresses), whose sockets
// this table does not list: not this process's.
func openedByThisProcess(c net.Conn) (bool, error) {
	peer, local := c.RemoteAddr().(*net.TCPAddr), c.LocalAddr().(*net.TCPAddr)
	if _, pods, err := net.ParseCIDR(sharedEnv.dev.Node.PodCIDR()); err == nil && pods.Contains(peer.IP) {
		return false, nil
	}
	inode, err := socketInode(peer.Port, local.Port)
	if err != nil {
		return false, err
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false, err
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && link == want {
			return true, nil
		}
	}
	return false, nil
}

// socketInode returns the inode of the TCP socket whose local port is
// localPort and remote port remotePort, from /proc/net/tcp{,6}.
func socketInode(localPort, remotePort int) (string, error) {
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[0] == "sl" {
				continue
			}
			if hexPort(fields[1]) == localPort && hexPort(fields[2]) == remotePort {
				_ = f.Close()
				return fields[9], nil
			}
		}
		_ = f.Close()
	}
	return "", fmt.Errorf("no socket from port %d to port %d in /proc/net/tcp", localPort, remotePort)
}

func hexPort(addr string) int {
	_, port, ok := strings.Cut(addr, ":")
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(port, 16, 32)
	if err != nil {
		return -1
	}
	return int(n)
}

// assertNothingLeaked checks that neither the secret body nor its digest
// reached the Stacks' status, the namespace's events or the controller's log.
func (e *stackEnv) assertNothingLeaked(t *testing.T, ep *internalEndpoint, stacks ...string) {
	t.Helper()
	leaks := []string{ep.secret, ep.secretDigestHex()}
	for _, name := range stacks {
		statusJSON, _ := json.Marshal(e.getStack(t, name).Status)
		for _, leak := range leaks {
			if strings.Contains(string(statusJSON), leak) {
				t.Errorf("Stack %s's status quotes what the endpoint answered: %s", name, statusJSON)
			}
		}
	}
	var events eventsv1.EventList
	if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		for _, leak := range leaks {
			if strings.Contains(ev.Note, leak) {
				t.Errorf("event %s quotes what the endpoint answered: %s", ev.Reason, ev.Note)
			}
		}
	}
	for _, leak := range leaks {
		if strings.Contains(controllerLog.String(), leak) {
			t.Errorf("the controller's log quotes what the endpoint answered (%.12s…)", leak)
		}
	}
}

func urlStack(name, url, digest string) *terracev1.Stack {
	return &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: terracev1.StackSpec{
			Source:      terracev1.StackSource{URL: url, Digest: digest},
			ApprovePlan: terracev1.ApprovePlanAuto,
		},
	}
}

// TestTenantURLSourceIsFetchedByTheRunnerNotTheController: a Stack author
// points spec.source.url at an internal endpoint the controller can reach.
// The runner pod fetches it (from the tenant's own network position), the
// controller never connects, and neither the body nor its digest comes
// back through the condition, an event or the log; a 404 says only
// "HTTP 404 from <host>".
func TestTenantURLSourceIsFetchedByTheRunnerNotTheController(t *testing.T) {
	e := newStackEnv(t)
	ep := newInternalEndpoint(t)

	// The detector must be able to see this process connect, or the
	// proof below could not fail.
	resp, err := http.Get(ep.srv.URL + "/probe")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if _, fromUs, err := ep.seen(); err != nil || fromUs != 1 {
		t.Fatalf("the connection detector did not see this process connect (%d, %v)", fromUs, err)
	}

	wrongDigest := "sha256:" + strings.Repeat("0", 64)
	e.create(t, urlStack("probe-creds", ep.srv.URL+"/creds", wrongDigest))
	e.create(t, urlStack("probe-missing", ep.srv.URL+"/missing", wrongDigest))

	e.waitStack(t, "probe-creds", stackTimeout, "Stalled on the digest", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "SourceDigestMismatch")(s); err != nil {
			return err
		}
		if msg := outcome.Get(s, terracev1.ReadyCondition).Message; !strings.Contains(msg, wrongDigest) || !strings.Contains(msg, "does not match") {
			return fmt.Errorf("the message does not say which digest was expected: %s", msg)
		}
		return nil
	})
	e.waitStack(t, "probe-missing", stackTimeout, "unavailable with a 404", waitingOn("SourceUnavailable", "HTTP 404 from "+ep.host()))

	requests, fromUs, err := ep.seen()
	if err != nil {
		t.Fatalf("failed to trace a connection: %v", err)
	}
	if fromUs != 1 { // the probe above
		t.Errorf("the controller's process opened %d connections to the internal endpoint", fromUs-1)
	}
	fetched := map[string]bool{}
	for _, r := range requests {
		if r.path == "/probe" {
			continue
		}
		fetched[r.path] = true
		if r.userAgent != "terrace-runner" {
			t.Errorf("request for %s came from %q, not the runner", r.path, r.userAgent)
		}
	}
	if !fetched["/creds"] || !fetched["/missing"] {
		t.Errorf("the runners did not fetch both URLs themselves: %v", requests)
	}
	e.assertNothingLeaked(t, ep, "probe-creds", "probe-missing")
}

// TestTenantFluxArtifactOnAnotherHostIsRefused: whoever may write a Flux
// source's status points status.artifact.url at an internal endpoint, with
// the right digest. The controller refuses the host before connecting
// (SourceHostNotAllowed, naming the host and the flag), starts no run, and
// the endpoint sees no connection at all.
func TestTenantFluxArtifactOnAnotherHostIsRefused(t *testing.T) {
	e := newStackEnv(t)
	e.installFluxCRD(t, "GitRepository")
	ep := newInternalEndpoint(t)

	lure := fluxArtifact{URL: ep.srv.URL + "/creds", Digest: artifact.Digest([]byte(ep.secret)), Revision: "main@sha1:" + strings.Repeat("a", 40)}
	e.createFluxSource(t, "GitRepository", "lure", &lure)
	e.create(t, fluxStack("probe-flux", "GitRepository", "lure"))

	e.waitStack(t, "probe-flux", stackTimeout, "refused the artifact host", func(s *terracev1.Stack) error {
		if err := conditionIs(terracev1.StalledCondition, metav1.ConditionTrue, "SourceHostNotAllowed")(s); err != nil {
			return err
		}
		msg := outcome.Get(s, terracev1.ReadyCondition).Message
		if !strings.Contains(msg, ep.host()) || !strings.Contains(msg, "--source-artifact-hosts") {
			return fmt.Errorf("the message names neither the host nor the flag: %s", msg)
		}
		return nil
	})
	if requests, fromUs, err := ep.seen(); len(requests) != 0 || fromUs != 0 || err != nil {
		t.Errorf("the internal endpoint was contacted: %d requests, %d connections from the controller (%v)", len(requests), fromUs, err)
	}
	if st := e.getStack(t, "probe-flux").Status; st.LastAttemptedRevision != "" {
		t.Errorf("a run was started for the refused artifact (lastAttemptedRevision %q)", st.LastAttemptedRevision)
	}
	e.assertNothingLeaked(t, ep, "probe-flux")
}
