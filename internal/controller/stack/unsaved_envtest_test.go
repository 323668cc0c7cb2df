package stack

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/backend"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
	"github.com/terrace-dev/terrace/internal/tf"
)

// stateServerFaults is the suite state server's store: the real one, but
// for the Stacks a scenario names, whose state uploads fail as a database
// that does not answer makes them fail, and so do the lock releases after
// a failed upload, until the next lock is taken. The controller's own
// store calls do not pass here.
type stateServerFaults struct {
	*backend.Router
	mu sync.Mutex
	// refused counts, per namespace/stack, the writes refused so far; a
	// Stack is present while armed.
	refused map[string]*refusals
	// ended keeps what was refused of a Stack whose outage ended.
	ended map[string]refusals
}

type refusals struct{ uploads, unlocks int }

var errDatabaseGone = errors.New("the database does not answer (test)")

// refuseUploadsUntilNextLock arms the fault for namespace/stack.
func (f *stateServerFaults) refuseUploadsUntilNextLock(namespace, stack string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused == nil {
		f.refused = map[string]*refusals{}
	}
	f.refused[namespace+"/"+stack] = &refusals{}
}

// outageEnded says whether the outage of namespace/stack refused an
// upload and a lock release, and ended.
func (f *stateServerFaults) outageEnded(namespace, stack string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ended := f.ended[namespace+"/"+stack]
	return ended && r.uploads > 0 && r.unlocks > 0
}

// refusedWrites is what was refused of namespace/stack so far.
func (f *stateServerFaults) refusedWrites(namespace, stack string) refusals {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.refused[namespace+"/"+stack]; r != nil {
		return *r
	}
	return f.ended[namespace+"/"+stack]
}

func (f *stateServerFaults) Put(ctx context.Context, key state.Key, data []byte, opts state.PutOptions) (state.StateMeta, error) {
	f.mu.Lock()
	r := f.refused[key.Namespace+"/"+key.Stack]
	if r != nil {
		r.uploads++
	}
	f.mu.Unlock()
	if r != nil {
		return state.StateMeta{}, errDatabaseGone
	}
	return f.Router.Put(ctx, key, data, opts)
}

func (f *stateServerFaults) Unlock(ctx context.Context, key state.Key, id string) error {
	f.mu.Lock()
	r := f.refused[key.Namespace+"/"+key.Stack]
	refuse := r != nil && r.uploads > 0
	if refuse {
		r.unlocks++
	}
	f.mu.Unlock()
	if refuse {
		return errDatabaseGone
	}
	return f.Router.Unlock(ctx, key, id)
}

// Lock ends the outage once an upload was refused: the next run's lock
// finds the database back.
func (f *stateServerFaults) Lock(ctx context.Context, key state.Key, info state.LockInfo) error {
	f.mu.Lock()
	k := key.Namespace + "/" + key.Stack
	if r := f.refused[k]; r != nil && r.uploads > 0 {
		if f.ended == nil {
			f.ended = map[string]refusals{}
		}
		f.ended[k] = *r
		delete(f.refused, k)
	}
	f.mu.Unlock()
	return f.Router.Lock(ctx, key, info)
}

// replacedModule replaces its resource whenever generation changes.
const replacedModule = `
variable "generation" { type = number }
resource "terraform_data" "replaced" {
  triggers_replace = var.generation
}
`

// terraformDataID is the id of a one-resource module's terraform_data in
// a state: a new one each time tofu creates (or replaces) it.
func terraformDataID(t *testing.T, st *state.State) string {
	t.Helper()
	var doc struct {
		Resources []struct {
			Instances []struct {
				Attributes struct {
					ID string `json:"id"`
				} `json:"attributes"`
			} `json:"instances"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(st.Data, &doc); err != nil || len(doc.Resources) != 1 || len(doc.Resources[0].Instances) != 1 {
		t.Fatalf("state serial %d: want one terraform_data instance (%v)", st.Serial, err)
	}
	return doc.Resources[0].Instances[0].Attributes.ID
}

// An apply whose state upload gets no answer for all of tofu's retries,
// after it replaced the resource: tofu leaves the state in the runner,
// the controller writes it to the store under the run's lock (whose
// release got no answer either), releases that lock, and plans again
// from it. Before, that state went with the runner pod, and the next run
// planned from the old state and replaced the resource a second time.
func TestEnvtestStateTofuCouldNotUploadIsSavedByTheController(t *testing.T) {
	e := newSuiteEnv(t)
	e.stack("flaky", replacedModule, nil, func(st *terracev1.Stack) {
		st.Spec.ApprovePlan = terracev1.ApprovePlanAuto
		st.Spec.Vars = map[string]apiextensionsv1.JSON{"generation": pad(1)}
	})
	e.waitFor("flaky", "Ready", readyAt)
	before := e.currentState("flaky")
	firstID := terraformDataID(t, before)

	suite.stateFaults.refuseUploadsUntilNextLock(e.ns, "flaky")
	e.update("flaky", func(st *terracev1.Stack) { st.Spec.Vars["generation"] = pad(2) })
	deadline := time.Now().Add(2 * time.Minute)
	for !suite.stateFaults.outageEnded(e.ns, "flaky") {
		if time.Now().After(deadline) {
			t.Fatalf("refused %+v: the upload and the lock release were to fail, then the next lock to end it", suite.stateFaults.refusedWrites(e.ns, "flaky"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	final := e.waitFor("flaky", "Ready after the outage", readyAt)
	if id := terraformDataID(t, e.currentState("flaky")); id == firstID {
		t.Fatalf("terraform_data is still %s: the apply's replacement is not in the state", id)
	}
	e.expectEvents("flaky", StateSavedByControllerReason)
	store, _ := suiteStores()
	if held, err := store.GetLock(context.Background(), stateKey(final)); err != nil || held != nil {
		t.Fatalf("lock %+v (%v) left after the run", held, err)
	}
	// One replacement in all: the failed apply's, recorded as such; the
	// run after it planned from the saved state and changed nothing.
	var failed, replaced int
	for _, rel := range e.releases("flaky")[1:] {
		if rel.Status == release.StatusFailed && strings.Contains(rel.Message, "the controller saved it") {
			failed++
		}
		if rel.Plan.Add > 0 {
			replaced++
		}
	}
	if failed != 1 || replaced != 1 {
		t.Fatalf("releases %+v: want the failed apply recorded once, and one replacement in all", e.releases("flaky"))
	}
}

// runOfWeb is the scope of run runID of a Stack "web" (not created) in
// e's namespace, with the suite's Secrets store as its state store.
func runOfWeb(e *suiteEnv, runID string) (*scope, *secrets.Store) {
	store, _ := suiteStores()
	stack := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: e.ns}}
	stack.Spec.Workspace = state.DefaultWorkspace
	return &scope{stack: stack, log: logr.Discard(), run: &runScope{id: runID, stores: &storeSet{States: store}}}, store
}

// writeUnsavedState writes under the run's own lock and releases it, does
// not write a state already stored, and writes nothing over the lock of
// anyone else.
func TestEnvtestTheControllerSavesTheStateOnlyUnderTheRunsOwnLock(t *testing.T) {
	e := newSuiteEnv(t)
	ctx := context.Background()
	s, store := runOfWeb(e, "run-2")
	key := stateKey(s.stack)
	r := &Reconciler{}
	runOwner := string(pki.RunnerIdentity(e.ns, "web", "run-2"))
	lock := func(id, owner string) {
		t.Helper()
		if err := store.Lock(ctx, key, state.LockInfo{ID: id, Operation: state.ApplyOperation, Owner: owner}); err != nil {
			t.Fatal(err)
		}
	}

	// The run's lock, its release unanswered: written under it, released.
	lock("tofu-lock", runOwner)
	first := storetest.StateJSON("l", 2, 1, 64)
	if err := r.writeUnsavedState(ctx, s, first); err != nil {
		t.Fatal(err)
	}
	if held, _ := store.GetLock(ctx, key); held != nil {
		t.Fatalf("the run's lock %+v is still held", held)
	}
	saved, err := store.Get(ctx, key)
	if err != nil || saved.Digest != state.Digest(first) {
		t.Fatalf("stored %+v (%v), want the state tofu left", saved, err)
	}

	// Saved already (only the answer to the upload was lost): not again.
	lock("tofu-lock-2", runOwner)
	if err := r.writeUnsavedState(ctx, s, first); err != nil {
		t.Fatal(err)
	}
	if again, _ := store.Get(ctx, key); again.Version != saved.Version {
		t.Fatalf("version %d → %d: the stored state was written again", saved.Version, again.Version)
	}

	// Another run's lock, or the operator's: nothing written, lock kept.
	lock("someone-else", string(pki.RunnerIdentity(e.ns, "web", "run-3")))
	var locked *state.LockedError
	if err := r.writeUnsavedState(ctx, s, storetest.StateJSON("l", 3, 2, 64)); !errors.As(err, &locked) {
		t.Fatalf("err %v, want a LockedError", err)
	}
	if held, _ := store.GetLock(ctx, key); held == nil || held.ID != "someone-else" {
		t.Fatalf("lock %+v, want the other holder's kept", held)
	}
	if now, _ := store.Get(ctx, key); now.Version != saved.Version {
		t.Fatal("written over another holder's lock")
	}
}

// A Stack whose apply left a state kept in its plan store
// (StateNotSaved) does not run while the lock of that run is held, even
// after that run settled: a run now would release the lock as a dead
// run's and plan from a state that misses the apply's changes. Once the
// lock is gone (`terrace push-state`, or `terrace force-unlock`), it runs;
// a lock of this Stack's run without a kept state is a dead run's. What
// decides is the lock and the kept state, never a condition.
func TestEnvtestAStackWhoseStateIsKeptWaitsForThePush(t *testing.T) {
	e := newSuiteEnv(t)
	ctx := context.Background()
	s, store := runOfWeb(e, "run-2")
	s.run.stores.Plans = store
	stack := s.stack
	stack.Status.CurrentRun = "run-1"
	stack.Status.Plan = &terracev1.PlanStatus{ID: "plan-1-abc"}
	key := stateKey(stack)
	r := &Reconciler{Runs: suite.runs}
	lock := state.LockInfo{ID: "tofu-lock", Operation: state.ApplyOperation, Owner: string(pki.RunnerIdentity(e.ns, "web", "run-1"))}
	if err := store.Lock(ctx, key, lock); err != nil {
		t.Fatal(err)
	}
	recoverThenDecide := func() State {
		t.Helper()
		s.run.facts = runFacts{kind: runPlan, announced: true, recoverFirst: true}
		if err := r.recoverDeadRun(ctx, s); err != nil {
			t.Fatal(err)
		}
		return determineRunState(&s.run.facts)
	}

	// A lock of this Stack's run, no state kept: a dead run's.
	if got := recoverThenDecide(); got != StateDeadRunLock {
		t.Fatalf("without a kept state: %s, want %s", got, StateDeadRunLock)
	}

	kept := state.Plan{PlanMeta: state.PlanMeta{Key: planKey(stack, tf.ErroredStateID("plan-1-abc"))}, Binary: []byte("{}")}
	if _, err := store.PutPlan(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if got := recoverThenDecide(); got != StateHeld {
		t.Fatalf("with the state kept: %s, want %s", got, StateHeld)
	}
	var terminal *outcome.TerminalError
	if err := actionFor(StateHeld).do(r, ctx, s); !errors.As(err, &terminal) || terminal.Reason != StateNotSavedReason || !strings.Contains(err.Error(), "terrace push-state") {
		t.Fatalf("err %v, want StateNotSaved naming terrace push-state", err)
	}
	if held, _ := store.GetLock(ctx, key); held == nil {
		t.Fatal("the kept state's lock was released")
	}

	if err := store.Unlock(ctx, key, state.OwnedLockID(lock.Owner, lock.ID)); err != nil {
		t.Fatal(err)
	}
	if got := recoverThenDecide(); got != StateRunnerStarting {
		t.Fatalf("after the push: %s, want the run to go on (%s)", got, StateRunnerStarting)
	}
}
