package outcome

import (
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// FluxReconcileRequestAnnotation is Flux's reconcile request, which `flux
// reconcile` and a notification-controller Receiver write: a Receiver that
// lists Stacks works unchanged.
const FluxReconcileRequestAnnotation = "reconcile.fluxcd.io/requestedAt"

// RequestedAt returns the reconcile request: the value of
// terrace.dev/requestedAt or of Flux's reconcile.fluxcd.io/requestedAt.
// When both are set the newer counts: both are read as times (RFC 3339, as
// Terrace and Flux write them, or Unix seconds, as `date +%s` gives) and
// the later wins; a tie, or a value that is no time, leaves Terrace's own.
// The choice depends on the annotations alone, never on the status, so a
// request once handled stays handled (status.lastHandledReconcileAt holds
// one value: a choice that looked at it would take the two turn about).
func RequestedAt(obj metav1.Object) (string, bool) {
	a := obj.GetAnnotations()
	own, flux := a[terracev1.ReconcileRequestAnnotation], a[FluxReconcileRequestAnnotation]
	switch {
	case flux == "":
		return own, own != ""
	case own == "":
		return flux, true
	}
	ownAt, ok1 := requestTime(own)
	fluxAt, ok2 := requestTime(flux)
	if ok1 && ok2 && fluxAt.After(ownAt) {
		return flux, true
	}
	return own, true
}

func requestTime(v string) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, true
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s > 0 {
		return time.Unix(s, 0), true
	}
	return time.Time{}, false
}

// HandleReconcileRequest records the RequestedAt value in
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
// (generation) or the reconcile request (RequestedAt), and every create,
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

// Owns says a controller whose objects sel selects (a shard's
// --watch-label-selector; nil selects every object) reconciles obj.
func Owns(sel labels.Selector, obj client.Object) bool {
	return sel == nil || sel.Matches(labels.Set(obj.GetLabels()))
}

// LabelsMatch passes the events of objects Owns gives the controller.
func LabelsMatch(sel labels.Selector) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(obj client.Object) bool { return Owns(sel, obj) })
}
