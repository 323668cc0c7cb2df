package stack

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/reconcile"
	"github.com/terrace-dev/terrace/internal/readiness"
)

// DependencyNotReadyReason: a Stack in dependsOn is not Ready yet.
const DependencyNotReadyReason = "DependencyNotReady"

// checkDependencies waits until every Stack in dependsOn is Ready at its
// current generation.
func (r *Reconciler) checkDependencies(ctx context.Context, s *scope) error {
	var waiting []string
	for _, dep := range s.stack.Spec.DependsOn {
		ns := dep.Namespace
		if ns == "" {
			ns = s.stack.Namespace
		}
		if ns != s.stack.Namespace && !r.Options.AllowCrossNamespaceRefs {
			return reconcile.Terminalf(CrossNamespaceRefusedReason, "dependsOn %s/%s is in another namespace; the controller refuses cross-namespace references (--allow-cross-namespace-refs)", ns, dep.Name)
		}
		key := types.NamespacedName{Namespace: ns, Name: dep.Name}
		var other terracev1.Stack
		if err := r.Client.Get(ctx, key, &other); err != nil {
			if apierrors.IsNotFound(err) {
				waiting = append(waiting, key.String()+" (not found)")
				continue
			}
			return fmt.Errorf("failed to get dependency %s: %w", key, err)
		}
		ok, _, err := readiness.ReadyAtGeneration(&other)
		if err != nil {
			return fmt.Errorf("failed to read the readiness of dependency %s: %w", key, err)
		}
		if !ok {
			waiting = append(waiting, key.String())
		}
	}
	if len(waiting) > 0 {
		s.observed.dependencyWait = strings.Join(waiting, ", ")
		after := r.Options.DependencyRequeue
		if after <= 0 {
			after = 30 * time.Second
		}
		return reconcile.Waiting(DependencyNotReadyReason, after, fmt.Errorf("waiting for dependencies to be Ready: %s", s.observed.dependencyWait))
	}
	return nil
}
