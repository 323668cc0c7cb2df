package chaos

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// The end checks must be able to fail: these feed them what a lost
// release or a refused certificate looks like.

func TestReleasesAgree(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(rev int, status release.Status, serial int64, finished time.Time) release.Release {
		return release.Release{Revision: rev, Status: status, Plan: release.PlanSummary{Add: 1}, StateSerial: serial, FinishedAt: finished}
	}
	good := []release.Release{rec(1, release.StatusSuperseded, 1, at), rec(2, release.StatusFailed, 2, at.Add(time.Minute)), rec(3, release.StatusDeployed, 4, at.Add(2*time.Minute))}
	// A drift repaired: a changing apply that wrote no new state.
	repaired := []release.Release{rec(1, release.StatusSuperseded, 1, at), rec(2, release.StatusSuperseded, 2, at), rec(3, release.StatusDeployed, 2, at)}
	tests := []struct {
		name     string
		records  []release.Release
		status   *terracev1.ReleaseStatus
		serial   int64
		stateAt  time.Time
		problems string
	}{
		{"consistent", good, &terracev1.ReleaseStatus{Revision: 3}, 4, at.Add(2 * time.Minute), ""},
		{"a drift repaired", repaired, &terracev1.ReleaseStatus{Revision: 3}, 2, at, ""},
		{"no records", nil, nil, 1, at, "no release record"},
		{"two deployed", []release.Release{rec(1, release.StatusDeployed, 1, at), rec(2, release.StatusDeployed, 2, at)}, &terracev1.ReleaseStatus{Revision: 2}, 2, at, "2 deployed"},
		{"status names another", good, &terracev1.ReleaseStatus{Revision: 2}, 4, at.Add(2 * time.Minute), "status names release"},
		{"a state no release left", good, &terracev1.ReleaseStatus{Revision: 3}, 5, at.Add(2 * time.Minute), "the state's serial is 5"},
		{"serials going back", []release.Release{rec(1, release.StatusSuperseded, 3, at), rec(2, release.StatusDeployed, 2, at)}, &terracev1.ReleaseStatus{Revision: 2}, 2, at, "an earlier one 3"},
		{"state written after the release", good, &terracev1.ReleaseStatus{Revision: 3}, 4, at.Add(time.Hour), "after deployed release 3"},
		{"an older one deployed", []release.Release{rec(1, release.StatusDeployed, 1, at), rec(2, release.StatusSuperseded, 2, at)}, &terracev1.ReleaseStatus{Revision: 1}, 1, at, "2 is newer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.Join(releasesAgree(tt.records, tt.status, tt.serial, tt.stateAt), "; ")
			if tt.problems == "" && got != "" || tt.problems != "" && !strings.Contains(got, tt.problems) {
				t.Errorf("releasesAgree = %q, want %q", got, tt.problems)
			}
		})
	}
}

func TestHandshakesTellFailuresFromInterruptions(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "controller-0.log")
	lines := strings.Join([]string{
		`{"level":"info","msg":"reconciled"}`,
		`2026/12/01 20:00:00 http: TLS handshake error from 127.0.0.9:4242: EOF`,
		`2026/12/01 20:00:01 http: TLS handshake error from 127.0.0.9:4243: remote error: tls: bad certificate`,
		`{"msg":"failed to apply","error":"transport: authentication handshake failed: x509: certificate signed by unknown authority"}`,
		`2026-12-02T02:57:20Z	DEBUG	artifact-server	http: TLS handshake error from 127.0.0.1:39288: client sent an HTTP request to an HTTPS server`,
	}, "\n") + "\n"
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &env{podLogDir: filepath.Join(dir, "pods"), ctrls: &controllers{replicas: []*replica{{logPath: log}}}}
	failures, interrupted := e.handshakes(nil, nil)
	if len(failures) != 2 || interrupted != 1 {
		t.Errorf("handshakes = %q, %d interrupted; want the two certificate errors and one EOF, and not the plain HTTP request", failures, interrupted)
	}
	from := e.markLogs()
	if failures, _ := e.handshakes(from, nil); len(failures) != 0 {
		t.Errorf("handshakes after the mark = %q, want none", failures)
	}
}

func TestFileContentsReadsTheTestProvidersFiles(t *testing.T) {
	state := `{"version":4,"serial":3,"lineage":"l","resources":[
{"mode":"managed","type":"testfile_file","name":"f","instances":[
 {"index_key":0,"attributes":{"id":"/d/file-0.txt","path":"/d/file-0.txt","content":"generation 2"}},
 {"index_key":1,"attributes":{"id":"/d/file-1.txt","path":"/d/file-1.txt","content":"generation 2"}}]},
{"mode":"managed","type":"terraform_data","name":"slow","instances":[{"attributes":{"input":""}}]}]}`
	got, err := fileContents([]byte(state))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"/d/file-0.txt": "generation 2", "/d/file-1.txt": "generation 2"}
	if !equalMaps(got, want) {
		t.Errorf("fileContents = %v, want %v", got, want)
	}
	if _, err := fileContents([]byte("not json")); err == nil {
		t.Error("fileContents accepted a state that is not JSON")
	}
}

func TestSlugIsAStackName(t *testing.T) {
	for _, f := range faultOrder {
		s := slug(f)
		if s == "" || len(s) > 40 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" || strings.HasPrefix(s, "-") || strings.HasSuffix(s, "-") {
			t.Errorf("slug(%q) = %q, not a short DNS label", f, s)
		}
	}
}

// flakyTransport fails its first calls as a restarting kube-apiserver does
// and records the bodies it was sent.
type flakyTransport struct {
	failures []error
	statuses []int
	bodies   []string
}

func (f *flakyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(req.Body)
	f.bodies = append(f.bodies, string(b))
	if len(f.failures) > 0 {
		err := f.failures[0]
		f.failures = f.failures[1:]
		return nil, err
	}
	code := http.StatusOK
	if len(f.statuses) > 0 {
		code, f.statuses = f.statuses[0], f.statuses[1:]
	}
	return &http.Response{StatusCode: code, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

func TestHarnessRequestsOutlastControlPlaneRestarts(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	flaky := &flakyTransport{failures: []error{refused, io.EOF}, statuses: []int{http.StatusServiceUnavailable}}
	rt := &retryingTransport{next: flaky, outage: time.Minute}
	req, _ := http.NewRequest(http.MethodPut, "https://127.0.0.1:1/api/v1/namespaces/a/pods/b", strings.NewReader(`{"x":1}`))
	resp, err := rt.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("RoundTrip = %v, %v; want 200 after the restart", resp, err)
	}
	if len(flaky.bodies) != 4 || slices.ContainsFunc(flaky.bodies, func(b string) bool { return b != `{"x":1}` }) {
		t.Errorf("attempts sent bodies %q, want the same body 4 times", flaky.bodies)
	}

	// A refusal is final once the outage bound has passed, and an answer
	// of the server's (a conflict) is never retried.
	gone := &retryingTransport{next: &flakyTransport{failures: []error{refused, refused}}, outage: 0}
	if _, err := gone.RoundTrip(req); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after the outage bound: %v, want connection refused", err)
	}
	conflict := &flakyTransport{statuses: []int{http.StatusConflict}}
	if resp, _ := (&retryingTransport{next: conflict, outage: time.Minute}).RoundTrip(req); resp.StatusCode != http.StatusConflict || len(conflict.bodies) != 1 {
		t.Errorf("a conflict was retried: %d attempts", len(conflict.bodies))
	}
}
