package importer

import (
	"context"
	"errors"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/state/migrate"
)

// ErrNoStateToAdopt: the object keeps its state in a backend of its own
// (spec.backend) or had none.
var ErrNoStateToAdopt = errors.New("no tofu-controller state Secret to adopt")

// AdoptState imports the object's tofu-controller state Secret into store
// as the Stack's state (namespace, name, workspace), verified; the Secret is
// kept and annotated. Re-running is safe.
func AdoptState(ctx context.Context, c client.Client, r Result, store state.Store) (migrate.AdoptResult, error) {
	if r.StateSecret == "" {
		return migrate.AdoptResult{}, ErrNoStateToAdopt
	}
	s := r.Stack
	if s.Namespace == "" {
		return migrate.AdoptResult{}, fmt.Errorf("Terraform %s has no namespace: pass --namespace", r.Source)
	}
	key := state.Key{Namespace: s.Namespace, Stack: s.Name, Workspace: s.Spec.Workspace}
	res, err := migrate.Adopt(ctx, c, s.Namespace, r.StateSecret, store, key)
	if err != nil {
		return res, fmt.Errorf("Terraform %s: %w", r.Source, err)
	}
	return res, nil
}
