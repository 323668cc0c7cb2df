package httpbackend_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/httpbackend"
	"github.com/terrace-dev/terrace/internal/state/migrate"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// stateOf reads key's serial and lineage straight from the store.
func stateOf(t *testing.T, f *fixture, key state.Key) (int64, string) {
	t.Helper()
	st, err := f.store.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return st.Serial, st.Lineage
}

// tryAll makes every state request a runner could and reports each answer.
func tryAll(t *testing.T, c *http.Client, url string) map[string]response {
	t.Helper()
	return map[string]response{
		"GET":    do(t, c, http.MethodGet, url, nil),
		"POST":   do(t, c, http.MethodPost, url, storetest.StateJSON("lin", 50, 0, 100)),
		"LOCK":   do(t, c, httpbackend.MethodLock, url, lockBody(t, state.LockInfo{ID: "stale-lock"})),
		"UNLOCK": do(t, c, httpbackend.MethodUnlock, url, lockBody(t, state.LockInfo{ID: "stale-lock"})),
	}
}

// The attack: a certificate kept from a finished run of the same Stack
// (stolen from its pod, or printed by its module) is used after the run.
// It is refused for every method once another run is current, once its pod
// is gone, once its pod is retained, and once its pod was created again
// (same name and labels, another UID); state and lock are untouched.
func TestCertificateOfAFinishedRunIsRefused(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	ns, stack := uniqueName("creds-"), "app"
	key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
	url := httpbackend.Address(f.baseURL, key)

	f.runs.startRun(t, ns, stack, "run-1")
	old := f.client(t, pki.RunnerIdentity(ns, stack, "run-1"))
	if r := do(t, old, http.MethodPost, url, storetest.StateJSON("lin", 1, 0, 100)); r.code != http.StatusOK {
		t.Fatalf("POST during the run: %d %s", r.code, r.body)
	}
	f.runs.endRun(t, ns, stack, "run-1")
	f.runs.startRun(t, ns, stack, "run-2")
	current := f.client(t, pki.RunnerIdentity(ns, stack, "run-2"))
	if r := do(t, current, http.MethodPost, url, storetest.StateJSON("lin", 2, 0, 100)); r.code != http.StatusOK {
		t.Fatalf("POST by the current run: %d %s", r.code, r.body)
	}

	refused := func(when string, c *http.Client) {
		t.Helper()
		serial, lineage := stateOf(t, f, key)
		for method, r := range tryAll(t, c, url) {
			if r.code != http.StatusForbidden {
				t.Fatalf("%s: %s answered %d %s, want 403", when, method, r.code, r.body)
			}
			if bytes.Contains(r.body, []byte(`"lineage"`)) {
				t.Fatalf("%s: the 403 to %s carries state: %s", when, method, r.body)
			}
		}
		if s, l := stateOf(t, f, key); s != serial || l != lineage {
			t.Fatalf("%s: state went from serial %d lineage %s to %d %s", when, serial, lineage, s, l)
		}
		if lock, err := f.store.GetLock(t.Context(), key); err != nil || lock != nil {
			t.Fatalf("%s: state locked behind the 403s: %+v %v", when, lock, err)
		}
	}
	refused("a previous run's certificate", old)

	// The current run's own certificate stops working when its pod goes,
	// and when its pod is kept for debugging after the run.
	f.runs.retain(t, ns, stack, "run-2")
	refused("a retained run's certificate", current)
	f.runs.startRun(t, ns, stack, "run-3")
	deleted := f.client(t, pki.RunnerIdentity(ns, stack, "run-3"))
	f.runs.endRun(t, ns, stack, "run-3")
	refused("a deleted pod's certificate", deleted)

	// A run never started (a forged or guessed run ID from a valid CA) is no better.
	refused("an unknown run's certificate", f.client(t, pki.RunnerIdentity(ns, stack, "run-99")))

	f.runs.startRun(t, ns, stack, "run-4")
	copied := f.client(t, pki.RunnerIdentity(ns, stack, "run-4"))
	if r := do(t, copied, http.MethodGet, url, nil); r.code != http.StatusOK {
		t.Fatalf("GET by the new current run: %d %s", r.code, r.body)
	}
	// Its pod deleted and created again under its name and labels, with a
	// copy of its TLS Secret: the Stack still names the run (its controller
	// stopped mid-run, say), but the certificate is bound to the first pod.
	f.runs.recreatePod(t, ns, stack, "run-4")
	refused("the current run's certificate from its pod created again", copied)
}

// The attack: a runner releases, or writes under, a lock it did not take
// — the controller's migration lock or another run's — using the lock ID
// (which it might learn from a 423 or guess). Both are refused, the lock
// stays, and no 423 a runner sees names the holder.
func TestRunnerMayReleaseOnlyItsOwnLock(t *testing.T) {
	f := newFixture(t, httpbackend.Options{})
	ns, stack := uniqueName("locks-"), "app"
	key := state.Key{Namespace: ns, Stack: stack, Workspace: "default"}
	url := httpbackend.Address(f.baseURL, key)
	ctrl := f.client(t, pki.ControllerIdentity)
	if r := do(t, ctrl, http.MethodPost, url, storetest.StateJSON("lin", 5, 0, 100)); r.code != http.StatusOK {
		t.Fatalf("seed: %d %s", r.code, r.body)
	}
	f.runs.startRun(t, ns, stack, "run-1")
	runner := f.client(t, pki.RunnerIdentity(ns, stack, "run-1"))

	migration := state.LockInfo{ID: "migrate-0123456789", Operation: migrate.LockOperation, Who: "terrace state migrate", Info: "copying to postgres", Created: time.Now().UTC()}
	if err := f.store.Lock(t.Context(), key, migration); err != nil {
		t.Fatal(err)
	}
	attempts := []struct {
		name   string
		method string
		url    string
		body   []byte
	}{
		{"UNLOCK with the holder's ID", httpbackend.MethodUnlock, url, lockBody(t, state.LockInfo{ID: migration.ID})},
		{"POST under the holder's ID", http.MethodPost, url + "?ID=" + migration.ID, storetest.StateJSON("lin", 6, 0, 100)},
		{"LOCK with the holder's ID", httpbackend.MethodLock, url, lockBody(t, state.LockInfo{ID: migration.ID})},
		{"LOCK with its own ID", httpbackend.MethodLock, url, lockBody(t, state.LockInfo{ID: "mine"})},
		{"POST without a lock ID", http.MethodPost, url, storetest.StateJSON("lin", 6, 0, 100)},
	}
	checkHeld := func(holder state.LockInfo) {
		t.Helper()
		for _, a := range attempts {
			r := do(t, runner, a.method, a.url, a.body)
			if r.code != http.StatusLocked {
				t.Fatalf("%s: %d %s, want 423", a.name, r.code, r.body)
			}
			for _, secret := range []string{holder.ID, holder.Who, holder.Info} {
				if secret != "" && bytes.Contains(r.body, []byte(secret)) {
					t.Fatalf("%s: the 423 discloses %q: %s", a.name, secret, r.body)
				}
			}
			held, err := f.store.GetLock(t.Context(), key)
			if err != nil || held == nil || held.ID != holder.ID {
				t.Fatalf("%s: lock is now %+v (%v), want %s still held", a.name, held, err, holder.ID)
			}
			if serial, lineage := stateOf(t, f, key); serial != 5 || lineage != "lin" {
				t.Fatalf("%s: state is now serial %d lineage %s", a.name, serial, lineage)
			}
		}
	}
	checkHeld(migration)
	if err := f.store.Unlock(t.Context(), key, migration.ID); err != nil {
		t.Fatal(err)
	}

	// A lock of run-1, taken through the server, then run-1 ends and run-2
	// starts: run-2 may not release or write under it, however it learnt the ID.
	old := state.LockInfo{ID: "lock-of-run-1", Operation: "OperationTypeApply", Who: "runner@run-1"}
	if r := do(t, runner, httpbackend.MethodLock, url, lockBody(t, old)); r.code != http.StatusOK {
		t.Fatalf("LOCK by run-1: %d %s", r.code, r.body)
	}
	f.runs.endRun(t, ns, stack, "run-1")
	f.runs.startRun(t, ns, stack, "run-2")
	runner = f.client(t, pki.RunnerIdentity(ns, stack, "run-2"))
	checkHeld(old)

	// Its own lock a runner may take, write under and release; the owner
	// is the server's word, not the body's.
	if err := f.store.ForceUnlock(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	own := state.LockInfo{ID: "lock-of-run-2", Owner: string(pki.ControllerIdentity)}
	if r := do(t, runner, httpbackend.MethodLock, url, lockBody(t, own)); r.code != http.StatusOK {
		t.Fatalf("LOCK by run-2: %d %s", r.code, r.body)
	}
	if held, err := f.store.GetLock(t.Context(), key); err != nil || held.Owner != string(pki.RunnerIdentity(ns, stack, "run-2")) {
		t.Fatalf("lock owner: %+v %v, want run-2's identity whatever the body said", held, err)
	}
	if r := do(t, runner, http.MethodPost, url+"?ID="+own.ID, storetest.StateJSON("lin", 6, 0, 100)); r.code != http.StatusOK {
		t.Fatalf("POST under its own lock: %d %s", r.code, r.body)
	}
	if r := do(t, runner, httpbackend.MethodUnlock, url, lockBody(t, own)); r.code != http.StatusOK {
		t.Fatalf("UNLOCK of its own lock: %d %s", r.code, r.body)
	}
	if held, err := f.store.GetLock(t.Context(), key); err != nil || held != nil {
		t.Fatalf("lock after its owner released it: %+v %v", held, err)
	}
}
