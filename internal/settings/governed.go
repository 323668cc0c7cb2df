package settings

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// StacksForConfig maps a TerraceConfig event to the Stacks it governs: a
// namespace's config to that namespace's Stacks, the operator namespace's
// config to every Stack. c should be the manager's cached client. Use it as
//
//	Watches(&terracev1.TerraceConfig{}, handler.EnqueueRequestsFromMapFunc(settings.StacksForConfig(mgr.GetClient(), ns)))
func StacksForConfig(c client.Reader, operatorNamespace string) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		if obj.GetName() != terracev1.TerraceConfigName {
			return nil // the API refuses other names; ignore any that slipped in
		}
		var opts []client.ListOption
		if obj.GetNamespace() != operatorNamespace {
			opts = append(opts, client.InNamespace(obj.GetNamespace()))
		}
		stacks := &terracev1.StackList{}
		if err := c.List(ctx, stacks, opts...); err != nil {
			log.FromContext(ctx).Error(err, "failed to list stacks governed by a terrace config", "config", client.ObjectKeyFromObject(obj))
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(stacks.Items))
		for _, s := range stacks.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
		}
		return reqs
	}
}
