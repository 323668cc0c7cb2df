package reconcile

import (
	"context"
	"fmt"
	"slices"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// KstatusConditions are the conditions every Terrace controller owns on its
// own kind.
var KstatusConditions = []string{terracev1.ReadyCondition, terracev1.ReconcilingCondition, terracev1.StalledCondition}

// StatusPatcher writes the status of one object as a merge patch against
// the snapshot taken when it was created, so a reconcile sends only what it
// changed.
type StatusPatcher struct {
	client   client.Client
	snapshot Object
}

// NewStatusPatcher snapshots obj; call it right after reading obj.
func NewStatusPatcher(c client.Client, obj Object) *StatusPatcher {
	return &StatusPatcher{client: c, snapshot: obj.DeepCopyObject().(Object)}
}

// Patch sends obj's status changes since the snapshot. Of the conditions,
// only the owned types are taken from obj: when conditions changed, the
// latest object is read and its other conditions (written meanwhile by
// someone else) are kept. Nothing is sent when nothing changed.
func (p *StatusPatcher) Patch(ctx context.Context, obj Object, owned ...string) error {
	if !apiequality.Semantic.DeepEqual(p.snapshot.GetConditions(), obj.GetConditions()) {
		latest := obj.DeepCopyObject().(Object)
		if err := p.client.Get(ctx, client.ObjectKeyFromObject(obj), latest); err != nil {
			return fmt.Errorf("failed to read %s before patching its status: %w", obj.GetName(), err)
		}
		obj.SetConditions(mergeOwned(latest.GetConditions(), obj.GetConditions(), owned))
		// The conditions array is replaced whole by a merge patch; compare
		// it against what the server has, not the snapshot.
		p.snapshot.SetConditions(latest.GetConditions())
	}
	patch := client.MergeFrom(p.snapshot)
	data, err := patch.Data(obj)
	if err != nil {
		return fmt.Errorf("failed to compute status patch for %s: %w", obj.GetName(), err)
	}
	if string(data) == "{}" {
		return nil
	}
	if err := p.client.Status().Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("failed to patch status of %s: %w", obj.GetName(), err)
	}
	p.snapshot = obj.DeepCopyObject().(Object)
	return nil
}

// mergeOwned returns current with every owned type taken from ours: set
// where ours has it, removed where it does not. Others' conditions stay.
func mergeOwned(current, ours []metav1.Condition, owned []string) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(current)+len(ours))
	for _, c := range current {
		if !slices.Contains(owned, c.Type) {
			out = append(out, c)
		}
	}
	for _, c := range ours {
		if slices.Contains(owned, c.Type) {
			out = append(out, c)
		}
	}
	return out
}
