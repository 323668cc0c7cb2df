package stack

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// The actions before a run: read what the Stack needs, then wait, look
// again later, or start a run (run.go).

// resolve reads the source, config and inputs a run needs, in order,
// stopping at the first that fails. Dependencies come first: a Stack
// waiting on them reads nothing else. A Stack being deleted reads what
// its destroy needs.
func (r *Reconciler) resolve(ctx context.Context, s *scope) error {
	if !s.stack.DeletionTimestamp.IsZero() {
		return r.resolveForDestroy(ctx, s)
	}
	if err := r.checkRunTimeout(ctx, s); err != nil {
		return err
	}
	if err := r.checkDependencies(ctx, s); err != nil || s.observed.dependencyWait != "" {
		return err
	}
	for _, read := range []func(context.Context, *scope) error{
		r.resolveSource, r.resolveConfig, r.gatherInputs, r.gatherRunOptions, r.resolveBackend,
	} {
		if err := read(ctx, s); err != nil {
			return err
		}
	}
	return r.checkOutputsSecret(ctx, s)
}

// resolveForDestroy reads what a destroy run needs: the module, the config,
// the inputs and the file mappings (provider credentials).
func (r *Reconciler) resolveForDestroy(ctx context.Context, s *scope) error {
	for _, read := range []func(context.Context, *scope) error{
		r.resolveSource, r.resolveConfig, r.gatherInputs, r.gatherDestroyOptions,
	} {
		if err := read(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// waitForDependencies looks again after Options.DependencyRequeue (a
// dependency becoming Ready wakes the Stack before that).
func (r *Reconciler) waitForDependencies(_ context.Context, s *scope) error {
	after := r.Options.DependencyRequeue
	if after <= 0 {
		after = 30 * time.Second
	}
	return outcome.Waiting(DependencyNotReadyReason, after, fmt.Errorf("waiting for dependencies to be Ready: %s", s.observed.dependencyWait))
}

// suspend does nothing: spec.suspend stops every run until it is unset.
func (r *Reconciler) suspend(_ context.Context, s *scope) error {
	s.observed.suspended = true
	return nil
}

// verifyCache asks the API server whether the cached Stack is the
// latest. The cache may not yet hold the status the previous reconcile
// wrote; deciding a run from it would repeat that run (a second apply, or
// an apply of drift that warn mode must only report), and a deletion from
// it would destroy twice. A run takes minutes, so one uncached read before
// each is cheap.
func (r *Reconciler) verifyCache(ctx context.Context, s *scope) error {
	if s.stack.DeletionTimestamp.IsZero() {
		// Only a run is due: if it would wait for a slot, it waits
		// without the read, which is made once a slot is there for it. A
		// thousand queued Stacks read themselves at every recheck
		// otherwise.
		if err := r.queueUnlessSlot(ctx, s); err != nil {
			return err
		}
	}
	live := &terracev1.Stack{}
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(s.stack), live)
	switch {
	case apierrors.IsNotFound(err):
		s.observed.staleCache = true // deleted: the cache will say so
	case err != nil:
		return fmt.Errorf("failed to read the Stack before a run: %w", err)
	default:
		s.observed.staleCache = live.ResourceVersion != s.stack.ResourceVersion
	}
	s.current = !s.observed.staleCache
	return nil
}

// staleCacheRetry is how soon a reconcile that read a stale Stack looks
// again: the watch event it missed is normally a few milliseconds away.
const staleCacheRetry = 250 * time.Millisecond

// waitForCache ends a reconcile that read a stale Stack: nothing was done,
// and finish looks again once the cache has caught up.
func (r *Reconciler) waitForCache(context.Context, *scope) error { return nil }

// discardStalePlan drops a waiting plan made from inputs that moved on:
// it can never be applied.
func (r *Reconciler) discardStalePlan(_ context.Context, s *scope) error {
	discarded := staleWaitingPlan(s)
	s.observed.discardedPlan = discarded
	r.normalEvent(s.stack, "PlanDiscarded", "plan %s was made from other inputs and is discarded", discarded)
	return nil
}

// awaitApproval ends a reconcile whose plan waits for a person.
func (r *Reconciler) awaitApproval(_ context.Context, s *scope) error {
	s.observed.kind = runAwaitApproval
	return nil
}

// scheduleNextCheck ends a reconcile with nothing to run: it looks again
// at the next drift check (or interval), jittered so that Stacks created
// together do not check together forever.
func (r *Reconciler) scheduleNextCheck(_ context.Context, s *scope) error {
	s.observed.kind = runNothing
	s.observed.requeueAfter = jitter(s.stack, r.nextDriftCheck(s))
	return nil
}
