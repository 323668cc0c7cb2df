package stack

import (
	"context"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/state"
)

// A Stack that never ran has no dead run to recover from, so its first run
// reads no lock; it may have a pod of a run whose announcement never
// landed, swept from the cache at its first run in this process. One that
// ran here and settled has neither; one whose last run did not settle, or
// that this process has not run yet, may have both. Either holds until a
// run has dealt with it: one that failed first leaves it to the next.
func TestOnlyAStackThatRanMayHaveADeadRun(t *testing.T) {
	r := &Reconciler{}
	stack := func(name, currentRun string, reconciling bool) *scope {
		st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"}}
		st.Status.CurrentRun = currentRun
		if reconciling {
			reconcile.MarkReconciling(st, ProgressingReason, "planning")
		}
		return &scope{stack: st}
	}
	check := func(what string, s *scope, wantRecover, wantSweep bool) {
		t.Helper()
		if recover, sweep := r.mayHaveDeadRun(s); recover != wantRecover || sweep != wantSweep {
			t.Errorf("%s: recover %v, sweep %v; want %v, %v", what, recover, sweep, wantRecover, wantSweep)
		}
	}
	check("a Stack that never ran, first seen", stack("new", "", false), false, true)
	check("a Stack that never ran, its first run failed before the sweep", stack("new", "", false), false, true)
	r.cleanedUpHere(stack("new", "", false))
	check("a Stack that never ran, swept", stack("new", "", false), false, false)
	check("a Stack this process has not run yet", stack("ran", "run-1", false), true, false)
	check("a Stack whose first run here failed before recovering", stack("ran", "run-1", false), true, false)
	r.cleanedUpHere(stack("ran", "run-1", false))
	check("a Stack that ran here and settled", stack("ran", "run-1", false), false, false)
	check("a Stack whose last run did not settle", stack("ran", "run-2", true), true, false)
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
