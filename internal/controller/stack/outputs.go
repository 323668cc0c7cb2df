package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/controller/outcome"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/ownership"
	"github.com/terrace-dev/terrace/internal/pki"
	"github.com/terrace-dev/terrace/internal/runner"
	"github.com/terrace-dev/terrace/internal/state"
)

// OutputsSecretConflictReason: spec.writeOutputsToSecret names a Secret
// Terrace did not create for this Stack. Terrace never writes into or
// deletes such a Secret: someone who may edit Stacks but not Secrets must
// not be able to overwrite or garbage-collect the namespace's Secrets.
const OutputsSecretConflictReason = "OutputsSecretConflict"

// checkOutputsSecret refuses, before anything runs, a Stack whose
// writeOutputsToSecret names a Secret that is not its own: nothing is
// planned or applied whose outputs could not be written.
func (r *Reconciler) checkOutputsSecret(ctx context.Context, s *scope) error {
	spec := s.stack.Spec.WriteOutputsToSecret
	if spec == nil {
		return nil
	}
	_, err := r.ownedOutputsSecret(ctx, s.stack, spec.Name)
	return err
}

// ownedOutputsSecret reads the named Secret uncached: nil when it does not
// exist, the Secret when Terrace made it for this Stack, and a terminal
// OutputsSecretConflict otherwise.
func (r *Reconciler) ownedOutputsSecret(ctx context.Context, stack *terracev1.Stack, name string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read outputs Secret %s: %w", name, err)
	}
	if !ownership.Owns(sec, stack, ownership.ComponentOutputs) {
		return nil, outcome.Terminalf(OutputsSecretConflictReason,
			"spec.writeOutputsToSecret: Secret %s already exists and %s, so Terrace leaves it untouched: "+
				"set spec.writeOutputsToSecret.name to a Secret that does not exist yet (Terrace creates it), or delete Secret %s if nothing needs it",
			name, ownership.Describe(sec), name)
	}
	return sec, nil
}

// writeOutputs writes the outputs into the Stack's own outputs Secret,
// creating it, and removes the Stack's outputs Secrets of earlier names.
func (r *Reconciler) writeOutputs(ctx context.Context, s *scope, outputs map[string]runner.Output) error {
	spec := s.stack.Spec.WriteOutputsToSecret
	if spec == nil {
		return r.removePreviousOutputsSecret(ctx, s, "")
	}
	existing, err := r.ownedOutputsSecret(ctx, s.stack, spec.Name)
	if err != nil {
		return err
	}
	data := map[string][]byte{}
	for name, o := range outputs {
		if len(spec.Outputs) == 0 || slices.Contains(spec.Outputs, name) {
			data[name] = outputBytes(o)
		}
	}
	forced := map[string]string{launcher.LabelStack: launcher.StackLabelValue(s.stack.Name)}
	if existing == nil {
		sec := &corev1.Secret{Type: corev1.SecretTypeOpaque, Data: data}
		sec.Name, sec.Namespace = spec.Name, s.stack.Namespace
		sec.Labels = mergeMaps(nil, spec.Labels, forced)
		sec.Annotations = mergeMaps(nil, spec.Annotations, nil)
		if err := ownership.Claim(sec, s.stack, ownership.ComponentOutputs, r.Client.Scheme()); err != nil {
			return err
		}
		// AlreadyExists means someone created it since the read: the retry
		// reads it again and decides whose it is.
		if err := r.Client.Create(ctx, sec); err != nil {
			return fmt.Errorf("failed to create outputs Secret %s: %w", spec.Name, err)
		}
	} else {
		before := existing.DeepCopy()
		existing.Data = data
		existing.Labels = mergeMaps(existing.Labels, spec.Labels, mergeMaps(forced, nil, ownedLabels()))
		existing.Annotations = mergeMaps(existing.Annotations, spec.Annotations, nil)
		if !maps.EqualFunc(before.Data, existing.Data, slices.Equal) || !maps.Equal(before.Labels, existing.Labels) ||
			!maps.Equal(before.Annotations, existing.Annotations) {
			// Update carries the resourceVersion read with the ownership
			// check: a Secret replaced since is a conflict, never overwritten.
			if err := r.Client.Update(ctx, existing); err != nil {
				return fmt.Errorf("failed to write outputs to Secret %s: %w", spec.Name, err)
			}
		}
	}
	return r.removePreviousOutputsSecret(ctx, s, spec.Name)
}

// removePreviousOutputsSecret removes the outputs Secret of an earlier
// name (or of a spec that no longer asks for one), found by the name the
// status recorded; keep is the current name, or "". Only the first write
// of a Stack, which has no name recorded yet (or Stacks from before the
// status held it), searches the namespace.
func (r *Reconciler) removePreviousOutputsSecret(ctx context.Context, s *scope, keep string) error {
	prev := s.recorded().OutputsSecret
	var err error
	switch {
	case prev == keep:
	case prev == "":
		err = r.removeOutputsSecrets(ctx, s, keep)
	default:
		var sec *corev1.Secret
		sec, err = r.ownedOutputsSecret(ctx, s.stack, prev)
		var terminal *outcome.TerminalError
		switch {
		case errors.As(err, &terminal):
			err = nil // not ours (any more): never touched
		case err == nil && sec != nil:
			err = r.deleteOutputsSecret(ctx, s, sec, keep)
		}
	}
	if err != nil {
		return err
	}
	// Recorded only once the earlier one is gone: a failed removal is
	// tried again from the same name.
	s.observed.outputsSecret = &keep
	return nil
}

func ownedLabels() map[string]string {
	return map[string]string{ownership.LabelManagedBy: ownership.ManagedByTerrace, ownership.LabelComponent: ownership.ComponentOutputs}
}

// syncOutputs brings the outputs Secret in line with the spec after a plan
// without changes: writeOutputsToSecret may have been set, renamed or
// removed since the last apply, which changes nothing tofu would plan.
// planOnly Stacks never write outputs.
func (r *Reconciler) syncOutputs(ctx context.Context, s *scope) error {
	if s.run.kind != runPlan || s.stack.Spec.PlanOnly {
		return nil
	}
	if s.stack.Spec.WriteOutputsToSecret == nil {
		return r.removePreviousOutputsSecret(ctx, s, "")
	}
	outputs, err := runOutputs(ctx, s)
	if err != nil {
		return fmt.Errorf("failed to read outputs: %w", err)
	}
	return r.writeOutputs(ctx, s, outputs)
}

// runOutputs reads the root outputs from the state the controller keeps
// for the Stack (one read, no tofu process in the runner); only when tofu
// itself encrypts the state, or it cannot be read, does the runner run
// `tofu output`. A Stack with a backend of its own (spec.backend) keeps
// no state here: the runner reads it.
func runOutputs(ctx context.Context, s *scope) (map[string]runner.Output, error) {
	if ownsBackend(s.stack) {
		return s.run.client.Outputs(ctx)
	}
	st, err := stateAfterRun(ctx, s)
	if err != nil {
		return s.run.client.Outputs(ctx)
	}
	return s.run.client.OutputsFrom(ctx, st.Data)
}

// stateAfterRun reads the Stack's state as its run left it, once: the
// outputs, the release record's serial and the inventory all come from
// that one read. Call it only once the runner is done with the state.
// When this replica released the run's apply lock, the state is the copy
// that release left, with no read of the index; otherwise (the run's
// requests went to another replica, or it took no apply lock) it is read.
func stateAfterRun(ctx context.Context, s *scope) (*state.State, error) {
	if s.run.after == nil {
		owner := string(pki.RunnerIdentity(s.stack.Namespace, s.stack.Name, s.run.id))
		st, err := state.StateAfterApply(ctx, s.run.stores.States, stateKey(s.stack), owner)
		s.run.after = &stateRead{state: st, err: err}
	}
	return s.run.after.state, s.run.after.err
}

// removeOutputsSecrets deletes the outputs Secrets Terrace made for this
// Stack, except keep. Ownership is decided from what the API server holds
// now, never from the spec, and each delete is conditional on the UID and
// resourceVersion just checked: a Secret put in an owned one's place since
// is left alone.
func (r *Reconciler) removeOutputsSecrets(ctx context.Context, s *scope, keep string) error {
	var list corev1.SecretList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(s.stack.Namespace), client.MatchingLabels(ownedLabels())); err != nil {
		return fmt.Errorf("failed to list outputs Secrets: %w", err)
	}
	for i := range list.Items {
		sec := &list.Items[i]
		if sec.Name == keep || !ownership.Owns(sec, s.stack, ownership.ComponentOutputs) {
			continue
		}
		if err := r.deleteOutputsSecret(ctx, s, sec, keep); err != nil {
			return err
		}
	}
	return nil
}

// deleteOutputsSecret deletes an outputs Secret found to be this Stack's,
// on condition that it is still the object (UID, version) just checked.
func (r *Reconciler) deleteOutputsSecret(ctx context.Context, s *scope, sec *corev1.Secret, keep string) error {
	uid, version := sec.UID, sec.ResourceVersion
	err := r.Client.Delete(ctx, sec, client.Preconditions{UID: &uid, ResourceVersion: &version})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to delete outputs Secret %s: %w", sec.Name, err)
	}
	switch {
	case keep != "":
		r.normalEvent(s.stack, "OutputsSecretRemoved", "removed outputs Secret %s: spec.writeOutputsToSecret names %s now", sec.Name, keep)
	case s.stack.DeletionTimestamp.IsZero():
		r.normalEvent(s.stack, "OutputsSecretRemoved", "removed outputs Secret %s: spec.writeOutputsToSecret is no longer set", sec.Name)
	}
	return nil
}

// outputBytes stores a string output as its text and anything else as JSON,
// as tofu-controller does, so consumers can mount strings directly.
func outputBytes(o runner.Output) []byte {
	var str string
	if err := json.Unmarshal(o.Value, &str); err == nil {
		return []byte(str)
	}
	return o.Value
}
