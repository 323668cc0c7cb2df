package httpbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
)

// errForbidden marks an identity that may not make a request (403).
var errForbidden = errors.New("forbidden")

// authorize lets the controller use every state and a runner only its own
// Stack's, and only while its run is the Stack's current run and the pod
// its certificate is bound to (podUID) is that run's runner pod.
func (h *Handler) authorize(ctx context.Context, id pki.Identity, podUID string, key state.Key, method string) error {
	if id == pki.ControllerIdentity {
		return nil
	}
	if ns, stack, runID, ok := id.ReadOnlyRunner(); ok {
		return h.authorizeReadOnly(ctx, id, podUID, key, method, ns, stack, runID)
	}
	ns, stack, runID, ok := id.Runner()
	if !ok {
		return fmt.Errorf("%w: identity %s may not use the state server", errForbidden, id)
	}
	if ns != key.Namespace || stack != key.Stack {
		return fmt.Errorf("%w: identity %s may not use the state of %s/%s", errForbidden, id, key.Namespace, key.Stack)
	}
	if method == http.MethodDelete {
		return fmt.Errorf("%w: identity %s may not delete state: only the controller may", errForbidden, id)
	}
	if h.Runs == nil {
		return fmt.Errorf("%w: runner identities are not accepted: the server has no way to tell current runs", errForbidden)
	}
	current, err := h.Runs.IsCurrentRun(ctx, ns, stack, runID, podUID)
	if err != nil {
		return fmt.Errorf("failed to check that run %s is current: %w", runID, err)
	}
	if !current {
		return fmt.Errorf("%w: run %s is not the current run of Stack %s/%s, or this certificate is not its runner pod's: it works only while the run is current, from the pod it was issued for", errForbidden, runID, ns, stack)
	}
	return nil
}

// authorizeReadOnly lets a read-only run (a pull request's plan) read its
// own Stack's state and nothing more: no write, lock, unlock or delete,
// whatever the module it runs tries. tofu plans such a run with -lock=false;
// its certificate is what is checked, so no flag of the run's can widen it.
func (h *Handler) authorizeReadOnly(ctx context.Context, id pki.Identity, podUID string, key state.Key, method, ns, stack, runID string) error {
	if ns != key.Namespace || stack != key.Stack {
		return fmt.Errorf("%w: identity %s may not use the state of %s/%s", errForbidden, id, key.Namespace, key.Stack)
	}
	if method != http.MethodGet {
		return fmt.Errorf("%w: %s is a pull request's plan-only run: it may read the state of %s/%s, never change or lock it (%s refused)", errForbidden, id, ns, stack, method)
	}
	if h.Runs == nil {
		return fmt.Errorf("%w: runner identities are not accepted: the server has no way to tell current runs", errForbidden)
	}
	current, err := h.Runs.IsCurrentPullRequestRun(ctx, ns, stack, runID, podUID)
	if err != nil {
		return fmt.Errorf("failed to check that run %s is current: %w", runID, err)
	}
	if !current {
		return fmt.Errorf("%w: run %s is not a current pull-request run of Stack %s/%s, or this certificate is not its runner pod's", errForbidden, runID, ns, stack)
	}
	return nil
}

// lockedByAnotherRun is what a runner is told about a lock it does not
// hold: tofu prints a 423's lock info, and another run's lock ID is all it
// takes to write or unlock under it.
var lockedByAnotherRun = mustJSON(state.LockInfo{
	ID:        "held-by-another-run",
	Operation: "unknown",
	Who:       "another Terrace run or the controller",
	Info:      "the state is locked by someone else; Terrace releases the lock of a run that is gone, retry when it ends",
})

func mustJSON(v any) []byte {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return raw
}

// writeLocked answers 423 with the holder's lock info, or, to a runner, a
// lock info that names nobody.
func writeLocked(w http.ResponseWriter, id pki.Identity, holder *state.LockInfo) {
	body := lockedByAnotherRun
	if id == pki.ControllerIdentity {
		body = mustJSON(holder)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusLocked)
	_, _ = w.Write(body)
}

// lockIDOf is the lock ID a request names, as the store is to check it: a
// runner writes and unlocks under only a lock it took itself (taken by
// another run, a migration or the controller, its ID opens nothing, however
// the runner learnt it). The store checks ID and owner in the same
// compare-and-swap as the write, so no read of the lock comes first; a
// lock of another owner is a LockedError with its holder, answered 423
// with a lock info that names nobody.
func lockIDOf(id pki.Identity, lockID string) string {
	if id == pki.ControllerIdentity {
		return lockID
	}
	return state.OwnedLockID(string(id), lockID)
}

// lockOwner is the lock owner a request may read as (state.GetAdmittedBy):
// a run's identity, unique to the run. Other identities may be shared by
// several clients at once, so their reads always read the index.
func lockOwner(id pki.Identity) string {
	if _, _, _, ok := id.Runner(); ok {
		return string(id)
	}
	return ""
}
