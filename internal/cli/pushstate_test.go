package cli

import (
	"context"
	"errors"
	"testing"

	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/secrets"
	"github.com/terrace-dev/terrace/internal/state/storetest"
)

// The state the controller kept after a failed save (in parts) becomes
// the current state under the failed run's lock, which is then released,
// and its records go; a state that does not follow the stored one, or a
// record that is not there, is refused with nothing changed.
func TestPushStateWritesTheKeptStateUnderTheFailedRunsLock(t *testing.T) {
	env, _ := apiServer(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	newStack(t, ns, "web", nil, readyAt(2))
	states := secrets.New(env.Client, secrets.Options{})
	key := state.Key{Namespace: ns, Stack: "web", Workspace: "default"}
	if _, err := states.Put(ctx, key, storetest.StateJSON("lineage-1", 4, 1, 64), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	runner := string(pki.RunnerIdentity(ns, "web", "run-9"))
	if err := states.Lock(ctx, key, state.LockInfo{ID: "tofu-lock", Operation: state.ApplyOperation, Owner: runner}); err != nil {
		t.Fatal(err)
	}
	keep := func(id string, data []byte) {
		t.Helper()
		half := len(data) / 2
		for i, part := range [][]byte{data[:half], data[half:]} {
			partID := id
			if i > 0 {
				partID = id + "-part-2"
			}
			if _, err := states.PutPlan(ctx, state.Plan{PlanMeta: state.PlanMeta{Key: state.PlanKey{Namespace: ns, Stack: "web", ID: partID}}, Binary: part}); err != nil {
				t.Fatal(err)
			}
		}
	}

	_, _, err := verb(t, "push-state", "web", "errored-state-plan-0", "-n", ns)
	mustFail(t, err, "no kept state errored-state-plan-0")

	keep("errored-state-plan-1", storetest.StateJSON("another-lineage", 5, 2, 64))
	_, _, err = verb(t, "push-state", "web", "errored-state-plan-1", "-n", ns)
	mustFail(t, err, "refused to write errored-state-plan-1")
	if cur, _ := states.Get(ctx, key); cur.Serial != 4 {
		t.Fatalf("a refused push changed the state to serial %d", cur.Serial)
	}

	kept := storetest.StateJSON("lineage-1", 5, 3, 64)
	keep("errored-state-plan-2", kept)
	out, _, err := verb(t, "push-state", "web", "errored-state-plan-2", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "push-state", out, "released the state lock the failed run left: lock tofu-lock", "is now serial 5", "terrace reconcile web")
	if cur, err := states.Get(ctx, key); err != nil || cur.Digest != state.Digest(kept) {
		t.Fatalf("current state %+v (%v), want the kept one", cur, err)
	}
	if held, _ := states.GetLock(ctx, key); held != nil {
		t.Fatalf("the failed run's lock %+v is still held", held)
	}
	for _, id := range []string{"errored-state-plan-2", "errored-state-plan-2-part-2"} {
		if _, err := states.GetPlan(ctx, state.PlanKey{Namespace: ns, Stack: "web", ID: id}); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("record %s is still kept (%v)", id, err)
		}
	}
}
