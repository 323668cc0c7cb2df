package server

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	runnerv1 "github.com/terrace-dev/terrace/proto/terrace/runner/v1"
)

// unavailableBackend answers 500 to the next `failing` requests, as the
// state server does while the database behind it restarts, then serves.
type unavailableBackend struct {
	next    http.Handler
	failing atomic.Int64
	refused atomic.Int64
}

func (b *unavailableBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.failing.Add(-1) >= 0 {
		b.refused.Add(1)
		http.Error(w, "internal error while handling the state", http.StatusInternalServerError)
		return
	}
	b.next.ServeHTTP(w, r)
}

func TestAStateServerRestartIsRiddenThroughOrReportedAsUnavailable(t *testing.T) {
	tr := startRunner(t, nil)
	backend := &unavailableBackend{next: &memoryBackend{callers: map[pki.Identity]bool{}}}
	url := serveTLS(t, backend, pki.ServerTLSConfig(certSource(t, issue(t, tr.authority, pki.ControllerIdentity)), pki.TrustFunc(tr.authority.TrustPool), nil))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tr.upload(t, map[string]string{"main.tf": "resource \"terraform_data\" \"a\" {\n  input = \"x\"\n}\n"})
	address := url + "/state/team-a/web/default"
	init := &runnerv1.InitRequest{Workspace: "default", HttpBackend: &runnerv1.HTTPBackend{Address: address, LockAddress: address, UnlockAddress: address}}

	// Three failed answers (seconds of restart; tofu's default retries
	// would give up after them): the runner's retries ride through them.
	backend.failing.Store(3)
	if _, err := tr.client.Init(ctx, init, nil); err != nil {
		t.Fatalf("init across a short state server restart failed: %v", err)
	}
	if got := backend.refused.Load(); got != 3 {
		t.Fatalf("the backend refused %d requests, want 3: the test proved nothing", got)
	}

	// A server that stays down: the failure says the state server did not
	// answer (the controller retries it), not that the module is wrong.
	backend.failing.Store(1 << 30)
	_, err := tr.client.Init(ctx, init, nil)
	if runner.Reason(err) != runner.ReasonStateUnavailable || !strings.Contains(err.Error(), "Failed to get state") {
		t.Fatalf("init against a state server that does not answer returned %v (reason %q), want %s", err, runner.Reason(err), runner.ReasonStateUnavailable)
	}
}
