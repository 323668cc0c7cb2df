package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/tf"
)

const (
	// StateSavedByControllerReason (an event): tofu changed the resources
	// but could not upload the state (the state server did not answer for
	// all its retries); the controller saved the state tofu left.
	StateSavedByControllerReason = "StateSavedByController"
	// StateNotSavedReason: as above, but the state store did not answer
	// the controller either, for unsavedStateWait: the state is kept in
	// the plan store, for `terrace push-state`, and the Stack is Stalled,
	// so that no run plans from the stored state, which misses the
	// apply's changes (holdUnsavedState).
	StateNotSavedReason = "StateNotSaved"
)

// unsavedStateWait bounds how long the controller retries writing the
// state tofu could not upload, holding the Stack's reconcile: a restart of
// the state store (tofu's own retries cover ~11 s of it) is well inside it.
const unsavedStateWait = 2 * time.Minute

// saveUnsavedState handles an apply whose state upload got no answer
// (STATE_UNAVAILABLE). When tofu had a state to save, it left it in the
// runner (tf.ErroredStateID), which goes with the pod; the controller
// downloads it and writes it to the state store itself once the store
// answers, under the run's own apply lock, which it then releases. Either
// way the run fails as retried: the next one plans from the saved state.
// Without this, the next run would plan from a state that misses what
// the apply made, and make it again.
func (r *Reconciler) saveUnsavedState(ctx context.Context, s *scope) error {
	ctx, p, applyErr := context.WithoutCancel(ctx), s.run.record, s.run.applyErr
	retried := classify(s.run.session, applyErr, ApplyFailedReason, "apply failed")
	id := tf.ErroredStateID(p.id)
	// Any state the state server would have taken fits: it was not
	// refused as too large, only not answered.
	var left bytes.Buffer
	_, err := s.run.client.DownloadPlanUpTo(ctx, id, max(r.Options.MaxStateBytes, maxErroredStateBytes), &left)
	switch {
	case runner.Reason(err) == runner.ReasonPlanNotFound:
		// tofu failed before it had a state to save: nothing changed.
		r.recordFailedRelease(ctx, s, p, "apply failed: the state server did not answer; see the Stack's Ready condition")
		return retried
	case err != nil:
		r.recordFailedRelease(ctx, s, p, "applied, but neither tofu nor the controller could save the state")
		return outcome.Terminalf(StateNotSavedReason, "tofu applied %s but could not save the state (the state server did not answer), and the state it left could not be read from the runner (%s): the stored state may miss this apply's changes; check the resources before the Stack runs again", p.id, runnerMessage(err))
	}
	if err := r.retryUnsavedWrite(ctx, s, left.Bytes()); err != nil {
		return r.keepUnsavedState(ctx, s, p, id, left.Bytes(), err)
	}
	r.recordFailedRelease(ctx, s, p, "applied, but tofu could not save the state (the state server did not answer); the controller saved it, and plans again")
	r.warningEvent(s.stack, StateSavedByControllerReason, "tofu applied %s but could not save the state (the state server did not answer); the controller saved the state tofu left, and plans again", p.id)
	return fmt.Errorf("%w; the controller saved the state tofu left, and plans again", retried)
}

// retryUnsavedWrite writes data with writeUnsavedState, retrying at 1, 2,
// 4, 8 and then every 16 s for unsavedStateWait, while the store does not
// answer; a lock of someone else ends it at once. The error is the last
// write's.
func (r *Reconciler) retryUnsavedWrite(ctx context.Context, s *scope, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, unsavedStateWait)
	defer cancel()
	var last error
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: 16 * time.Second, Steps: math.MaxInt32}
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		last = r.writeUnsavedState(ctx, s, data)
		var other *state.LockedError
		if errors.As(last, &other) {
			return false, last // never written over another holder's lock
		}
		if last != nil {
			s.log.Info("the state store does not answer yet; retrying the save of the state tofu left", "error", last.Error())
		}
		return last == nil, nil
	})
	return last
}

// writeUnsavedState writes data, the state tofu could not upload, as the
// Stack's current state. The run's apply lock is usually still held (its
// release got no answer either): the write is made under it and the lock
// released after (state.PutAndRelease). A lock of anyone else is a
// *state.LockedError and nothing is written.
func (r *Reconciler) writeUnsavedState(ctx context.Context, s *scope, data []byte) error {
	states := s.run.stores.States
	key := stateKey(s.stack)
	holder, err := states.GetLock(ctx, key)
	if err != nil {
		return err
	}
	if holder != nil && holder.Owner != string(pki.RunnerIdentity(s.stack.Namespace, s.stack.Name, s.run.id)) {
		return &state.LockedError{Key: key.String(), Holder: holder}
	}
	_, err = state.PutAndRelease(ctx, states, key, data, holder)
	return err
}

// keepUnsavedState keeps the state the controller could not write in the
// plan store (a separate record, which the state store's outage may have
// spared) and stalls the Stack: a run planning from the stored state would
// make the apply's changes again.
func (r *Reconciler) keepUnsavedState(ctx context.Context, s *scope, p planRecord, id string, data []byte, writeErr error) error {
	parts := &planParts{ctx: ctx, store: s.run.stores.Plans, key: planKey(s.stack, id), size: erroredStatePartBytes}
	_, err := parts.Write(data)
	if err == nil {
		err = parts.Close()
	}
	if err != nil {
		s.log.Error(err, "failed to keep the state tofu could not save; it is lost with the runner", "id", id)
		r.recordFailedRelease(ctx, s, p, "applied, but neither tofu nor the controller could save the state, and it could not be kept")
		return outcome.Terminalf(StateNotSavedReason, "tofu applied %s but could not save the state (the state server did not answer), the controller could not write it either (%s), nor keep it (%s): the stored state misses this apply's changes; see the controller's log", p.id, writeErr.Error(), err.Error())
	}
	where := partsWhere(parts.ids)
	r.recordFailedRelease(ctx, s, p, "applied, but neither tofu nor the controller could save the state; it is kept as plan "+where)
	r.warningEvent(s.stack, StateNotSavedReason, "the state tofu could not save after applying %s is kept as plan %s", p.id, where)
	return outcome.Terminalf(StateNotSavedReason, "tofu applied %s but could not save the state (the state server did not answer), and the controller could not write it either (%s): it is kept in the Stack's plan store as %s; the Stack does not run while the failed run's lock is held: push it first with `terrace push-state %s %s -n %s`", p.id, writeErr.Error(), where, s.stack.Name, id, s.stack.Namespace)
}
