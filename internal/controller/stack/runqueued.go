package stack

import (
	"context"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// A run that finds no slot waits: how a reconcile says so.

// queueUnlessSlot queues the Stack, as startRun would, when no run slot
// is there for it; nil when one is, or when there is no scheduler.
func (r *Reconciler) queueUnlessSlot(ctx context.Context, s *scope) error {
	q := r.scheduler
	if q == nil {
		return nil
	}
	// A Stack that waits for another shard's run would not take a slot
	// reserved for it: it must not queue for one.
	if err := r.waitForOtherShardRun(ctx, s); err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(s.stack)
	ans, wait := q.queueIfNoSlot(key)
	if !wait {
		return nil
	}
	due := dueState(r.observe(s))
	return queued(s, ans, due == StateDriftDue || due == StateSourceCheckDue, "cacheVerified", false, "due", due)
}

// queued is the outcome of a Stack whose run waits for a slot, asking
// again at the answer's recheck. A run of new work (new inputs, an
// approved plan, a request, a retry) shows RunQueued: Ready=False,
// Reconciling=True. A periodic check of a Stack in sync (drift, the Git
// ref) leaves the conditions as they are: a Ready Stack stays Ready while
// it is checked (summarizeProgress), and while its check waits. No run:
// terrace_runs_total counts none.
func queued(s *scope, ans slotAnswer, check bool, keysAndValues ...any) error {
	s.observed.kind = runNothing
	s.log.V(1).Info("run queued", append(keysAndValues, "namespaceRuns", ans.namespaceInUse, "runs", ans.inUse, "queuedBefore", ans.ahead)...)
	err := errors.New(ans.message(s.stack.Namespace))
	if check {
		return outcome.Deferred(ans.recheck, err)
	}
	return outcome.Waiting(RunQueuedReason, ans.recheck, err)
}

// runQueued says a reconcile ended with its run waiting for a slot.
func runQueued(err error) bool {
	var waiting *outcome.WaitingError
	var deferred *outcome.DeferredError
	return errors.As(err, &deferred) || errors.As(err, &waiting) && waiting.Reason == RunQueuedReason
}
