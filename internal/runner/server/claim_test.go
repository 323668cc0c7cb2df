package server

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

var testClassIdentity = pki.RunnerClassIdentity("team-a", "c0ffee", "warm-abc")

// startWarmRunner starts a runner with a class identity, as a warm pod is.
func startWarmRunner(t *testing.T) *testRunner {
	t.Helper()
	authority := newAuthority(t)
	classLeaf := issue(t, authority, testClassIdentity)
	tr := startRunner(t, authority, func(c *Config) {
		c.Certificate = certSource(t, classLeaf)
		c.BackendLeaf = nil
		c.Warm = true
	})
	return tr
}

// TestWarmRunnerWorksOnlyForTheRunThatClaimedIt: before its claim a warm
// runner refuses every operation and presents only its class identity;
// once claimed it presents the run's certificate to the controller's
// servers; it is never claimed a second time.
func TestWarmRunnerWorksOnlyForTheRunThatClaimedIt(t *testing.T) {
	tr := startWarmRunner(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	data, digest := buildArchive(t, map[string]string{"main.tf": `resource "terraform_data" "a" {}`})
	var mu sync.Mutex
	var seen []pki.Identity
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pki.IdentityFromRequest(r)
		mu.Lock()
		seen = append(seen, id)
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		_, _ = w.Write(data)
	})
	url := serveTLS(t, handler, pki.ServerTLSConfig(certSource(t, issue(t, tr.authority, pki.ControllerIdentity)), pki.TrustFunc(tr.authority.TrustPool), nil)) + "/programs/team-a/web/1.tar.gz"

	if _, err := tr.client.Fetch(ctx, url, digest); runner.Reason(err) != runner.ReasonNotClaimed {
		t.Fatalf("fetch before the claim answered %v, want %s", err, runner.ReasonNotClaimed)
	}
	if _, err := tr.client.Init(ctx, &runnerv1.InitRequest{}, nil); runner.Reason(err) != runner.ReasonNotClaimed {
		t.Fatalf("init before the claim answered %v, want %s", err, runner.ReasonNotClaimed)
	}
	if len(seen) != 0 {
		t.Fatalf("an unclaimed runner made requests as %v", seen)
	}

	if _, err := tr.client.Claim(ctx, issue(t, tr.authority, pki.RunnerIdentity("team-b", "web", "run-1"))); runner.Reason(err) != runner.ReasonInvalidArgument {
		t.Errorf("a claim by a run of another namespace answered %v, want %s", err, runner.ReasonInvalidArgument)
	}
	if _, err := tr.client.Claim(ctx, issue(t, tr.authority, pki.ControllerIdentity)); runner.Reason(err) != runner.ReasonInvalidArgument {
		t.Errorf("a claim with the controller's identity answered %v, want %s", err, runner.ReasonInvalidArgument)
	}

	run := pki.RunnerIdentity("team-a", "web", "run-1")
	got, err := tr.client.Claim(ctx, issue(t, tr.authority, run))
	if err != nil || got != run {
		t.Fatalf("claim answered %q, %v; want %s", got, err, run)
	}
	if _, err := tr.client.Fetch(ctx, url, digest); err != nil {
		t.Fatalf("fetch after the claim failed: %v", err)
	}
	if len(seen) != 1 || seen[0] != run {
		t.Errorf("the claimed runner fetched as %v, want the run's identity %s", seen, run)
	}
	if _, err := tr.client.Claim(ctx, issue(t, tr.authority, pki.RunnerIdentity("team-a", "web", "run-2"))); runner.Reason(err) != runner.ReasonNotClaimed {
		t.Errorf("a second claim answered %v, want %s: warm runners are single-use", err, runner.ReasonNotClaimed)
	}
}

// TestRunnerOfOneRunCannotBeClaimed: only warm runners take a claim.
func TestRunnerOfOneRunCannotBeClaimed(t *testing.T) {
	tr := startRunner(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := tr.client.Claim(ctx, issue(t, tr.authority, pki.RunnerIdentity("team-a", "web", "run-2"))); runner.Reason(err) != runner.ReasonNotClaimed {
		t.Errorf("claiming a runner of one run answered %v, want %s", err, runner.ReasonNotClaimed)
	}
}
