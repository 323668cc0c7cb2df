package stack

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	ctrlsource "sigs.k8s.io/controller-runtime/pkg/source"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/settings"
)

// Field indexes used to find the Stacks a change concerns.
const (
	programRefIndex = ".spec.source.programRef.name"
	dependsOnIndex  = ".spec.dependsOn"
)

// SetupWithManager registers the Stack controller with mgr.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &terracev1.Stack{}, programRefIndex, func(o client.Object) []string {
		if ref := o.(*terracev1.Stack).Spec.Source.ProgramRef; ref != nil {
			return []string{ref.Name}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &terracev1.Stack{}, dependsOnIndex, func(o client.Object) []string {
		st := o.(*terracev1.Stack)
		var keys []string
		for _, d := range st.Spec.DependsOn {
			ns := d.Namespace
			if ns == "" {
				ns = st.Namespace
			}
			keys = append(keys, ns+"/"+d.Name)
		}
		return keys
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &terracev1.Stack{}, sourceRefIndex, func(o client.Object) []string {
		st := o.(*terracev1.Stack)
		ref := st.Spec.Source.SourceRef
		if ref == nil {
			return nil
		}
		ns := ref.Namespace
		if ns == "" {
			ns = st.Namespace
		}
		return []string{sourceRefKey(ref.Kind, ns, ref.Name)}
	}); err != nil {
		return err
	}
	workers := r.Options.MaxConcurrentReconciles
	if workers <= 0 {
		workers = defaultWorkers
	}
	r.scheduler = newRunScheduler(r.Options)
	if err := mgr.Add(r.scheduler); err != nil {
		return err
	}
	c, err := ctrl.NewControllerManagedBy(mgr).
		Named("stack").
		For(&terracev1.Stack{}, builder.WithPredicates(predicate.Or(outcome.GenerationOrRequestChanged(), predicate.AnnotationChangedPredicate{}))).
		Watches(&terracev1.Program{}, handler.EnqueueRequestsFromMapFunc(r.stacksForProgram),
			builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Watches(&terracev1.Stack{}, handler.EnqueueRequestsFromMapFunc(r.dependents),
			builder.WithPredicates(readyChanged{})).
		Watches(&terracev1.TerraceConfig{}, handler.EnqueueRequestsFromMapFunc(settings.StacksForConfig(mgr.GetClient(), r.Options.OperatorNamespace)),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.stacksForPolicyConfigMap),
			builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		WatchesRawSource(ctrlsource.Channel(r.scheduler.wakeups, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Build(r)
	if err != nil {
		return err
	}
	r.sources = &sourceWatches{controller: c, cache: mgr.GetCache(), mapper: mgr.GetRESTMapper(), stacks: r.stacksForSource}
	return nil
}

func (r *Reconciler) stacksForProgram(ctx context.Context, o client.Object) []reconcile.Request {
	var list terracev1.StackList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{programRefIndex: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "failed to list Stacks of a Program")
		return nil
	}
	return requests(list.Items)
}

func (r *Reconciler) dependents(ctx context.Context, o client.Object) []reconcile.Request {
	var list terracev1.StackList
	if err := r.Client.List(ctx, &list, client.MatchingFields{dependsOnIndex: o.GetNamespace() + "/" + o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "failed to list dependent Stacks")
		return nil
	}
	return requests(list.Items)
}

func requests(stacks []terracev1.Stack) []reconcile.Request {
	reqs := make([]reconcile.Request, 0, len(stacks))
	for _, s := range stacks {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
	}
	return reqs
}

// readyChanged passes Stack updates whose Ready condition changed, to wake
// the Stacks that depend on them.
type readyChanged struct{ predicate.Funcs }

func (readyChanged) Update(e event.UpdateEvent) bool {
	oldS, ok1 := e.ObjectOld.(*terracev1.Stack)
	newS, ok2 := e.ObjectNew.(*terracev1.Stack)
	if !ok1 || !ok2 {
		return false
	}
	o, n := outcome.Get(oldS, terracev1.ReadyCondition), outcome.Get(newS, terracev1.ReadyCondition)
	if o == nil || n == nil {
		return o != n
	}
	return o.Status != n.Status || o.ObservedGeneration != n.ObservedGeneration
}
