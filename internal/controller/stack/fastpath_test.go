package stack

import (
	"context"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state"
)

// A Stack that never ran has no dead run to recover from, so its first run
// reads no lock; it may have a pod of a run whose announcement never
// landed, swept at its first run in this process. A Stack whose current
// run this process closed after an outcome that was neither a transient
// failure nor a failed apply has nothing to recover; any other current
// run may have left a pod or a lock: after a restart (this process closed
// nothing), after a transient failure, or after a failed apply (whose
// unsaved state may hold the lock). Conditions play no part.
func TestOnlyAStackThatRanMayHaveADeadRun(t *testing.T) {
	r := &Reconciler{}
	stack := func(name, currentRun string, mutate func(*terracev1.StackStatus)) *scope {
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"}}
		st.Status.CurrentRun = currentRun
		if mutate != nil {
			mutate(&st.Status)
		}
		return &scope{stack: st}
	}
	check := func(what string, s *scope, wantRecover, wantSweep bool) {
		t.Helper()
		if recover, sweep := r.mayHaveDeadRun(s); recover != wantRecover || sweep != wantSweep {
			t.Errorf("%s: recover %v, sweep %v; want %v, %v", what, recover, sweep, wantRecover, wantSweep)
		}
	}
	check("a Stack that never ran, first seen", stack("new", "", nil), false, true)
	check("a Stack that never ran, its first run failed before the sweep", stack("new", "", nil), false, true)
	r.cleanedUpHere(stack("new", "", nil))
	check("a Stack that never ran, swept", stack("new", "", nil), false, false)
	check("a Stack this process has not run yet", stack("ran", "run-1", nil), true, false)
	r.closedHere.Store(client.ObjectKey{Namespace: "team", Name: "ran"}, "run-1")
	check("a Stack whose run this process closed", stack("ran", "run-1", nil), false, false)
	check("a Stack whose closed run failed transiently", stack("ran", "run-1", func(st *terracev1.StackStatus) { st.Failures = 1 }), true, false)
	check("a Stack whose closed run's apply failed", stack("ran", "run-1", func(st *terracev1.StackStatus) {
		st.Release = &terracev1.ReleaseStatus{Revision: 2, Status: "failed"}
	}), true, false)
	check("a Stack whose current run is another", stack("ran", "run-2", nil), true, false)
}

// countingStates counts reads of the state.
type countingStates struct {
	state.Store
	gets atomic.Int64
}

func (c *countingStates) Get(context.Context, state.Key) (*state.State, error) {
	c.gets.Add(1)
	return &state.State{StateMeta: state.StateMeta{Serial: 7}, Data: []byte(`{"version":4,"serial":7,"lineage":"l","outputs":{},"resources":[]}`)}, nil
}

// After a run, the release record's serial and the inventory come from one
// read of the state; an apply makes the next read fresh.
func TestOneReadOfTheStateAfterARun(t *testing.T) {
	states := &countingStates{}
	s := &scope{stack: &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "team"}},
		run: &runScope{stores: &storeSet{States: states}}}
	r := &Reconciler{}
	ctx := context.Background()
	if serial, found, err := currentStateSerial(ctx, s); err != nil || !found || serial != 7 {
		t.Fatalf("serial = %d, %v, %v", serial, found, err)
	}
	if err := r.recordInventory(ctx, s); err != nil {
		t.Fatal(err)
	}
	if n := states.gets.Load(); n != 1 {
		t.Fatalf("%d reads of the state after the run, want 1", n)
	}
	if s.observed.inventory == nil {
		t.Fatal("no inventory recorded from the read")
	}
	s.run.after = nil // what afterApply does
	if _, _, err := currentStateSerial(ctx, s); err != nil || states.gets.Load() != 2 {
		t.Fatalf("after an apply the state was not read again (%d reads, %v)", states.gets.Load(), err)
	}
}
