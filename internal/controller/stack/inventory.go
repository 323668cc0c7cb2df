package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/launcher"
	"github.com/terrace-dev/terrace/internal/ownership"
	"github.com/terrace-dev/terrace/internal/state"
	"github.com/terrace-dev/terrace/internal/tf"
)

// inventorySecretKey holds every address, one per line.
const inventorySecretKey = "resources"

// inventorySecretName is the Secret a large inventory is written to.
func inventorySecretName(stack *terracev1.Stack) string {
	return stack.Name + "-inventory"
}

// recordInventory reads the resources in the Stack's state, as the store
// holds it after the run, into the observations: the addresses themselves
// when there are few, else a Secret of the Stack's own. A state that
// cannot be read (encrypted by tofu, or in the Stack's own backend)
// leaves the inventory as it was.
func (r *Reconciler) recordInventory(ctx context.Context, s *scope) error {
	if s.stack.Spec.Backend != nil {
		// The state is in the Stack's own backend, which the controller
		// never reads: no inventory (rather than a wrong empty one).
		return nil
	}
	st, err := stateAfterRun(ctx, s)
	var data []byte
	switch {
	case errors.Is(err, state.ErrNotFound):
	case err != nil:
		return fmt.Errorf("failed to read the state for the inventory: %w", err)
	default:
		data = st.Data
	}
	addresses, err := tf.InventoryFromState(data)
	if errors.Is(err, tf.ErrStateEncrypted) {
		s.log.V(1).Info("the state is encrypted by tofu: the inventory is not updated")
		return nil
	}
	if err != nil {
		return err
	}
	inv := &terracev1.Inventory{Count: int32(len(addresses))}
	if len(addresses) <= terracev1.InventoryLimit {
		inv.Resources = addresses
		s.observed.inventory = inv
		return nil
	}
	if err := r.writeInventorySecret(ctx, s, addresses); err != nil {
		return err
	}
	inv.SecretRef = &terracev1.LocalObjectReference{Name: inventorySecretName(s.stack)}
	s.observed.inventory = inv
	return nil
}

// writeInventorySecret creates or updates the Stack's inventory Secret. A
// Secret of that name that is not the Stack's own is never touched.
func (r *Reconciler) writeInventorySecret(ctx context.Context, s *scope, addresses []string) error {
	name := inventorySecretName(s.stack)
	data := map[string][]byte{inventorySecretKey: []byte(strings.Join(addresses, "\n") + "\n")}
	sec := &corev1.Secret{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.stack.Namespace, Name: name}, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = &corev1.Secret{Type: corev1.SecretTypeOpaque, Data: data}
		sec.Name, sec.Namespace = name, s.stack.Namespace
		sec.Labels = map[string]string{launcher.LabelStack: launcher.StackLabelValue(s.stack.Name)}
		if err := ownership.Claim(sec, s.stack, ownership.ComponentInventory, r.Client.Scheme()); err != nil {
			return err
		}
		if err := r.Client.Create(ctx, sec); err != nil {
			return fmt.Errorf("failed to create inventory Secret %s: %w", name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("failed to read inventory Secret %s: %w", name, err)
	case !ownership.Owns(sec, s.stack, ownership.ComponentInventory):
		return fmt.Errorf("the inventory has %d resources, more than status lists, and Secret %s, where Terrace would write it, %s: delete or rename it",
			len(addresses), name, ownership.Describe(sec))
	}
	sec.Data = data
	if err := r.Client.Update(ctx, sec); err != nil {
		return fmt.Errorf("failed to write inventory Secret %s: %w", name, err)
	}
	return nil
}
