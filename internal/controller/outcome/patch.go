package outcome

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// KstatusConditions are the conditions every Terrace controller owns on its
// own kind.
var KstatusConditions = []string{terracev1.ReadyCondition, terracev1.ReconcilingCondition, terracev1.StalledCondition}

// maxPatchAttempts bounds the re-reads after a conflict: each one means
// someone else wrote the object between our read and our patch.
const maxPatchAttempts = 5

// StatusPatcher writes the status of one object. A patch carries the
// resourceVersion it was computed against (an optimistic lock), so nobody
// else's write between that read and the patch is overwritten. On a
// conflict the latest object is read and the same changes are laid over
// it again: fields this reconcile changed win, the rest is theirs.
//
// fluxcd/pkg/runtime's patch.SerialPatcher does the same job; it brings the
// whole Flux runtime (and its Kubernetes versions) for 80 lines, so this
// keeps its own with the lock Flux's lacks by default.
type StatusPatcher struct {
	client client.Client
	// snapshot is the object as this reconcile first read it (and as its
	// own patches left it): what its changes are measured from.
	snapshot Object
	// base is the object the next patch is computed against: the
	// snapshot, or the latest read after a conflict.
	base Object
}

// NewStatusPatcher snapshots obj; call it right after reading obj.
func NewStatusPatcher(c client.Client, obj Object) *StatusPatcher {
	snap := obj.DeepCopyObject().(Object)
	return &StatusPatcher{client: c, snapshot: snap, base: snap}
}

// Patch sends obj's status changes since the snapshot. Of the conditions,
// only the owned types are taken from obj; others' conditions stay as the
// server has them. Nothing is sent when nothing changed. On success obj
// holds the status and resourceVersion the server stored.
func (p *StatusPatcher) Patch(ctx context.Context, obj Object, owned ...string) error {
	delta, err := statusDelta(p.snapshot, obj)
	if err != nil {
		return err
	}
	if delta == nil && apiequality.Semantic.DeepEqual(p.snapshot.GetConditions(), obj.GetConditions()) {
		return nil
	}
	for attempt := 1; ; attempt++ {
		desired, err := overlay(p.base, delta)
		if err != nil {
			return err
		}
		desired.SetConditions(mergeOwned(p.base.GetConditions(), obj.GetConditions(), owned))
		if apiequality.Semantic.DeepEqual(desired, p.base) {
			return nil // only others' conditions differed
		}
		err = p.client.Status().Patch(ctx, desired, client.MergeFromWithOptions(p.base, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			p.adopt(obj, desired)
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == maxPatchAttempts {
			return fmt.Errorf("failed to patch status of %s: %w", obj.GetName(), err)
		}
		latest := obj.DeepCopyObject().(Object)
		if err := p.client.Get(ctx, client.ObjectKeyFromObject(obj), latest); err != nil {
			return fmt.Errorf("failed to read %s after a conflicting write: %w", obj.GetName(), err)
		}
		p.base = latest
	}
}

// adopt makes obj the object the server stored (status, version and all)
// and the snapshot the next patch of this reconcile starts from.
func (p *StatusPatcher) adopt(obj, stored Object) {
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(stored).Elem())
	p.snapshot = obj.DeepCopyObject().(Object)
	p.base = p.snapshot
}

// statusDelta is the JSON merge patch of the status (only) from before to
// after, or nil when the status did not change. Conditions are left out:
// they are merged by type, not replaced.
func statusDelta(before, after Object) ([]byte, error) {
	patch, err := client.MergeFrom(before).Data(after)
	if err != nil {
		return nil, fmt.Errorf("failed to compute the status patch of %s: %w", after.GetName(), err)
	}
	var whole map[string]json.RawMessage
	if err := json.Unmarshal(patch, &whole); err != nil {
		return nil, err
	}
	status, ok := whole["status"]
	if !ok {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(status, &fields); err != nil {
		return nil, err
	}
	delete(fields, "conditions")
	if len(fields) == 0 {
		return nil, nil
	}
	return json.Marshal(map[string]any{"status": fields})
}

// overlay applies a status merge patch to a copy of base.
func overlay(base Object, delta []byte) (Object, error) {
	if delta == nil {
		return base.DeepCopyObject().(Object), nil
	}
	data, err := json.Marshal(base)
	if err != nil {
		return nil, err
	}
	merged, err := jsonpatch.MergePatch(data, delta)
	if err != nil {
		return nil, fmt.Errorf("failed to apply the status changes of %s: %w", base.GetName(), err)
	}
	// Decode into a zero object: a field the patch removed (omitempty
	// zero values are left out of the JSON) must not keep base's value.
	out := reflect.New(reflect.TypeOf(base).Elem()).Interface().(Object)
	if err := json.Unmarshal(merged, out); err != nil {
		return nil, err
	}
	return out, nil
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
