package warmpool

import (
	"context"
	"fmt"
	"sort"

	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/settings"
)

// SpecFor is the RunSpec of a run under settings eff (Stack and RunID
// unset): the Stack controller and the pool build runs of a class alike.
func SpecFor(eff settings.Effective, providerMirror string) launcher.RunSpec {
	return launcher.RunSpec{
		Image:              eff.RunnerImage,
		Binary:             eff.Binary,
		ServiceAccountName: eff.ServiceAccountName,
		Resources:          eff.Resources,
		Env:                eff.Env,
		ProviderMirror:     providerMirror,
		Retain:             eff.Retain,
		// The launcher checks the policy again right before it creates
		// anything: no path to a runner pod skips it.
		Policy:              &eff.RunnerPolicy,
		ImageField:          eff.RunnerImageField,
		ServiceAccountField: eff.ServiceAccountField,
	}
}

// NamespaceDemand wants, in every namespace that has Stacks or a
// TerraceConfig of its own, spec.runner.warm pods of the class a Stack
// setting no runner fields of its own gets there. Namespaces without
// either (or gone) want none, so their pods are removed.
type NamespaceDemand struct {
	// Reader is the manager's cached client (TerraceConfigs).
	Reader client.Reader
	// Stacks knows the namespaces that hold Stacks (WatchStackNamespaces).
	Stacks   *StackNamespaces
	Resolver *settings.Resolver
	// ProviderMirror is the controller's --runner-provider-mirror.
	ProviderMirror string
}

// Wants implements Options.Demand.
func (d *NamespaceDemand) Wants(ctx context.Context) ([]Want, error) {
	namespaces := map[string]bool{}
	withStacks, err := d.Stacks.Namespaces(ctx)
	if err != nil {
		return nil, err
	}
	for _, ns := range withStacks {
		namespaces[ns] = true
	}
	var configs terracev1.TerraceConfigList
	if err := d.Reader.List(ctx, &configs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("failed to list TerraceConfigs: %w", err)
	}
	for i := range configs.Items {
		if ns := configs.Items[i].Namespace; ns != d.Resolver.OperatorNamespace {
			namespaces[ns] = true
		}
	}
	var wants []Want
	for ns := range namespaces {
		eff, err := d.Resolver.ResolveNamespace(ctx, ns)
		if err != nil {
			return nil, err
		}
		if eff.Warm <= 0 || eff.CheckConfigRunner() != nil {
			continue
		}
		spec := SpecFor(eff, d.ProviderMirror)
		spec.Stack = &terracev1.Stack{}
		class, ok := launcher.Class(spec)
		if !ok {
			continue
		}
		spec.Stack = nil
		wants = append(wants, Want{Namespace: ns, Class: class, Count: int(eff.Warm), Spec: spec})
	}
	sort.Slice(wants, func(i, j int) bool { return wants[i].Namespace < wants[j].Namespace })
	return wants, nil
}
