package httpbackend_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
)

// The attack of a pull request's module: its plan-only run holds a
// read-only identity, and everything it tries beyond reading its Stack's
// state is refused by the state server itself, whatever tofu is told to
// do (apply, lock, force-unlock, raw requests), and the state is unchanged.
func TestPullRequestRunReadsStateAndCannotWriteIt(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	ns, stack := uniqueName("pr-"), "web"
	key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
	address := httpbackend.Address(f.baseURL, key)
	tofuAs := func(leaf *pki.Leaf) *tofuRunner {
		return newTofuRunner(t, map[string]any{
			"address": address, "lock_address": address, "unlock_address": address,
			"client_certificate_pem": string(leaf.CertPEM), "client_private_key_pem": string(leaf.KeyPEM),
			"client_ca_certificate_pem": string(leaf.CABundlePEM), "retry_max": 0,
		})
	}

	// The Stack's own run applies n = 1 and ends.
	f.runs.startRun(t, ns, stack, "run-1")
	own := tofuAs(f.leaf(t, pki.RunnerIdentity(ns, stack, "run-1")))
	own.mustRun(t, "init", "-input=false")
	own.mustRun(t, "apply", "-auto-approve", "-input=false", "-var", "n=1")
	f.runs.endRun(t, ns, stack, "run-1")
	applied, err := f.store.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}

	// Pull request 12 is planned by run pr-12-a with a read-only identity.
	const prRun = "pr-12-a"
	f.runs.startPullRequestRun(t, ns, stack, 12, prRun)
	readOnly := pki.ReadOnlyRunnerIdentity(ns, stack, prRun)
	pr := tofuAs(f.leaf(t, readOnly))
	pr.mustRun(t, "init", "-input=false")
	// It reads the state: its plan changes the resource rather than creating it.
	if out := pr.mustRun(t, "plan", "-lock=false", "-input=false", "-var", "n=5"); !strings.Contains(out, "1 to add, 0 to change, 1 to destroy") && !strings.Contains(out, "0 to add, 1 to change") {
		t.Fatalf("the pull request's plan did not start from the Stack's state:\n%s", out)
	}
	// A plan that locks, an apply with and without a lock, a force-unlock:
	// each is refused, and the refusal says why.
	for _, args := range [][]string{
		{"plan", "-input=false", "-var", "n=5", "-lock-timeout=0s"},
		{"apply", "-auto-approve", "-input=false", "-var", "n=5", "-lock-timeout=0s"},
		{"apply", "-auto-approve", "-input=false", "-var", "n=5", "-lock=false"},
		{"force-unlock", "-force", "any-id"},
	} {
		_, errOut, err := pr.run(t, args...)
		if err == nil {
			t.Fatalf("tofu %s ran with a pull request's read-only identity", strings.Join(args, " "))
		}
		// tofu words the server's 403 as "invalid auth" for a lock, and
		// quotes the status for a write.
		if args[0] != "force-unlock" && !strings.Contains(errOut, "403") && !strings.Contains(errOut, "invalid auth") {
			t.Errorf("tofu %s was not refused by the state server:\n%s", strings.Join(args, " "), errOut)
		}
		t.Logf("tofu %s refused:\n%s", strings.Join(args, " "), errOut)
	}
	// Raw requests, as a hostile module could make them with the mounted certificate.
	c := f.client(t, readOnly)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, httpbackend.MethodLock, httpbackend.MethodUnlock} {
		resp := do(t, c, method, address, []byte(`{"version":4,"serial":999,"lineage":"x"}`))
		if resp.code != http.StatusForbidden || !strings.Contains(string(resp.body), "plan-only run") {
			t.Errorf("%s with a read-only identity answered %d %s, want 403 naming the plan-only run", method, resp.code, resp.body)
		}
	}
	if cur, err := f.store.Get(t.Context(), key); err != nil || cur.Version != applied.Version || cur.Serial != applied.Serial {
		t.Fatalf("a pull request's run changed the state: %+v, %v (was version %v serial %d)", cur, err, applied.Version, applied.Serial)
	}
	if lock, err := f.store.GetLock(t.Context(), key); err != nil || lock != nil {
		t.Fatalf("a pull request's run left a lock: %+v, %v", lock, err)
	}

	// Its identity opens no other Stack's state, and a run identity of
	// the same run ID (which is not the Stack's current run) opens nothing.
	other := httpbackend.Address(f.baseURL, state.Key{Namespace: ns, Stack: "db", Workspace: "default"})
	if resp := do(t, c, http.MethodGet, other, nil); resp.code != http.StatusForbidden {
		t.Errorf("a read-only identity read another Stack's state: %d", resp.code)
	}
	if resp := do(t, f.client(t, pki.RunnerIdentity(ns, stack, prRun)), http.MethodGet, address, nil); resp.code != http.StatusForbidden {
		t.Errorf("a run identity of the pull request's run ID was let in: %d", resp.code)
	}
	// Once the pull request's run is over (its pod gone), reading ends too.
	f.runs.endRun(t, ns, stack, prRun)
	if resp := do(t, f.client(t, readOnly), http.MethodGet, address, nil); resp.code != http.StatusForbidden {
		t.Errorf("a finished pull-request run still reads the state: %d", resp.code)
	}
}
