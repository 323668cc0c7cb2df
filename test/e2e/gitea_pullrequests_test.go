package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"code.gitea.io/sdk/gitea"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/forge"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

func prModule(resources ...string) string {
	var b strings.Builder
	for _, r := range resources {
		fmt.Fprintf(&b, "resource \"terraform_data\" %q {\n  input = %q\n}\n", r, r)
	}
	return b.String()
}

// slowPlanModule plans long enough (thousands of resources) for the test
// to take its run's certificate while the run is current.
const slowPlanModule = `resource "terraform_data" "many" {
  count = 4000
  input = count.index
}
`

// TestPullRequestPlansOnGitea is issue #46 item 2 end to end on the real
// node with a real Gitea: a Stack following main with pullRequests
// (provider gitea, trigger writers) plans a pull request that changes its
// module and posts one comment and a commit status; a second push edits
// the same comment and sets the new head's status; a pull request with an
// invalid module gets a failing status; the certificate of a pull
// request's plan run, taken while it runs, reads the Stack's state and is
// refused 403 for POST, LOCK and UNLOCK, with the state unchanged; closing
// a pull request drops its entry. TERRACE_PR_BENCH=<n> logs the median
// time from push to comment over n pushes.
func TestPullRequestPlansOnGitea(t *testing.T) {
	e := newStackEnv(t)
	ctx := context.Background()
	g := startGitea(ctx, t)
	defer logPodsOnFailure(t, e.cs, e.ns)

	repo := g.createRepo(t, "prplans-"+randomHex(3))
	repo.push(t, "main", map[string]string{"main.tf": prModule("a"), "README.md": "infra\n"}, "seed")
	e.create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "forge"}, StringData: map[string]string{"token": g.AdminToken}})
	e.allowRunnerToRead(t, "forge")
	e.create(t, &terracev1.Stack{
		ObjectMeta: metav1.ObjectMeta{Name: "infra"},
		Spec: terracev1.StackSpec{
			Source: terracev1.StackSource{Git: &terracev1.GitSource{
				URL: repo.InClusterCloneURL, Ref: &terracev1.GitRef{Branch: "main"},
				PullRequests: &terracev1.GitPullRequests{
					Enabled: true, Provider: terracev1.GitProviderGitea, APIURL: g.InClusterURL,
					SecretRef: terracev1.LocalObjectReference{Name: "forge"}, Trigger: terracev1.PullRequestTriggerWriters,
					Interval: &metav1.Duration{Duration: 10 * time.Second},
				},
			}},
			ApprovePlan:    terracev1.ApprovePlanAuto,
			DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionDisabled},
		},
	})
	e.waitStack(t, "infra", 3*time.Minute, "applied main", readyAt)
	stateBefore, _ := e.stateOf(t, "infra")

	// A pull request that adds a resource: one comment, a success status.
	pushed := time.Now()
	head := repo.push(t, "change", map[string]string{"main.tf": prModule("a", "b")}, "add b")
	pr := repo.openPullRequest(t, "change", "main", "Add b")
	body := waitPlanComment(t, repo, pr.Index, head, "Plan: +1 ~0 -0")
	t.Logf("pull request #%d planned and commented %s after the push", pr.Index, time.Since(pushed).Round(100*time.Millisecond))
	waitCommitStatus(t, repo, head, e.ns, gitea.StatusSuccess, "+1 ~0 -0")
	e.waitStack(t, "infra", time.Minute, "pull request recorded", func(s *terracev1.Stack) error {
		return pullRequestIs(s, pr.Index, terracev1.PullRequestPlanPlanned, 1)
	})
	if !strings.Contains(body, "terraform_data.b") {
		t.Errorf("the comment does not show the plan:\n%s", body)
	}

	// A second push edits the same comment and sets the new head's status.
	second := repo.push(t, "change", map[string]string{"main.tf": prModule("a", "b", "c")}, "add c")
	e.requestReconcile(t, "infra")
	waitPlanComment(t, repo, pr.Index, second, "Plan: +2 ~0 -0")
	waitCommitStatus(t, repo, second, e.ns, gitea.StatusSuccess, "+2 ~0 -0")

	// An invalid module: a failing status.
	broken := repo.push(t, "broken", map[string]string{"main.tf": "resource \"terraform_data\" {\n"}, "broken")
	bad := repo.openPullRequest(t, "broken", "main", "Broken")
	waitCommitStatus(t, repo, broken, e.ns, gitea.StatusFailure, "Plan failed")
	e.waitStack(t, "infra", time.Minute, "broken pull request recorded", func(s *terracev1.Stack) error {
		return pullRequestIs(s, bad.Index, terracev1.PullRequestPlanFailed, 0)
	})

	// The read-only attack: the plan run's own certificate, as module code
	// in its pod holds it, reads the state and may not write or lock it.
	slow := repo.push(t, "slow", map[string]string{"main.tf": slowPlanModule}, "many")
	slowPR := repo.openPullRequest(t, "slow", "main", "Many")
	thief := e.stealPullRequestRun(t, "infra", slowPR.Index)
	url := e.stateURL(t, "infra")
	if code, got := thief.do(t, http.MethodGet, url, nil); code != http.StatusOK {
		t.Fatalf("GET with the current pull-request run's certificate answered %d %s, want 200: the attack below would prove nothing", code, got)
	}
	lock := []byte(`{"ID":"pr-thief","Operation":"OperationTypeApply","Who":"pr"}`)
	for _, a := range []struct {
		method string
		body   []byte
	}{
		{http.MethodPost, storetest.StateJSON(stateBefore.Lineage, stateBefore.Serial+10, 0, 100)},
		{httpbackend.MethodLock, lock},
		{httpbackend.MethodUnlock, lock},
		{http.MethodDelete, nil},
	} {
		if code, got := thief.do(t, a.method, url, a.body); code != http.StatusForbidden {
			t.Fatalf("%s with pull-request run %s's certificate answered %d %s, want 403", a.method, thief.runID, code, got)
		}
	}
	after, lockAfter := e.stateOf(t, "infra")
	if after.Serial != stateBefore.Serial || after.Lineage != stateBefore.Lineage || lockAfter != nil {
		t.Fatalf("state went from serial %d to %d (lock %+v)", stateBefore.Serial, after.Serial, lockAfter)
	}
	waitCommitStatus(t, repo, slow, e.ns, gitea.StatusSuccess, "+4000 ~0 -1")

	// Closing a pull request drops its entry.
	closed := gitea.StateClosed
	if _, _, err := g.API.EditPullRequest(repo.Owner, repo.Name, bad.Index, gitea.EditPullRequestOption{State: &closed}); err != nil {
		t.Fatal(err)
	}
	e.requestReconcile(t, "infra")
	e.waitStack(t, "infra", time.Minute, "the closed pull request forgotten", func(s *terracev1.Stack) error {
		if slices.ContainsFunc(s.Status.PullRequests, func(p terracev1.PullRequestPlan) bool { return p.Number == bad.Index }) {
			return fmt.Errorf("#%d is still in %+v", bad.Index, s.Status.PullRequests)
		}
		return nil
	})
	if final, _ := e.stateOf(t, "infra"); final.Serial != stateBefore.Serial {
		t.Fatalf("pull-request plans changed the state: serial %d, was %d", final.Serial, stateBefore.Serial)
	}

	n, _ := strconv.Atoi(os.Getenv("TERRACE_PR_BENCH"))
	var took []time.Duration
	for i := range n {
		resources := []string{"a", "b"}
		for j := range i + 1 {
			resources = append(resources, fmt.Sprintf("n%d", j))
		}
		start := time.Now()
		sha := repo.push(t, "change", map[string]string{"main.tf": prModule(resources...)}, fmt.Sprintf("bench %d", i))
		// What the webhook receiver does on Gitea's pull_request event.
		e.requestReconcile(t, "infra")
		waitPlanComment(t, repo, pr.Index, sha, fmt.Sprintf("Plan: +%d ~0 -0", len(resources)-1))
		took = append(took, time.Since(start))
	}
	if n > 0 {
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		t.Logf("push to comment over %d pushes: median %s, min %s, max %s (all %v)", n, took[n/2].Round(100*time.Millisecond), took[0].Round(100*time.Millisecond), took[n-1].Round(100*time.Millisecond), took)
	}
}

// waitPlanComment waits until Terrace's one comment on the pull request
// names head and says want, and returns its body.
func waitPlanComment(t *testing.T, repo *giteaRepo, index int64, head, want string) string {
	t.Helper()
	var body string
	eventually(t, 4*time.Minute, fmt.Sprintf("the plan comment on #%d for %s", index, head[:12]), func() error {
		comments, err := repo.comments(index)
		if err != nil {
			return err
		}
		var ours []*gitea.Comment
		for _, c := range comments {
			if strings.HasPrefix(c.Body, "<!-- terrace:") {
				ours = append(ours, c)
			}
		}
		if len(ours) > 1 {
			t.Fatalf("%d comments of Terrace on #%d, want one edited in place", len(ours), index)
		}
		if len(ours) == 0 || !strings.Contains(ours[0].Body, head) || !strings.Contains(ours[0].Body, want) {
			return fmt.Errorf("comments: %d of Terrace's", len(ours))
		}
		body = ours[0].Body
		return nil
	})
	return body
}

func waitCommitStatus(t *testing.T, repo *giteaRepo, sha, ns string, state gitea.StatusState, words string) {
	t.Helper()
	eventually(t, 4*time.Minute, fmt.Sprintf("commit status %s on %s", state, sha[:12]), func() error {
		ss, err := repo.statuses(sha)
		if err != nil {
			return err
		}
		// The latest is the highest ID: Gitea lists by creation second,
		// so two statuses of one second come in either order.
		var latest *gitea.Status
		for _, s := range ss {
			if s.Context == forge.StatusContext(ns, "infra") && (latest == nil || s.ID > latest.ID) {
				latest = s
			}
		}
		switch {
		case latest == nil:
			return fmt.Errorf("no status of terrace")
		case latest.State != state || !strings.Contains(latest.Description, words):
			return fmt.Errorf("latest status %s %q", latest.State, latest.Description)
		}
		return nil
	})
}

func pullRequestIs(s *terracev1.Stack, number int64, status string, add int32) error {
	for _, p := range s.Status.PullRequests {
		if p.Number == number {
			if p.Status != status || p.Add != add || p.RunID != "" {
				return fmt.Errorf("#%d is %+v", number, p)
			}
			return nil
		}
	}
	return fmt.Errorf("no #%d in %+v", number, s.Status.PullRequests)
}

// stealPullRequestRun takes the certificate of the pull request's plan
// run from its TLS Secret while status names the run.
func (e *stackEnv) stealPullRequestRun(t *testing.T, stack string, number int64) stolenRunner {
	t.Helper()
	var runID string
	var secret corev1.Secret
	eventually(t, 3*time.Minute, fmt.Sprintf("the plan run of #%d", number), func() error {
		s := e.getStack(t, stack)
		for _, p := range s.Status.PullRequests {
			if p.Number == number && p.RunID != "" {
				runID = p.RunID
			}
		}
		if runID == "" {
			return fmt.Errorf("no run of #%d in %+v", number, s.Status.PullRequests)
		}
		var list corev1.SecretList
		if err := e.c.List(context.Background(), &list, client.InNamespace(e.ns), client.MatchingLabels{
			launcher.LabelComponent: launcher.ComponentRunnerTLS, launcher.LabelRun: runID,
		}); err != nil || len(list.Items) != 1 {
			return fmt.Errorf("TLS Secret of run %s: %v (%d)", runID, err, len(list.Items))
		}
		secret = list.Items[0]
		return nil
	})
	leaf, err := pki.LeafFromSecretData(secret.Data)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if x, err := x509.ParseCertificate(cert.Certificate[0]); err != nil {
		t.Fatal(err)
	} else if id, err := pki.IdentityFromCertificate(x); err != nil || id != pki.ReadOnlyRunnerIdentity(e.ns, stack, runID) {
		t.Fatalf("the pull request's run holds identity %s (%v), want the read-only %s", id, err, pki.ReadOnlyRunnerIdentity(e.ns, stack, runID))
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(leaf.CABundlePEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return stolenRunner{runID: runID, client: &http.Client{Timeout: 30 * time.Second, Transport: tr}}
}
