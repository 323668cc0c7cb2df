package stack

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
)

// Condition reasons of the run scheduler.
const (
	// RunQueuedReason: a run is due but its namespace is at its share of
	// the run slots, or every slot is taken; it starts when one frees.
	RunQueuedReason = "RunQueued"
	// RunTimeoutTooLongReason: spec.timeout is above the operator's
	// --max-run-timeout; no run starts until it is lowered.
	RunTimeoutTooLongReason = "RunTimeoutTooLong"
)

// Timing of the run queue.
const (
	// queuedRecheck is how often a queued Stack at the head of its
	// namespace's queue asks again; one further back asks less often
	// (runSlots.recheckAt), at most every maxQueuedRecheck. It is woken as
	// soon as a slot is reserved for it; the recheck only keeps its place
	// in the queue: a thousand queued Stacks asking every 10 s were 100
	// reconciles a second doing nothing.
	queuedRecheck    = 10 * time.Second
	maxQueuedRecheck = 2 * time.Minute
	// queuedWaiterTTL: a waiter at the head that has not asked for this
	// long (its Stack deleted, suspended or no longer due) leaves the
	// queue; one further back, three of its own rechecks.
	queuedWaiterTTL = 3 * queuedRecheck
	// slotReservationTTL: a slot reserved for a woken waiter that does not
	// come to take it goes to the next waiter after this.
	slotReservationTTL = 30 * time.Second
)

// errRunDetached ends a reconcile whose run goes on in its own goroutine:
// the run's goroutine summarizes and patches its outcome (runDetached).
var errRunDetached = errors.New("the run goes on in its own goroutine")

// runScheduler decides when runs start (runSlots) and keeps runs off the
// reconcile workers: a plan, apply or drift run holds a slot, not a
// worker, for its life; its reconcile hands it to a goroutine and
// returns. While it runs, reconciles of its Stack do nothing; when it
// ended (its outcome patched), the Stack is woken and its next reconcile
// returns the run's outcome to controller-runtime (collect), as the run's
// own reconcile would have. A destroy run (deletion) goes on in its
// reconcile, since the finalizer's removal follows it there; it still
// needs a slot, so one namespace's destroys hold fewer workers than there
// are.
type runScheduler struct {
	now func() time.Time
	// wakeups enqueue Stacks (a source.Channel of the controller).
	wakeups chan event.GenericEvent
	// stopped ends pending wakeups once the manager stops (Start).
	stopped chan struct{}

	// running counts the runs going on off the workers.
	running sync.WaitGroup

	mu       sync.Mutex
	slots    *runSlots
	detached map[types.NamespacedName]*detachedRun
	// inUse and queued show the slots (terrace_run_slots_in_use,
	// terrace_runs_queued).
	inUse, queued prometheus.Gauge
}

// runDrainTimeout bounds how long a stopping manager waits for the runs
// going on off the workers to end (the manager's stop ends them: their
// runners are interrupted and removed).
const runDrainTimeout = 25 * time.Second

// Start waits, as a manager Runnable of the leader, until the manager
// stops, then for the runs going on to end (their runner pods removed),
// as the manager waits for reconciles in progress.
func (q *runScheduler) Start(ctx context.Context) error {
	<-ctx.Done()
	close(q.stopped)
	drained := make(chan struct{})
	go func() { q.running.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(runDrainTimeout):
	}
	return nil
}

// detachedRun is a run going on (or ended) off the workers.
type detachedRun struct {
	// generation and requested are the Stack's when the run started: a
	// change of either, or the Stack's deletion, is acted on at once.
	generation int64
	requested  string
	ended      bool
	// touched: a reconcile of the Stack came while the run went on.
	touched bool
	result  ctrl.Result
	failed  bool
}

func newRunScheduler(opts Options) *runScheduler {
	workers := opts.MaxConcurrentReconciles
	if workers <= 0 {
		workers = defaultWorkers
	}
	total := opts.MaxConcurrentRuns
	if total <= 0 {
		total = workers
	}
	perNamespace := opts.MaxRunsPerNamespace
	if perNamespace <= 0 {
		perNamespace = defaultRunsPerNamespace(total)
	}
	return &runScheduler{
		now:      time.Now,
		wakeups:  make(chan event.GenericEvent, 64),
		stopped:  make(chan struct{}),
		slots:    newRunSlots(total, perNamespace, slotReservationTTL, queuedWaiterTTL),
		detached: map[types.NamespacedName]*detachedRun{},
		inUse:    runSlotsInUse,
		queued:   runsQueued,
	}
}

// defaultWorkers is the Stack controller's reconcile workers when the
// options name none.
const defaultWorkers = 4

// acquire takes a slot for the Stack's run, or queues it.
func (q *runScheduler) acquire(key types.NamespacedName) slotAnswer {
	q.mu.Lock()
	ans, woken := q.slots.acquire(key, q.now())
	q.reportSlots()
	q.mu.Unlock()
	q.wake(woken...)
	return ans
}

// queueIfNoSlot queues key, as acquire would, when no slot is there for
// it, and says so; when one is (held, reserved, or free and nobody's
// turn), it takes nothing: the run's acquire takes it.
func (q *runScheduler) queueIfNoSlot(key types.NamespacedName) (slotAnswer, bool) {
	q.mu.Lock()
	ans, queued, woken := q.slots.queueIfNoSlot(key, q.now())
	q.reportSlots()
	q.mu.Unlock()
	q.wake(woken...)
	return ans, queued
}

// release frees the Stack's slot and wakes the waiters it goes to.
func (q *runScheduler) release(key types.NamespacedName) {
	q.mu.Lock()
	woken := q.slots.release(key, q.now())
	q.reportSlots()
	q.mu.Unlock()
	q.wake(woken...)
}

// reportSlots sets the run-slot gauges; the caller holds q.mu.
func (q *runScheduler) reportSlots() {
	q.inUse.Set(float64(q.slots.inUse()))
	q.queued.Set(float64(q.slots.queued()))
}

// wake enqueues the Stacks, off the caller's goroutine: a worker never
// blocks on the controller's queue.
func (q *runScheduler) wake(keys ...types.NamespacedName) {
	for _, key := range keys {
		ev := event.GenericEvent{Object: &terracev1.Stack{}}
		ev.Object.SetNamespace(key.Namespace)
		ev.Object.SetName(key.Name)
		go func() {
			select {
			case q.wakeups <- ev:
			case <-q.stopped:
			}
		}()
	}
}

// collect is the run scheduler's say in a reconcile of stack: done while
// the Stack's run goes on (nothing to do: the run's end wakes it), and,
// for the first reconcile after the run ended, the run's outcome, unless
// something happened meanwhile that a reconcile must act on now. A failed
// run's outcome is the retry after retryInterval, doubled per failure
// (status.failures, as the run's Warning event says); a change of the
// Stack (spec, deletion, a reconcile request) cuts it short. A run that
// succeeded and was touched (a Program, config or dependency changed
// while it ran) is followed by a reconcile at once.
func (q *runScheduler) collect(stack *terracev1.Stack) (ctrl.Result, bool) {
	if q == nil {
		return ctrl.Result{}, false
	}
	key := client.ObjectKeyFromObject(stack)
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.detached[key]
	switch {
	case d == nil:
		return ctrl.Result{}, false
	case !d.ended:
		d.touched = true
		return ctrl.Result{}, true
	}
	delete(q.detached, key)
	requested, _ := outcome.RequestedAt(stack)
	changed := stack.Generation != d.generation || stack.DeletionTimestamp != nil || requested != d.requested
	if changed || (d.touched && !d.failed) {
		return ctrl.Result{}, false
	}
	return d.result, true
}

// forget drops what is known of a Stack that is gone.
func (q *runScheduler) forget(key types.NamespacedName) {
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if d := q.detached[key]; d != nil && d.ended {
		delete(q.detached, key)
	}
}

// startPlanRun, startApplyRun and startDriftRun start the run their
// state calls for.
func (r *Reconciler) startPlanRun(ctx context.Context, s *scope) error {
	return r.startRun(ctx, s, runPlan)
}

func (r *Reconciler) startApplyRun(ctx context.Context, s *scope) error {
	return r.startRun(ctx, s, runApplyPending)
}

func (r *Reconciler) startDriftRun(ctx context.Context, s *scope) error {
	return r.startRun(ctx, s, runDrift)
}

// startRun is where every run starts: with a slot, or queued until one is
// reserved for it. Without a scheduler (a Reconciler not set up with a
// manager) the run runs in its reconcile at once.
func (r *Reconciler) startRun(ctx context.Context, s *scope, kind runKind) error {
	if err := r.waitForOtherShardRun(ctx, s); err != nil {
		return err
	}
	q := r.scheduler
	if q == nil {
		return r.runInReconcile(ctx, s, kind)
	}
	key := client.ObjectKeyFromObject(s.stack)
	ans := q.acquire(key)
	if !ans.granted {
		return queued(s, ans, kind == runDrift || kind == runSourceCheck, "kind", kind)
	}
	if kind == runDestroy {
		defer q.release(key)
		return r.runInReconcile(ctx, s, kind)
	}
	requested, _ := outcome.RequestedAt(s.stack)
	q.mu.Lock()
	q.detached[key] = &detachedRun{generation: s.stack.Generation, requested: requested}
	q.mu.Unlock()
	q.running.Add(1)
	go r.runDetached(ctx, s, kind)
	return errRunDetached
}

// runInReconcile runs a run of kind to its end on the reconcile's goroutine.
func (r *Reconciler) runInReconcile(ctx context.Context, s *scope, kind runKind) error {
	if err := r.newRun(ctx, s, kind); err != nil {
		return err
	}
	return r.runToTheEnd(ctx, s)
}

// runDetached is the rest of a reconcile whose run holds no worker: the
// run, then the reconcile's own finish (status, metrics, the runner's
// close); then the slot is freed and the Stack woken to collect the
// outcome. ctx is the controller's (controller-runtime gives Reconcile
// the controller's context, with no per-reconcile timeout set here): the
// manager's stop ends the run as it would end a run in a reconcile.
func (r *Reconciler) runDetached(ctx context.Context, s *scope, kind runKind) {
	q, key := r.scheduler, client.ObjectKeyFromObject(s.stack)
	started := time.Now()
	var ended ctrl.Result
	failed := true
	defer q.running.Done()
	defer func() {
		q.mu.Lock()
		if d := q.detached[key]; d != nil {
			d.ended, d.result, d.failed = true, ended, failed
		}
		q.mu.Unlock()
		q.release(key)
		q.wake(key)
	}()
	runErr := recovered(s, "run", func() error { return r.runInReconcile(ctx, s, kind) })
	_ = recovered(s, "finishing the run", func() error {
		result, err := r.finish(ctx, s, runErr, time.Since(started))
		if err != nil {
			// The status patch failed: retried after the Stack's own
			// backoff, as its Warning event says.
			ended = ctrl.Result{RequeueAfter: retryBackoff(s.stack, max(s.stack.Status.Failures, 1))}
			return nil
		}
		ended, failed = result, s.stack.Status.Failures > 0
		return nil
	})
}

// recovered calls f, turning a panic into an error (off a reconcile, a
// panic would end the process).
func recovered(s *scope, what string, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("internal error (panic): %v", p)
			s.log.Error(err, what+" panicked", "stack", string(debug.Stack()))
		}
	}()
	return f()
}

// checkRunTimeout refuses a spec.timeout above the operator's
// --max-run-timeout: a run holds a slot for up to its timeout, and the
// limit is what bounds how long one tenant's runs keep a slot from the
// others. Refused, not shortened: a run cut at a limit its author did not
// set would fail in a way the Stack does not explain.
func (r *Reconciler) checkRunTimeout(_ context.Context, s *scope) error {
	limit, t := r.Options.MaxRunTimeout, s.stack.Spec.Timeout
	if limit <= 0 || t == nil || t.Duration <= limit {
		return nil
	}
	return outcome.Terminalf(RunTimeoutTooLongReason,
		"spec.timeout %s is above %s, the longest run this operator allows (--max-run-timeout): lower spec.timeout to %s or less",
		t.Duration, limit, limit)
}

// runTimeout is how long a run may take: spec.timeout, else the default,
// never more than --max-run-timeout. Only a destroy run is ever cut to the
// limit (the deletion goes on); other runs above it are refused first
// (checkRunTimeout).
func (r *Reconciler) runTimeout(s *scope) time.Duration {
	timeout := launcher.DefaultRunTimeout
	if t := s.stack.Spec.Timeout; t != nil && t.Duration > 0 {
		timeout = t.Duration
	}
	if limit := r.Options.MaxRunTimeout; limit > 0 && timeout > limit {
		return limit
	}
	return timeout
}
