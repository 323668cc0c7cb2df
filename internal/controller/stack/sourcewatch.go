package stack

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	ctrlsource "sigs.k8s.io/controller-runtime/pkg/source"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// sourceRefIndex finds the Stacks that name a Flux source: "Kind/namespace/name".
const sourceRefIndex = ".spec.source.sourceRef"

func sourceRefKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

// sourceWatches starts, on first use, a watch of each Flux source kind a
// Stack names. Flux is optional and may be installed after the controller
// starts, so the watches cannot be set up front: a kind whose CRD does not
// exist yet is tried again at the Stack's next look (the source wait).
// The watch is metadata-only: any change of a source, its new artifact
// included, moves its resourceVersion, and the Stack reads the artifact
// itself uncached.
type sourceWatches struct {
	controller controller.Controller
	cache      cache.Cache
	mapper     meta.RESTMapper
	stacks     func(ctx context.Context, kind, namespace, name string) []reconcile.Request

	mu      sync.Mutex
	started map[schema.GroupVersionKind]bool
}

// ensure starts watching gvk unless it is watched already or unknown to
// the API server.
func (w *sourceWatches) ensure(ctx context.Context, gvk schema.GroupVersionKind) {
	if w == nil || w.controller == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started[gvk] {
		return
	}
	if _, err := w.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
		return // not installed (yet)
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(gvk)
	kind := gvk.Kind
	src := ctrlsource.Kind(w.cache, obj, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, o *metav1.PartialObjectMetadata) []reconcile.Request {
		return w.stacks(ctx, kind, o.GetNamespace(), o.GetName())
	}), predicate.TypedResourceVersionChangedPredicate[*metav1.PartialObjectMetadata]{})
	if err := w.controller.Watch(src); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "failed to watch a Flux source kind; Stacks notice its changes at their interval", "kind", gvk.String())
		return
	}
	if w.started == nil {
		w.started = map[schema.GroupVersionKind]bool{}
	}
	w.started[gvk] = true
	ctrl.LoggerFrom(ctx).Info("watching a Flux source kind", "kind", gvk.String())
}

// stacksForSource lists the Stacks that name the source.
func (r *Reconciler) stacksForSource(ctx context.Context, kind, namespace, name string) []reconcile.Request {
	var list terracev1.StackList
	if err := r.Client.List(ctx, &list, client.MatchingFields{sourceRefIndex: sourceRefKey(kind, namespace, name)}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "failed to list the Stacks of a source")
		return nil
	}
	return requests(list.Items)
}
