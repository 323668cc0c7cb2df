// Package ownership decides whether Terrace made an object for another
// object: the outputs Secret of a Stack, the values Secret of an
// installation. Terrace writes into or deletes only what it made; a Secret
// that merely carries a chosen name belongs to whoever made it.
//
// An object is Terrace's for an owner when it carries
// app.kubernetes.io/managed-by=terrace, the component label of its role, and
// a controller ownerReference to the owner's UID. The UID ties it to this
// owner, not to a later object of the same name; the labels keep selectors
// away from state Secrets that share terrace.dev/stack.
package ownership

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// Labels every object Terrace makes for an owner carries.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedByTerrace = "terrace"
	LabelComponent   = "app.kubernetes.io/component"

	// ComponentOutputs marks a Stack's spec.writeOutputsToSecret Secret.
	ComponentOutputs = "outputs"
	// ComponentValues marks an installation's values Secret.
	ComponentValues = "values"
	// ComponentInventory marks a Stack's inventory Secret (status.inventory.secretRef).
	ComponentInventory = "inventory"
)

// Claim marks obj as made by Terrace for owner in the given role: the
// labels plus a controller ownerReference, so that deleting the owner
// deletes obj. It refuses an object another controller already owns.
func Claim(obj client.Object, owner client.Object, component string, scheme *runtime.Scheme) error {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = ManagedByTerrace
	labels[LabelComponent] = component
	obj.SetLabels(labels)
	if err := controllerutil.SetControllerReference(owner, obj, scheme); err != nil {
		return fmt.Errorf("failed to make %s own %s: %w", owner.GetName(), obj.GetName(), err)
	}
	return nil
}

// Owns reports whether obj was made by Terrace for owner in the given role.
func Owns(obj, owner metav1.Object, component string) bool {
	if !Marked(obj, component) {
		return false
	}
	ref := metav1.GetControllerOfNoCopy(obj)
	return ref != nil && owner.GetUID() != "" && ref.UID == owner.GetUID() && ref.Name == owner.GetName()
}

// Marked reports whether obj carries Terrace's labels for the role,
// whoever its owner is.
func Marked(obj metav1.Object, component string) bool {
	labels := obj.GetLabels()
	return labels[LabelManagedBy] == ManagedByTerrace && labels[LabelComponent] == component
}

// Describe says, for a message, whose obj is when it is not the caller's:
// its controller, Terrace's own records, or somebody else's.
func Describe(obj metav1.Object) string {
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil {
		return fmt.Sprintf("it belongs to %s %s", ref.Kind, ref.Name)
	}
	if obj.GetLabels()[LabelManagedBy] == ManagedByTerrace {
		return "Terrace keeps other data in it"
	}
	return "Terrace did not create it"
}
