package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/release"
)

// The end checks must be able to fail: these feed them what a lost
// release or a refused certificate looks like.

func TestReleasesAgree(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(rev int, status release.Status, add int, finished time.Time) release.Release {
		return release.Release{Revision: rev, Status: status, Plan: release.PlanSummary{Add: add}, FinishedAt: finished}
	}
	good := []release.Release{rec(1, release.StatusSuperseded, 2, at), rec(2, release.StatusFailed, 0, at.Add(time.Minute)), rec(3, release.StatusDeployed, 1, at.Add(2*time.Minute))}
	tests := []struct {
		name     string
		records  []release.Release
		status   *terracev1.ReleaseStatus
		serial   int64
		stateAt  time.Time
		problems string
	}{
		{"consistent", good, &terracev1.ReleaseStatus{Revision: 3}, 4, at.Add(2 * time.Minute), ""},
		{"no records", nil, nil, 1, at, "no release record"},
		{"two deployed", []release.Release{rec(1, release.StatusDeployed, 1, at), rec(2, release.StatusDeployed, 1, at)}, &terracev1.ReleaseStatus{Revision: 2}, 2, at, "2 deployed"},
		{"status names another", good, &terracev1.ReleaseStatus{Revision: 2}, 4, at.Add(2 * time.Minute), "status names release"},
		{"more applies than serials", good, &terracev1.ReleaseStatus{Revision: 3}, 1, at.Add(2 * time.Minute), "serial is only 1"},
		{"state written after the release", good, &terracev1.ReleaseStatus{Revision: 3}, 4, at.Add(time.Hour), "after deployed release 3"},
		{"an older one deployed", []release.Release{rec(1, release.StatusDeployed, 1, at), rec(2, release.StatusSuperseded, 1, at)}, &terracev1.ReleaseStatus{Revision: 1}, 2, at, "2 is newer"},
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
	}, "\n") + "\n"
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &env{nodeDir: filepath.Join(dir, "node"), ctrls: &controllers{replicas: []*replica{{logPath: log}}}}
	failures, interrupted := e.handshakes(nil, nil)
	if len(failures) != 2 || interrupted != 1 {
		t.Errorf("handshakes = %q, %d interrupted; want the two certificate errors and one EOF", failures, interrupted)
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
