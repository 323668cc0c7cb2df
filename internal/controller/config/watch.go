package config

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// configsForOperatorConfig maps a change of the operator namespace's config
// to every other TerraceConfig, whose effective backend may depend on it.
func configsForOperatorConfig(c client.Reader, operatorNamespace string) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		if obj.GetNamespace() != operatorNamespace {
			return nil
		}
		configs := &terracev1.TerraceConfigList{}
		if err := c.List(ctx, configs); err != nil {
			log.FromContext(ctx).Error(err, "failed to list terrace configs")
			return nil
		}
		var reqs []reconcile.Request
		for _, cfg := range configs.Items {
			if cfg.Namespace != operatorNamespace {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: cfg.Namespace, Name: cfg.Name}})
			}
		}
		return reqs
	}
}

// configForSecret maps a Secret event to the TerraceConfig of the Secret's
// namespace when that config references the Secret, so fixing a missing
// Secret clears Stalled without waiting for a resync.
func configForSecret(c client.Reader) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		cfg := &terracev1.TerraceConfig{}
		key := types.NamespacedName{Namespace: obj.GetNamespace(), Name: terracev1.TerraceConfigName}
		if err := c.Get(ctx, key, cfg); err != nil {
			return nil // no config here (or a cache error the next event retries)
		}
		for _, ref := range secretRefs(cfg) {
			if ref.name == obj.GetName() {
				return []reconcile.Request{{NamespacedName: key}}
			}
		}
		return nil
	}
}

// operatorConfigFor maps an event of a namespace's config to the operator
// namespace's config, which governs the state backend of every namespace
// whose own config names none.
func operatorConfigFor(operatorNamespace string) handler.MapFunc {
	return func(_ context.Context, obj client.Object) []reconcile.Request {
		if obj.GetNamespace() == operatorNamespace {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: operatorNamespace, Name: terracev1.TerraceConfigName}}}
	}
}
