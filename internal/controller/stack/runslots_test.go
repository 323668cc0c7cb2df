package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// slotOp is one step of a run slot scenario: a Stack ("namespace/name")
// asks for a slot or frees its slot, after the clock moved on by wait.
type slotOp struct {
	wait time.Duration
	// acquire or release names the Stack.
	acquire, release string
	// granted: acquire's answer.
	granted bool
	// woken: the Stacks a slot was reserved for by this step, in order.
	woken []string
}

func slotKey(s string) types.NamespacedName {
	ns, name, _ := strings.Cut(s, "/")
	return types.NamespacedName{Namespace: ns, Name: name}
}

func TestRunSlots(t *testing.T) {
	ask := func(key string, granted bool, woken ...string) slotOp {
		return slotOp{acquire: key, granted: granted, woken: woken}
	}
	free := func(key string, woken ...string) slotOp { return slotOp{release: key, woken: woken} }
	later := func(d time.Duration, op slotOp) slotOp { op.wait = d; return op }
	cases := []struct {
		name                string
		total, perNamespace int
		ops                 []slotOp
	}{{
		name: "four endless runs of one namespace leave a slot for another", total: 4, perNamespace: 3,
		ops: []slotOp{
			ask("attacker/1", true), ask("attacker/2", true), ask("attacker/3", true),
			ask("attacker/4", false), // its namespace is at its cap, though a slot is free
			ask("victim/1", true),
		},
	}, {
		name: "a queued run gets the slot its namespace frees, woken at once", total: 4, perNamespace: 3,
		ops: []slotOp{
			ask("attacker/1", true), ask("attacker/2", true), ask("attacker/3", true), ask("attacker/4", false),
			free("attacker/2", "attacker/4"),
			ask("attacker/4", true),
			ask("attacker/2", false), // its retry queues in turn
		},
	}, {
		name: "freed slots go to the namespaces in turn, not by arrival", total: 2, perNamespace: 2,
		ops: []slotOp{
			ask("x/1", true), ask("x/2", true),
			ask("many/1", false), ask("many/2", false), ask("many/3", false), // first to arrive
			ask("one/1", false), ask("other/1", false),
			free("x/1", "many/1"), free("x/2", "one/1"),
			ask("many/1", true), ask("one/1", true),
			free("many/1", "other/1"), free("one/1", "many/2"),
			ask("other/1", true), ask("many/2", true),
			free("other/1", "many/3"),
		},
	}, {
		name: "a slot that frees for a waiter is not taken by a newcomer", total: 1, perNamespace: 1,
		ops: []slotOp{
			ask("x/1", true), ask("waiter/1", false),
			free("x/1", "waiter/1"),
			ask("newcomer/1", false),
			ask("waiter/1", true),
		},
	}, {
		name: "a reservation nobody takes goes to the next waiter", total: 1, perNamespace: 1,
		ops: []slotOp{
			ask("x/1", true), ask("gone/1", false), ask("b/1", false),
			free("x/1", "gone/1"),
			later(10*time.Second, ask("b/1", false)),
			later(10*time.Second, ask("b/1", false)),
			later(11*time.Second, ask("b/1", true, "b/1")), // gone/1's reservation lapsed (30 s)
		},
	}, {
		name: "a waiter that stops asking leaves the queue", total: 1, perNamespace: 1,
		ops: []slotOp{
			ask("x/1", true), ask("gone/1", false), ask("b/1", false),
			later(20*time.Second, ask("b/1", false)),
			later(20*time.Second, ask("b/1", false)), // gone/1 last asked 40 s ago
			free("x/1", "b/1"),
		},
	}, {
		name: "a namespace at its cap is passed over, its reservations counted", total: 3, perNamespace: 1,
		ops: []slotOp{
			ask("x/1", true), ask("y/1", true), ask("x/2", false), ask("y/2", false),
			free("x/1", "x/2"), // y is at its cap: the third slot stays free
			ask("z/1", true),
			ask("x/3", false), // x/2's reservation counts against x
		},
	}, {
		name: "a Stack that holds its slot keeps it", total: 2, perNamespace: 1,
		ops: []slotOp{
			ask("a/1", true), ask("a/1", true), ask("b/1", true), ask("c/1", false),
			free("a/1", "c/1"), free("a/1"), free("never/1"),
		},
	}, {
		name: "one slot: namespaces take turns", total: 1, perNamespace: 1,
		ops: []slotOp{
			ask("a/1", true), ask("a/2", false), ask("b/1", false),
			free("a/1", "a/2"), ask("a/2", true), ask("a/1", false),
			free("a/2", "b/1"), ask("b/1", true),
			free("b/1", "a/1"),
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newRunSlots(tc.total, tc.perNamespace, slotReservationTTL, queuedWaiterTTL)
			now := time.Unix(1_700_000_000, 0)
			for i, op := range tc.ops {
				now = now.Add(op.wait)
				var woken []types.NamespacedName
				if op.acquire != "" {
					var ans slotAnswer
					ans, woken = q.acquire(slotKey(op.acquire), now)
					if ans.granted != op.granted {
						t.Fatalf("step %d: %s granted=%v, want %v (holders %v, reserved %v, waiting %v)", i, op.acquire, ans.granted, op.granted, q.holders, q.reserved, q.waiting)
					}
				} else {
					woken = q.release(slotKey(op.release), now)
				}
				var got []string
				for _, k := range woken {
					got = append(got, k.String())
				}
				if !slices.Equal(got, op.woken) {
					t.Fatalf("step %d: woke %v, want %v", i, got, op.woken)
				}
				if in := q.inUse(); in > tc.total {
					t.Fatalf("step %d: %d slots in use, more than %d", i, in, tc.total)
				}
			}
		})
	}
}

func TestDefaultRunsPerNamespace(t *testing.T) {
	for total, want := range map[int]int{1: 1, 2: 1, 4: 3, 8: 7} {
		if got := defaultRunsPerNamespace(total); got != want {
			t.Errorf("defaultRunsPerNamespace(%d) = %d, want %d", total, got, want)
		}
	}
}

// The queued run's message names the limit that holds it and the flag
// that sets it, and not its place in the queue: the same words for every
// Stack queued behind one limit, so a recheck rewrites no status.
func TestQueuedRunMessageNamesTheLimit(t *testing.T) {
	q := newRunSlots(4, 3, slotReservationTTL, queuedWaiterTTL)
	now := time.Now()
	for _, k := range []string{"a/1", "a/2", "a/3"} {
		q.acquire(slotKey(k), now)
	}
	first, _ := q.acquire(slotKey("a/4"), now)
	ans, _ := q.acquire(slotKey("a/5"), now)
	if msg := ans.message("a"); !strings.Contains(msg, "namespace a already has 3 runs") || !strings.Contains(msg, "--max-runs-per-namespace=3") {
		t.Errorf("namespace at its cap: %q", msg)
	}
	if ans.ahead != 1 || first.ahead != 0 {
		t.Errorf("places in the queue: %d and %d, want 0 and 1", first.ahead, ans.ahead)
	}
	if first.message("a") != ans.message("a") {
		t.Errorf("two Stacks queued behind the same limit read differently:\n%q\n%q", first.message("a"), ans.message("a"))
	}
	q.acquire(slotKey("b/1"), now)
	ans, _ = q.acquire(slotKey("c/1"), now)
	if msg := ans.message("c"); !strings.Contains(msg, "all 4 run slots are taken (--max-concurrent-runs=4)") {
		t.Errorf("all slots taken: %q", msg)
	}
}

// After a run that went on off the workers, the next reconcile of its
// Stack returns the run's outcome (its requeue; a failure's retry after the
// Stack's backoff) unless the Stack changed meanwhile (spec, deletion, a
// reconcile request: acted on at once) or, for a run that succeeded,
// something else woke it while it ran (a Program, a config, a dependency).
// While the run goes on, reconciles of the Stack do nothing.
func TestRunSchedulerCollectsTheOutcomeOfARun(t *testing.T) {
	requeue := ctrl.Result{RequeueAfter: 10 * time.Minute}
	retry := ctrl.Result{RequeueAfter: 4 * time.Second}
	cases := []struct {
		name     string
		run      *detachedRun
		change   func(*terracev1.Stack)
		wantDone bool
		want     ctrl.Result
	}{
		{name: "no run", run: nil, wantDone: false},
		{name: "run going on", run: &detachedRun{generation: 3}, wantDone: true, want: ctrl.Result{}},
		{name: "succeeded", run: &detachedRun{generation: 3, ended: true, result: requeue}, wantDone: true, want: requeue},
		{name: "succeeded, woken meanwhile", run: &detachedRun{generation: 3, ended: true, touched: true, result: requeue}, wantDone: false},
		{name: "failed", run: &detachedRun{generation: 3, ended: true, failed: true, result: retry}, wantDone: true, want: retry},
		{name: "failed, woken meanwhile", run: &detachedRun{generation: 3, ended: true, failed: true, touched: true, result: retry}, wantDone: true, want: retry},
		{name: "failed, spec changed", run: &detachedRun{generation: 3, ended: true, failed: true, result: retry},
			change: func(st *terracev1.Stack) { st.Generation = 4 }, wantDone: false},
		{name: "failed, deleted", run: &detachedRun{generation: 3, ended: true, failed: true, result: retry},
			change: func(st *terracev1.Stack) { now := metav1.Now(); st.DeletionTimestamp = &now }, wantDone: false},
		{name: "succeeded, reconcile requested", run: &detachedRun{generation: 3, ended: true, result: requeue},
			change: func(st *terracev1.Stack) {
				st.Annotations = map[string]string{terracev1.ReconcileRequestAnnotation: "now"}
			}, wantDone: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newRunScheduler(Options{})
			st := &terracev1.Stack{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", Generation: 3}}
			key := client.ObjectKeyFromObject(st)
			if tc.run != nil {
				q.detached[key] = tc.run
			}
			if tc.change != nil {
				tc.change(st)
			}
			got, done := q.collect(st)
			if done != tc.wantDone || got != tc.want {
				t.Fatalf("collect: %+v, done %v; want %+v, done %v", got, done, tc.want, tc.wantDone)
			}
			_, kept := q.detached[key]
			if wantKept := tc.run != nil && !tc.run.ended; kept != wantKept {
				t.Errorf("run kept %v after collect, want %v", kept, wantKept)
			}
			if tc.run != nil && !tc.run.ended && !tc.run.touched {
				t.Error("a reconcile during the run did not mark it touched")
			}
		})
	}
	var none *runScheduler
	if _, done := none.collect(&terracev1.Stack{}); done {
		t.Error("without a scheduler a reconcile must go on")
	}
	q := newRunScheduler(Options{})
	going, ended := types.NamespacedName{Namespace: "team", Name: "going"}, types.NamespacedName{Namespace: "team", Name: "ended"}
	q.detached[going], q.detached[ended] = &detachedRun{}, &detachedRun{ended: true}
	q.forget(going)
	q.forget(ended)
	if _, ok := q.detached[going]; !ok {
		t.Error("forget dropped a run that goes on")
	}
	if _, ok := q.detached[ended]; ok {
		t.Error("forget kept the outcome of a Stack that is gone")
	}
}

// The scheduler's limits follow the options: the workers' number unless
// the slots are set, and one namespace's share one less than the slots.
func TestRunSchedulerLimits(t *testing.T) {
	for _, tc := range []struct {
		opts                Options
		total, perNamespace int
	}{
		{Options{}, 4, 3},
		{Options{MaxConcurrentReconciles: 8}, 8, 7},
		{Options{MaxConcurrentReconciles: 2, MaxConcurrentRuns: 6}, 6, 5},
		{Options{MaxConcurrentRuns: 6, MaxRunsPerNamespace: 2}, 6, 2},
		{Options{MaxConcurrentRuns: 2, MaxRunsPerNamespace: 9}, 2, 2},
		{Options{MaxConcurrentRuns: 1}, 1, 1},
	} {
		q := newRunScheduler(tc.opts)
		if q.slots.total != tc.total || q.slots.perNamespace != tc.perNamespace {
			t.Errorf("%+v: %d slots, %d per namespace; want %d, %d", tc.opts, q.slots.total, q.slots.perNamespace, tc.total, tc.perNamespace)
		}
	}
}

// spec.timeout above --max-run-timeout is refused (terminal, naming the
// limit); at or below it, or without a limit, it is the run's timeout. A
// run without spec.timeout gets the default, cut to the limit; so does a
// destroy run whose Stack asks for more.
func TestRunTimeoutLimit(t *testing.T) {
	stack := func(d time.Duration) *scope {
		st := &terracev1.Stack{}
		if d > 0 {
			st.Spec.Timeout = &metav1.Duration{Duration: d}
		}
		return &scope{stack: st}
	}
	for _, tc := range []struct {
		limit, timeout time.Duration
		refused        bool
		runTimeout     time.Duration
	}{
		{limit: 2 * time.Hour, timeout: 1000 * time.Hour, refused: true, runTimeout: 2 * time.Hour},
		{limit: 2 * time.Hour, timeout: 2 * time.Hour, runTimeout: 2 * time.Hour},
		{limit: 2 * time.Hour, timeout: 0, runTimeout: launcher.DefaultRunTimeout},
		{limit: 5 * time.Minute, timeout: 0, runTimeout: 5 * time.Minute},
		{limit: 0, timeout: 1000 * time.Hour, runTimeout: 1000 * time.Hour},
	} {
		r := &Reconciler{Options: Options{MaxRunTimeout: tc.limit}}
		s := stack(tc.timeout)
		err := r.checkRunTimeout(context.Background(), s)
		var terminal *outcome.TerminalError
		if refused := errors.As(err, &terminal); refused != tc.refused || (refused && terminal.Reason != RunTimeoutTooLongReason) {
			t.Errorf("limit %v, timeout %v: %v; refused: %v", tc.limit, tc.timeout, err, tc.refused)
		}
		if tc.refused && !strings.Contains(err.Error(), "--max-run-timeout") {
			t.Errorf("the refusal does not name the flag: %v", err)
		}
		if got := r.runTimeout(s); got != tc.runTimeout {
			t.Errorf("limit %v, timeout %v: run timeout %v, want %v", tc.limit, tc.timeout, got, tc.runTimeout)
		}
	}
}

// A queued Stack further back asks again less often: the head every
// queuedRecheck, one more period per slot's worth of Stacks before it, at
// most maxQueuedRecheck; a waiter keeps its place for three of its own
// rechecks, so one far back that asks on its schedule is never dropped.
func TestQueuedStacksFurtherBackRecheckLessOften(t *testing.T) {
	q := newRunSlots(4, 4, slotReservationTTL, queuedWaiterTTL)
	now := time.Now()
	for i := range 4 {
		q.acquire(slotKey(fmt.Sprintf("a/run%d", i)), now)
	}
	var answers []slotAnswer
	for i := range 100 {
		ans, _ := q.acquire(slotKey(fmt.Sprintf("a/wait%d", i)), now)
		answers = append(answers, ans)
	}
	for _, c := range []struct {
		ahead int
		want  time.Duration
	}{{0, 10 * time.Second}, {3, 10 * time.Second}, {4, 20 * time.Second}, {19, 50 * time.Second}, {99, maxQueuedRecheck}} {
		if got := answers[c.ahead]; got.ahead != c.ahead || got.recheck != c.want {
			t.Errorf("waiter with %d before it: ahead %d, recheck %s; want %s", c.ahead, got.ahead, got.recheck, c.want)
		}
	}
	// The 20th waiter rechecks every 50 s: 2 minutes without asking keep
	// it queued, more than 150 s do not. The head, which asks every 25 s,
	// keeps its place.
	has := func(key string) bool {
		_, queued := q.waiting["a"].place(slotKey(key))
		return queued
	}
	for d := 25 * time.Second; d <= 150*time.Second; d += 25 * time.Second {
		q.acquire(slotKey("a/wait0"), now.Add(d))
	}
	if !has("a/wait19") {
		t.Error("a waiter far back was dropped within three of its own rechecks")
	}
	q.acquire(slotKey("a/wait0"), now.Add(151*time.Second))
	if has("a/wait19") {
		t.Error("a waiter that stopped asking kept its place past three of its rechecks")
	}
	if head := q.waiting["a"].ws[0].key; head != slotKey("a/wait0") {
		t.Errorf("the head that kept asking lost its place to %v", head)
	}
}

// queueIfNoSlot queues a Stack only when acquire would, and takes no slot.
func TestQueueIfNoSlotTakesNothing(t *testing.T) {
	q := newRunSlots(2, 2, slotReservationTTL, queuedWaiterTTL)
	now := time.Now()
	if _, queued, _ := q.queueIfNoSlot(slotKey("a/1"), now); queued || q.inUse() != 0 {
		t.Fatalf("with free slots: queued %v, %d slots in use", queued, q.inUse())
	}
	q.acquire(slotKey("a/1"), now)
	q.acquire(slotKey("a/2"), now)
	ans, queued, _ := q.queueIfNoSlot(slotKey("a/3"), now)
	if !queued || ans.ahead != 0 || q.waiting["a"].len() != 1 {
		t.Fatalf("with every slot taken: queued %v, ahead %d, %d waiting", queued, ans.ahead, q.waiting["a"].len())
	}
	if _, queued, _ := q.queueIfNoSlot(slotKey("a/1"), now); queued {
		t.Error("a Stack holding a slot was queued")
	}
	woken := q.release(slotKey("a/1"), now)
	if len(woken) != 1 || woken[0] != slotKey("a/3") {
		t.Fatalf("woken %v, want a/3", woken)
	}
	if _, queued, _ := q.queueIfNoSlot(slotKey("a/3"), now); queued {
		t.Error("a Stack with a slot reserved for it was queued")
	}
	if ans, _ := q.acquire(slotKey("a/3"), now); !ans.granted {
		t.Error("the reservation was lost")
	}
}

// The run queue's gauges follow the scheduler: slots held or reserved,
// and Stacks waiting, across namespaces.
func TestRunSchedulerReportsItsQueue(t *testing.T) {
	q := newRunScheduler(Options{MaxConcurrentRuns: 2, MaxRunsPerNamespace: 2})
	// Gauges of its own: the suite's controller sets the registered ones.
	q.inUse, q.queued = prometheus.NewGauge(prometheus.GaugeOpts{Name: "in_use"}), prometheus.NewGauge(prometheus.GaugeOpts{Name: "queued"})
	gauges := func() string {
		return fmt.Sprintf("in use %v, queued %v", gaugeValue(t, q.inUse), gaugeValue(t, q.queued))
	}
	q.acquire(slotKey("a/1"))
	q.acquire(slotKey("a/2"))
	q.acquire(slotKey("a/3"))
	q.queueIfNoSlot(slotKey("b/1"))
	if got := gauges(); got != "in use 2, queued 2" {
		t.Errorf("two runs, two waiting: %s", got)
	}
	q.release(slotKey("a/1")) // reserved for the next turn's waiter
	if got := gauges(); got != "in use 2, queued 1" {
		t.Errorf("after a release: %s", got)
	}
	q.release(slotKey("a/2"))
	if got := gauges(); got != "in use 2, queued 0" {
		t.Errorf("after a second release: %s", got)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}
