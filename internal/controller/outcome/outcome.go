package outcome

import (
	"errors"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// TerminalError is a failure only the user can fix (an invalid program, a
// missing Secret key): the object is Stalled and the request is not retried
// until the object or something it watches changes.
type TerminalError struct {
	Reason string
	Err    error
}

// Terminal wraps err as a TerminalError with a condition reason.
func Terminal(reason string, err error) error {
	return &TerminalError{Reason: reason, Err: err}
}

// Terminalf is Terminal with a formatted message.
func Terminalf(reason, format string, args ...any) error {
	return &TerminalError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

func (e *TerminalError) Error() string { return e.Err.Error() }
func (e *TerminalError) Unwrap() error { return e.Err }

// WaitingError means the object waits for something outside it (a
// dependency not Ready yet): checked again after RequeueAfter, no backoff.
type WaitingError struct {
	Reason       string
	Err          error
	RequeueAfter time.Duration
}

// Waiting wraps err as a WaitingError.
func Waiting(reason string, after time.Duration, err error) error {
	return &WaitingError{Reason: reason, Err: err, RequeueAfter: after}
}

func (e *WaitingError) Error() string { return e.Err.Error() }
func (e *WaitingError) Unwrap() error { return e.Err }

// DeferredError means work that would not change how the object stands (a
// periodic check of an object in sync) waits its turn: the conditions stay
// as they are, and the object is looked at again after RequeueAfter.
type DeferredError struct {
	Err          error
	RequeueAfter time.Duration
}

// Deferred wraps err as a DeferredError.
func Deferred(after time.Duration, err error) error {
	return &DeferredError{Err: err, RequeueAfter: after}
}

func (e *DeferredError) Error() string { return e.Err.Error() }
func (e *DeferredError) Unwrap() error { return e.Err }

// AwaitingError means the object waits on a person (a plan to approve):
// settled for this generation, not Ready, Reconciling with the awaiting
// reason (kstatus: InProgress, not Current) and not Stalled. Nothing is
// retried; the person's change wakes the object.
type AwaitingError struct {
	Reason string
	Err    error
}

// Awaiting wraps a message as an AwaitingError.
func Awaiting(reason, format string, args ...any) error {
	return &AwaitingError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

func (e *AwaitingError) Error() string { return e.Err.Error() }
func (e *AwaitingError) Unwrap() error { return e.Err }

// Outcome is what a reconcile ends with.
type Outcome struct {
	// Result and Err are returned from Reconcile.
	Result ctrl.Result
	Err    error
	// Final is true when the outcome is settled for this generation (success
	// or terminal failure): only then is status.observedGeneration set.
	Final bool
}

// Summarize derives Ready/Reconciling/Stalled from the error the steps
// returned, and what Reconcile should return:
//
//   - nil: Ready=True with readyReason and readyMessage; final; requeue
//     after interval (0 for none).
//   - *TerminalError: Stalled=True and Ready=False with its reason and
//     message; final; no error; requeue after interval (the world may
//     change under an unchanged object).
//   - *AwaitingError: Ready=False and Reconciling=True with its reason;
//     Stalled removed; final; no requeue.
//   - *WaitingError: Ready=False and Reconciling=True with its reason;
//     requeue after its delay; no error.
//   - *DeferredError: the conditions as they are; requeue after its
//     delay; no error.
//   - anything else: transient; Ready=False ReconciliationFailed and
//     Reconciling=True ProgressingWithRetry; the error is returned so
//     controller-runtime backs off.
func Summarize(obj Object, err error, readyReason, readyMessage string, interval time.Duration) Outcome {
	var terminal *TerminalError
	var waiting *WaitingError
	var awaiting *AwaitingError
	var deferred *DeferredError
	switch {
	case err == nil:
		MarkReady(obj, readyReason, "%s", readyMessage)
		return Outcome{Result: ctrl.Result{RequeueAfter: interval}, Final: true}
	case errors.As(err, &terminal):
		MarkStalled(obj, terminal.Reason, "%s", terminal.Err.Error())
		return Outcome{Result: ctrl.Result{RequeueAfter: interval}, Final: true}
	case errors.As(err, &awaiting):
		MarkFalse(obj, terracev1.ReadyCondition, awaiting.Reason, "%s", awaiting.Err.Error())
		MarkTrue(obj, terracev1.ReconcilingCondition, awaiting.Reason, "%s", awaiting.Err.Error())
		Delete(obj, terracev1.StalledCondition)
		return Outcome{Final: true}
	case errors.As(err, &waiting):
		Delete(obj, terracev1.StalledCondition)
		MarkFalse(obj, terracev1.ReadyCondition, waiting.Reason, "%s", waiting.Err.Error())
		MarkTrue(obj, terracev1.ReconcilingCondition, waiting.Reason, "%s", waiting.Err.Error())
		return Outcome{Result: ctrl.Result{RequeueAfter: waiting.RequeueAfter}}
	case errors.As(err, &deferred):
		return Outcome{Result: ctrl.Result{RequeueAfter: deferred.RequeueAfter}}
	default:
		Delete(obj, terracev1.StalledCondition)
		MarkFalse(obj, terracev1.ReadyCondition, ReconciliationFailedReason, "%s", err.Error())
		MarkTrue(obj, terracev1.ReconcilingCondition, ProgressingWithRetryReason, "%s", err.Error())
		return Outcome{Err: err}
	}
}
