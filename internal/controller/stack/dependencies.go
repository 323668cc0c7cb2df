package stack

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
)

// DependencyNotReadyReason: a Stack in dependsOn is not Ready yet.
const DependencyNotReadyReason = "DependencyNotReady"

// checkDependencies records the Stacks in dependsOn that are not Ready at
// their current generation (waitForDependencies then waits for them).
func (r *Reconciler) checkDependencies(ctx context.Context, s *scope) error {
	var waiting []string
	for _, dep := range s.stack.Spec.DependsOn {
		ns := dep.Namespace
		if ns == "" {
			ns = s.stack.Namespace
		}
		if ns != s.stack.Namespace && !r.Options.AllowCrossNamespaceRefs {
			return outcome.Terminalf(CrossNamespaceRefusedReason, "dependsOn %s/%s is in another namespace; the controller refuses cross-namespace references (--allow-cross-namespace-refs)", ns, dep.Name)
		}
		key := types.NamespacedName{Namespace: ns, Name: dep.Name}
		var other terracev1.Stack
		err := r.Client.Get(ctx, key, &other)
		if apierrors.IsNotFound(err) && r.Options.Sharded && r.APIReader != nil {
			// Another shard's Stack is not in this shard's cache: read it
			// from the API server (its changes do not wake this Stack,
			// which looks again every DependencyRequeue).
			err = r.APIReader.Get(ctx, key, &other)
		}
		if err != nil {
			if apierrors.IsNotFound(err) {
				waiting = append(waiting, key.String()+" (not found)")
				continue
			}
			return fmt.Errorf("failed to get dependency %s: %w", key, err)
		}
		if !readyAtGeneration(&other) {
			waiting = append(waiting, key.String())
		}
	}
	s.observed.dependencyWait = strings.Join(waiting, ", ")
	return nil
}

// readyAtGeneration judges a dependency as Flux does: Ready=True for its
// current generation, and that generation observed. Reconciling alone
// does not make it not ready (full kstatus would): a dependent reading
// its dependency mid-run would wait for nothing.
func readyAtGeneration(dep *terracev1.Stack) bool {
	ready := outcome.Get(dep, terracev1.ReadyCondition)
	return dep.DeletionTimestamp.IsZero() && ready != nil && ready.Status == metav1.ConditionTrue &&
		(ready.ObservedGeneration == 0 || ready.ObservedGeneration == dep.Generation) &&
		dep.Status.ObservedGeneration == dep.Generation
}
