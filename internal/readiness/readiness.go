// Package readiness decides whether an object is Ready at its current
// generation, the way Flux, Argo CD and `kubectl wait` judge it: kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus/status) on the object, read through
// the Ready condition that Terrace's kinds carry. The demo, the CLI, the
// Installations API and the tests ask here, so they all agree.
package readiness

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/scheme"
)

// Compute returns kstatus's status of obj and a message saying why. On
// top of kstatus, which ignores Ready, an object that has a Ready
// condition, or is of Terrace's own group and so will have one, is Current
// only when ReadyAtGeneration holds: kstatus takes an object that has no
// conditions yet, or is Ready=False without Stalled, for a finished one.
func Compute(obj client.Object) (status.Status, string, error) {
	v, err := evaluate(obj)
	if err != nil {
		return status.UnknownStatus, "", err
	}
	switch {
	case v.kstatus.Status != status.CurrentStatus:
		return v.kstatus.Status, v.kstatus.Message, nil
	case v.ready == nil && v.u.GroupVersionKind().Group != terracev1.GroupVersion.Group:
		return status.CurrentStatus, v.kstatus.Message, nil
	}
	if why := v.notReadyAtGeneration(); why != "" {
		return status.InProgressStatus, why, nil
	}
	return status.CurrentStatus, v.readyText(), nil
}

// ReadyAtGeneration reports whether obj is Ready at its current
// generation: kstatus says Current (not deleting, status.observedGeneration
// not behind, neither Reconciling nor Stalled) and its Ready condition is
// True for this very generation (its observedGeneration, when it has one).
// Otherwise the message says why not.
func ReadyAtGeneration(obj client.Object) (bool, string, error) {
	v, err := evaluate(obj)
	if err != nil {
		return false, "", err
	}
	if v.kstatus.Status != status.CurrentStatus {
		return false, fmt.Sprintf("%s: %s", v.kstatus.Status, v.kstatus.Message), nil
	}
	if why := v.notReadyAtGeneration(); why != "" {
		return false, why, nil
	}
	return true, v.readyText(), nil
}

// verdict is what Compute and ReadyAtGeneration decide from.
type verdict struct {
	u       *unstructured.Unstructured
	kstatus *status.Result
	// ready is the Ready condition, or nil.
	ready *metav1.Condition
}

func evaluate(obj client.Object) (verdict, error) {
	u, err := toUnstructured(obj)
	if err != nil {
		return verdict{}, err
	}
	res, err := status.Compute(u)
	if err != nil {
		return verdict{}, fmt.Errorf("failed to compute the status of %s: %w", describe(u), err)
	}
	ready, err := readyCondition(u)
	if err != nil {
		return verdict{}, err
	}
	return verdict{u: u, kstatus: res, ready: ready}, nil
}

func (v verdict) readyText() string { return fmt.Sprintf("%s: %s", v.ready.Reason, v.ready.Message) }

// notReadyAtGeneration says why the Ready condition (possibly absent) is
// not a Ready=True for the object's generation, or "" when it is.
func (v verdict) notReadyAtGeneration() string {
	ready, generation := v.ready, v.u.GetGeneration()
	switch {
	case ready == nil:
		return "waiting for the controller to report Ready"
	case ready.Status != metav1.ConditionTrue:
		return fmt.Sprintf("Ready=%s %s: %s", ready.Status, ready.Reason, ready.Message)
	case ready.ObservedGeneration != 0 && ready.ObservedGeneration != generation:
		// A condition without observedGeneration (it is optional) is as
		// current as status.observedGeneration, which kstatus checked.
		return fmt.Sprintf("Ready is for generation %d, the object is at %d", ready.ObservedGeneration, generation)
	}
	return ""
}

// kinds names typed objects, which clients return without TypeMeta:
// kstatus picks its rules by kind, and Compute treats Terrace's own apart.
var kinds = scheme.New()

// toUnstructured returns obj as kstatus reads it, with its kind.
func toUnstructured(obj client.Object) (*unstructured.Unstructured, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u, nil
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s/%s as an unstructured object: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	u := &unstructured.Unstructured{Object: content}
	if u.GetKind() == "" {
		// A kind the scheme does not know gets kstatus's generic rules.
		if gvk, err := apiutil.GVKForObject(obj, kinds); err == nil {
			u.SetGroupVersionKind(gvk)
		}
	}
	return u, nil
}

// readyCondition returns u's Ready condition, or nil.
func readyCondition(u *unstructured.Unstructured) (*metav1.Condition, error) {
	raw, found, err := unstructured.NestedSlice(u.Object, "status", "conditions")
	if err != nil {
		return nil, fmt.Errorf("%s has status.conditions that are not a list: %w", describe(u), err)
	}
	if !found {
		return nil, nil
	}
	for _, item := range raw {
		m, ok := item.(map[string]any)
		if !ok || m["type"] != terracev1.ReadyCondition {
			continue
		}
		var c metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err != nil {
			return nil, fmt.Errorf("%s has a Ready condition that does not parse: %w", describe(u), err)
		}
		return &c, nil
	}
	return nil, nil
}

func describe(u *unstructured.Unstructured) string {
	kind := u.GetKind()
	if kind == "" {
		kind = "object"
	}
	if ns := u.GetNamespace(); ns != "" {
		return kind + " " + ns + "/" + u.GetName()
	}
	return kind + " " + u.GetName()
}
