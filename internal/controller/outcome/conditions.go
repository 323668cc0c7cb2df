// Package outcome holds the small pieces every Terrace reconciler shares:
// kstatus conditions, the three kinds of errors (terminal, waiting,
// transient) and how each maps to conditions and a ctrl.Result, a status
// patcher that writes only the conditions its controller owns, and the
// terrace.dev/requestedAt annotation.
package outcome

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fluxcd/pkg/runtime/conditions"
	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// Object is a Kubernetes object with status conditions; every Terrace kind
// implements it.
type Object interface {
	client.Object
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
}

// Reasons used by the helpers in this package when the caller gives none.
const (
	// ProgressingReason: the controller is working towards a new outcome.
	ProgressingReason = "Progressing"
	// ProgressingWithRetryReason: the last attempt failed transiently and will be retried.
	ProgressingWithRetryReason = "ProgressingWithRetry"
	// ReconciliationFailedReason: a transient error, retried with backoff.
	ReconciliationFailedReason = "ReconciliationFailed"
	// WaitingReason: waiting on something outside the object.
	WaitingReason = "Waiting"
)

// maxMessageLength is metav1.Condition's limit on Message.
const maxMessageLength = 32768

// Set sets a condition with the object's current generation as its
// observedGeneration, with Flux's conditions package (fluxcd/pkg/runtime):
// the transition time changes with the status, reason or message, and the
// conditions stay sorted Stalled, Reconciling, Ready, then the others.
func Set(obj Object, condType string, status metav1.ConditionStatus, reason, message string) {
	conditions.Set(obj, &metav1.Condition{Type: condType, Status: status, Reason: reason, Message: truncate(message)})
}

// MarkTrue sets condType to True.
func MarkTrue(obj Object, condType, reason, format string, args ...any) {
	Set(obj, condType, metav1.ConditionTrue, reason, fmt.Sprintf(format, args...))
}

// MarkFalse sets condType to False.
func MarkFalse(obj Object, condType, reason, format string, args ...any) {
	Set(obj, condType, metav1.ConditionFalse, reason, fmt.Sprintf(format, args...))
}

// MarkUnknown sets condType to Unknown.
func MarkUnknown(obj Object, condType, reason, format string, args ...any) {
	Set(obj, condType, metav1.ConditionUnknown, reason, fmt.Sprintf(format, args...))
}

// Delete removes condType.
func Delete(obj Object, condType string) { conditions.Delete(obj, condType) }

// Get returns condType, or nil.
func Get(obj Object, condType string) *metav1.Condition { return conditions.Get(obj, condType) }

// IsTrue reports whether condType is True.
func IsTrue(obj Object, condType string) bool { return conditions.IsTrue(obj, condType) }

// IsFalse reports whether condType is False.
func IsFalse(obj Object, condType string) bool { return conditions.IsFalse(obj, condType) }

// MarkReady records a final success: Ready=True; Reconciling and Stalled removed.
func MarkReady(obj Object, reason, format string, args ...any) {
	MarkTrue(obj, terracev1.ReadyCondition, reason, format, args...)
	Delete(obj, terracev1.ReconcilingCondition)
	Delete(obj, terracev1.StalledCondition)
}

// MarkReconciling records that work towards a new outcome has started:
// Reconciling=True and, unless Ready is already False (a known failure
// stays visible), Ready=Unknown with the same reason and message.
func MarkReconciling(obj Object, reason, format string, args ...any) {
	MarkTrue(obj, terracev1.ReconcilingCondition, reason, format, args...)
	if !IsFalse(obj, terracev1.ReadyCondition) {
		MarkUnknown(obj, terracev1.ReadyCondition, reason, format, args...)
	}
}

// MarkStalled records a terminal failure the user must fix: Stalled=True and
// Ready=False with the same reason and message; Reconciling removed.
func MarkStalled(obj Object, reason, format string, args ...any) {
	MarkTrue(obj, terracev1.StalledCondition, reason, format, args...)
	MarkFalse(obj, terracev1.ReadyCondition, reason, format, args...)
	Delete(obj, terracev1.ReconcilingCondition)
}

func truncate(msg string) string {
	if len(msg) <= maxMessageLength {
		return msg
	}
	const suffix = "… (truncated)"
	cut := maxMessageLength - len(suffix)
	for cut > 0 && !isRuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + suffix
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
