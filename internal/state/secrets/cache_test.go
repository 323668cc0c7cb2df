package secrets_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// countingClient counts the API calls a Store makes.
type countingClient struct {
	client.Client
	calls atomic.Int64
}

func (c *countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.calls.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.calls.Add(1)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.calls.Add(1)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.calls.Add(1)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *countingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.calls.Add(1)
	return c.Client.List(ctx, list, opts...)
}

// calls runs f and returns how many API calls it made.
func (c *countingClient) during(t *testing.T, what string, f func() error) int64 {
	t.Helper()
	before := c.calls.Load()
	if err := f(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c.calls.Load() - before
}

// The requests of one tofu run, as the state server makes them of the
// store, each cost one API call (a write; two for a state too large to
// keep in the index: its chunk and the index), where each used to read the
// index first, some twice.
func TestARunsStateRequestsCostOneCallEach(t *testing.T) {
	t.Run("a small state, kept in the index", func(t *testing.T) { runsStateRequests(t, 100, 1) })
	t.Run("a larger state, in a chunk", func(t *testing.T) { runsStateRequests(t, 8<<10, 2) })
}

// runsStateRequests makes one run's state requests with a state of
// payload bytes, whose put must cost putCalls API calls.
func runsStateRequests(t *testing.T, payload int, putCalls int64) {
	ns := env.Namespace(t)
	c := &countingClient{Client: env.Client}
	s := secrets.New(c, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	owner := "terrace://runner/" + ns + "/app/run-1"
	lock := state.LockInfo{ID: "lock-1", Operation: "OperationTypeApply", Owner: owner}
	lockID := state.OwnedLockID(owner, lock.ID)
	admitted := int64(-1)
	get := func() error {
		_, err := s.GetAdmitted(ctx(t), key, func(m state.StateMeta) error { admitted = m.Size; return nil })
		if errors.Is(err, state.ErrNotFound) {
			return nil
		}
		return err
	}
	data := storetest.StateJSON("lin", 1, 0, payload)
	steps := []struct {
		what string
		want int64
		do   func() error
	}{
		{"read of a state that does not exist yet", 1, get},
		{"lock of a new state", 1, func() error { return s.Lock(ctx(t), key, lock) }},
		{"put", putCalls, func() error {
			_, err := s.Put(ctx(t), key, data, state.PutOptions{LockID: lockID})
			return err
		}},
		{"read of the state just written", 1, get},
		{"unlock", 1, func() error { return s.Unlock(ctx(t), key, lockID) }},
		{"lock again", 1, func() error { return s.Lock(ctx(t), key, lock) }},
		{"unlock again", 1, func() error { return s.Unlock(ctx(t), key, lockID) }},
	}
	for _, st := range steps {
		if got := c.during(t, st.what, st.do); got != st.want {
			t.Errorf("%s made %d API calls, want %d", st.what, got, st.want)
		}
	}
	if admitted != int64(len(data)) {
		t.Fatalf("admitted %d bytes, want the state's %d", admitted, len(data))
	}
	got, err := secrets.New(env.Client, secrets.Options{}).Get(ctx(t), key)
	if err != nil || !bytes.Equal(got.Data, data) {
		t.Fatalf("the state as another replica reads it: %v", err)
	}
}

// Two replicas serve the same state: each one's copy of the index goes
// stale when the other writes, and nothing is decided on a stale copy.
func TestReplicasWithStaleCopiesStayCorrect(t *testing.T) {
	ns := env.Namespace(t)
	a := secrets.New(env.Client, secrets.Options{})
	b := secrets.New(env.Client, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	first := state.LockInfo{ID: "first", Owner: "o1"}
	if err := a.Lock(ctx(t), key, first); err != nil {
		t.Fatal(err)
	}
	// A still holds "locked by first"; B releases it and writes twice.
	if err := b.ForceUnlock(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	for serial := int64(1); serial <= 2; serial++ {
		if _, err := b.Put(ctx(t), key, storetest.StateJSON("lin", serial, 0, 100), state.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A lock refused on A's copy is decided on a fresh read: it is free.
	second := state.LockInfo{ID: "second", Owner: "o2"}
	if err := a.Lock(ctx(t), key, second); err != nil {
		t.Fatalf("lock on a replica whose copy says locked, after another released it: %v", err)
	}
	// Re-locking with the first lock's ID, which A's copy no longer
	// holds either way, is refused: the second lock is held.
	var locked *state.LockedError
	if err := b.Lock(ctx(t), key, first); !errors.As(err, &locked) {
		t.Fatalf("lock while another is held: %v, want a LockedError", err)
	}
	// B writes under the second lock from its stale copy (its own lock
	// attempt read afresh, so write through A's replica first).
	under := state.PutOptions{LockID: state.OwnedLockID("o2", "second")}
	if _, err := b.Put(ctx(t), key, storetest.StateJSON("lin", 3, 0, 100), under); err != nil {
		t.Fatal(err)
	}
	// A's copy is at version 2: its put takes version 4, after B's, not 3.
	meta, err := a.Put(ctx(t), key, storetest.StateJSON("lin", 5, 0, 100), under)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Version != 4 {
		t.Fatalf("put on a stale copy got version %d, want 4", meta.Version)
	}
	// B's copy says serial 3, which serial 4 would follow; the state is at 5.
	var conflict *state.ConflictError
	if _, err := b.Put(ctx(t), key, storetest.StateJSON("lin", 4, 0, 200), under); !errors.As(err, &conflict) || conflict.Reason != state.ConflictSerial {
		t.Fatalf("put of serial 4 over serial 5 from a copy that says 3: %v, want a serial ConflictError", err)
	}
	// Unlocking under the lock's ID but as another owner is refused.
	if err := b.Unlock(ctx(t), key, state.OwnedLockID("o1", "second")); !errors.As(err, &locked) {
		t.Fatalf("unlock by another owner: %v, want a LockedError", err)
	}
	if err := b.Unlock(ctx(t), key, state.OwnedLockID("o2", "second")); err != nil {
		t.Fatal(err)
	}
	if held, err := a.GetLock(ctx(t), key); err != nil || held != nil {
		t.Fatalf("lock after unlock, as the other replica reads it: %+v %v", held, err)
	}
	// The index was deleted and made anew behind A's back: A's copy
	// names an object that is gone, and the change is tried on what is there.
	if err := b.Delete(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx(t), key, storetest.StateJSON("new", 1, 0, 100), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(ctx(t), key, first); err != nil {
		t.Fatalf("lock on a copy of a deleted index: %v", err)
	}
	if got, err := a.Get(ctx(t), key); err != nil || got.Lineage != "new" || got.Version != 1 {
		t.Fatalf("read after the index was made anew: %+v %v", got, err)
	}
}

// Replicas racing to lock one state: exactly one wins each round.
func TestConcurrentLocksOnReplicasHaveOneWinner(t *testing.T) {
	ns := env.Namespace(t)
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	replicas := []*secrets.Store{secrets.New(env.Client, secrets.Options{}), secrets.New(env.Client, secrets.Options{}), secrets.New(env.Client, secrets.Options{})}
	for round := range 5 {
		var wins atomic.Int64
		var wg sync.WaitGroup
		for i, s := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.Lock(ctx(t), key, state.LockInfo{ID: fmt.Sprintf("r%d-%d", round, i)})
				var locked *state.LockedError
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.As(err, &locked):
					t.Errorf("round %d replica %d: %v", round, i, err)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("round %d: %d replicas took the lock, want 1", round, wins.Load())
		}
		// Each round releases through a replica whose copy may be stale.
		if err := replicas[round%len(replicas)].ForceUnlock(ctx(t), key); err != nil {
			t.Fatal(err)
		}
	}
}

// A run's read just after it took the lock on this replica is served from
// the copy the lock left: no API call for the index. Anyone else's read,
// or a read once another change replaced that copy, reads the index.
func TestTheLockHoldersReadComesFromTheLocksCopy(t *testing.T) {
	ns := env.Namespace(t)
	c := &countingClient{Client: env.Client}
	s := secrets.New(c, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	owner := "terrace://runner/" + ns + "/app/run-1"
	data := storetest.StateJSON("lin", 1, 0, 100)
	if _, err := s.Put(ctx(t), key, data, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// A plan's lock leaves a copy that does not answer: a run may plan
	// under one lock and apply under another, taken on another replica.
	if err := s.Lock(ctx(t), key, state.LockInfo{ID: "plan", Owner: owner, Operation: "OperationTypePlan"}); err != nil {
		t.Fatal(err)
	}
	if calls := c.during(t, "a read under the plan's lock", func() error {
		_, err := state.GetAdmittedBy(ctx(t), s, key, owner, func(state.StateMeta) error { return nil })
		return err
	}); calls != 1 {
		t.Errorf("a read under a plan lock made %d API calls, want 1 (the index)", calls)
	}
	if err := s.Unlock(ctx(t), key, state.OwnedLockID(owner, "plan")); err != nil {
		t.Fatal(err)
	}
	if err := s.Lock(ctx(t), key, state.LockInfo{ID: "l1", Owner: owner, Operation: state.ApplyOperation}); err != nil {
		t.Fatal(err)
	}
	admits := 0
	admit := func(m state.StateMeta) error { admits++; return nil }
	var got *state.State
	if calls := c.during(t, "the holder's read", func() error {
		var err error
		got, err = state.GetAdmittedBy(ctx(t), s, key, owner, admit)
		return err
	}); calls != 0 || !bytes.Equal(got.Data, data) || admits != 1 {
		t.Fatalf("holder's read: %d API calls (want 0), %d admits, %d bytes", calls, admits, len(got.Data))
	}
	if calls := c.during(t, "another run's read", func() error {
		_, err := state.GetAdmittedBy(ctx(t), s, key, "terrace://runner/"+ns+"/app/run-2", admit)
		return err
	}); calls != 1 {
		t.Errorf("another run's read made %d API calls, want 1 (the index)", calls)
	}
	// That read found the index unchanged: the copy still answers.
	if calls := c.during(t, "the holder's second read", func() error {
		_, err := state.GetAdmittedBy(ctx(t), s, key, owner, admit)
		return err
	}); calls != 0 {
		t.Errorf("holder's second read made %d API calls, want 0", calls)
	}
	// Another replica breaks the lock; once this one has read the change,
	// its copy no longer answers for the holder.
	if err := secrets.New(env.Client, secrets.Options{}).ForceUnlock(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	if calls := c.during(t, "the holder's read after its lock was broken", func() error {
		_, err := state.GetAdmittedBy(ctx(t), s, key, owner, admit)
		return err
	}); calls != 1 {
		t.Errorf("holder's read after the lock was broken made %d API calls, want 1", calls)
	}
	// A lock on a state that does not exist yet: the holder reads none.
	empty := state.Key{Namespace: ns, Stack: "new", Workspace: "default"}
	if err := s.Lock(ctx(t), empty, state.LockInfo{ID: "l2", Owner: owner, Operation: state.ApplyOperation}); err != nil {
		t.Fatal(err)
	}
	if calls := c.during(t, "the holder's read of a new state", func() error {
		_, err := state.GetAdmittedBy(ctx(t), s, empty, owner, admit)
		if errors.Is(err, state.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("read of a state that does not exist: %v, want not found", err)
	}); calls != 0 {
		t.Errorf("holder's read of a new state made %d API calls, want 0", calls)
	}
}

// The controller reads the state a run left from the copy that releasing
// the run's apply lock left on this replica, with no API call. Found by
// the chaos smoke: with the copy any release left, a run that planned
// under a lock released here and applied through another replica got the
// state from before its apply (its release record one serial behind).
func TestTheStateARunLeftIsReadFromItsApplyReleasesCopy(t *testing.T) {
	ns := env.Namespace(t)
	c := &countingClient{Client: env.Client}
	a := secrets.New(c, secrets.Options{})
	b := secrets.New(env.Client, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "app", Workspace: "default"}
	owner := "terrace://runner/" + ns + "/app/run-1"
	cycle := func(s *secrets.Store, op, id string, data []byte) {
		t.Helper()
		if err := s.Lock(ctx(t), key, state.LockInfo{ID: id, Owner: owner, Operation: op}); err != nil {
			t.Fatal(err)
		}
		if data != nil {
			if _, err := s.Put(ctx(t), key, data, state.PutOptions{LockID: state.OwnedLockID(owner, id)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Unlock(ctx(t), key, state.OwnedLockID(owner, id)); err != nil {
			t.Fatal(err)
		}
	}
	after := func(what string, wantCalls, wantSerial int64) {
		t.Helper()
		var st *state.State
		calls := c.during(t, what, func() error {
			var err error
			st, err = state.StateAfterApply(ctx(t), a, key, owner)
			return err
		})
		if calls != wantCalls || st.Serial != wantSerial {
			t.Errorf("%s: %d API calls (want %d), serial %d (want %d)", what, calls, wantCalls, st.Serial, wantSerial)
		}
	}
	if _, err := a.Put(ctx(t), key, storetest.StateJSON("lin", 1, 0, 100), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// Planned under a lock taken and released here, applied through B.
	cycle(a, "OperationTypePlan", "plan", nil)
	cycle(b, state.ApplyOperation, "apply", storetest.StateJSON("lin", 2, 0, 100))
	after("the state after an apply released on another replica", 1, 2) // the index, which holds the small state B wrote
	// Applied here: the release's copy answers.
	owner = "terrace://runner/" + ns + "/app/run-2"
	cycle(a, state.ApplyOperation, "apply-2", storetest.StateJSON("lin", 3, 0, 100))
	after("the state after an apply released here", 0, 3)
	// Another run's release does not answer for this one.
	owner = "terrace://runner/" + ns + "/app/run-3"
	after("the state after another run's apply", 1, 3)
}
