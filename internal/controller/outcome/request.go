package outcome

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// RequestedAt returns the value of the terrace.dev/requestedAt annotation.
func RequestedAt(obj metav1.Object) (string, bool) {
	v, ok := obj.GetAnnotations()[terracev1.ReconcileRequestAnnotation]
	return v, ok && v != ""
}

// HandleReconcileRequest records the terrace.dev/requestedAt value in
// status.lastHandledReconcileAt and reports whether it is a new request.
// Call it once per reconcile; the status patch then echoes the value, which
// is how `terrace reconcile` knows its request was acted on.
func HandleReconcileRequest(obj metav1.Object, status *terracev1.ReconcileRequestStatus) bool {
	v, ok := RequestedAt(obj)
	if !ok || v == status.LastHandledReconcileAt {
		return false
	}
	status.LastHandledReconcileAt = v
	return true
}

// GenerationOrRequestChanged lets through updates that change the spec
// (generation) or the terrace.dev/requestedAt annotation, and every create,
// delete and generic event. Status-only updates are dropped.
func GenerationOrRequestChanged() predicate.Predicate {
	return predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, requestChanged{})
}

type requestChanged struct{ predicate.Funcs }

func (requestChanged) Update(e event.UpdateEvent) bool {
	if e.ObjectOld == nil || e.ObjectNew == nil {
		return false
	}
	oldV, _ := RequestedAt(e.ObjectOld)
	newV, ok := RequestedAt(e.ObjectNew)
	return ok && newV != oldV
}

// requestChanged passes no create/delete/generic itself: Or with the
// generation predicate (which passes them) decides.
func (requestChanged) Create(event.CreateEvent) bool   { return false }
func (requestChanged) Delete(event.DeleteEvent) bool   { return false }
func (requestChanged) Generic(event.GenericEvent) bool { return false }
