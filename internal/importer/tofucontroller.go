// Package importer turns tofu-controller's Terraform objects
// (infra.contrib.fluxcd.io/v1alpha2) into Terrace Stacks. Every field of a
// Terraform spec is either mapped or listed, with the reason, as something
// the Stack does not carry over: nothing is dropped silently.
//
// It reads the objects as unstructured data, so it depends on neither
// tofu-controller's Go types nor (for the run options another part of
// Terrace defines) on Terrace's own: those fields are written as plain
// YAML next to the typed ones.
package importer

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state/migrate"
)

// The kind the importer reads.
const (
	TerraformGroup      = "infra.contrib.fluxcd.io"
	TerraformVersion    = "v1alpha2"
	TerraformAPIVersion = TerraformGroup + "/" + TerraformVersion
	TerraformKind       = "Terraform"
)

// Unmapped is one field of a Terraform object the Stack does not carry over.
type Unmapped struct {
	// Field is the Terraform object's field, e.g. spec.webhooks.
	Field string `json:"field"`
	// Reason says why, and what to do instead.
	Reason string `json:"reason"`
}

// Result is one Terraform object converted.
type Result struct {
	// Source names the Terraform object, namespace/name.
	Source string
	// Stack is the Stack, typed for the fields Terrace's API package defines.
	Stack *terracev1.Stack
	// RunOptions are spec fields written as plain YAML (targets,
	// parallelism, varsFiles, fileMappings, refresh, replace, healthChecks).
	RunOptions map[string]any
	// StateSecret is the tofu-controller state Secret to adopt
	// (tfstate-<workspace>-<suffix>); "" when the object keeps its state
	// elsewhere (a custom backend, which the Stack keeps as spec.backend).
	StateSecret string
	// Unmapped lists what the Stack does not carry over.
	Unmapped []Unmapped
	// Suspended is the Terraform object's spec.suspend: an object still
	// running would fight the Stack over the same resources.
	Suspended bool
}

// Object returns the Stack as an unstructured object, run options included.
func (r Result) Object() (map[string]any, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(r.Stack)
	if err != nil {
		return nil, fmt.Errorf("failed to encode Stack %s: %w", r.Stack.Name, err)
	}
	delete(obj, "status")
	meta, _ := obj["metadata"].(map[string]any)
	delete(meta, "creationTimestamp")
	spec, _ := obj["spec"].(map[string]any)
	for k, v := range r.RunOptions {
		spec[k] = v
	}
	return obj, nil
}

// converter carries one object's conversion.
type converter struct {
	stack      *terracev1.Stack
	runOptions map[string]any
	unmapped   []Unmapped
	// backendSuffix is spec.backendConfig.secretSuffix ("" for the name).
	backendSuffix string
	ownBackend    bool
	stateless     bool
}

func (c *converter) skip(field, format string, args ...any) {
	c.unmapped = append(c.unmapped, Unmapped{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Options change how objects are converted.
type Options struct {
	// KeepSuspend copies spec.suspend. By default it is not copied: the
	// Terraform objects are suspended for the move, and their Stacks
	// should run.
	KeepSuspend bool
}

// Convert maps one Terraform object. An object that is not a v1alpha2
// Terraform, or has no name or sourceRef, is an error; a field that cannot
// be mapped (or holds a value of the wrong type) is listed in Unmapped.
func Convert(obj *unstructured.Unstructured, opts Options) (Result, error) {
	if obj.GetAPIVersion() != TerraformAPIVersion || obj.GetKind() != TerraformKind {
		return Result{}, fmt.Errorf("%s %s is not a %s %s: only v1alpha2 Terraform objects are imported (convert v1alpha1 ones with tofu-controller first)", obj.GetAPIVersion()+"/"+obj.GetKind(), obj.GetName(), TerraformAPIVersion, TerraformKind)
	}
	name, ns := obj.GetName(), obj.GetNamespace()
	if name == "" {
		return Result{}, fmt.Errorf("a Terraform object has no metadata.name")
	}
	where := name
	if ns != "" {
		where = ns + "/" + name
	}
	spec, ok := obj.Object["spec"].(map[string]any)
	if !ok {
		return Result{}, fmt.Errorf("Terraform %s has no spec", where)
	}
	if _, ok := spec["sourceRef"]; !ok {
		return Result{}, fmt.Errorf("Terraform %s has no spec.sourceRef: a Stack needs a source", where)
	}
	c := &converter{
		stack: &terracev1.Stack{
			TypeMeta:   runtimeTypeMeta(),
			ObjectMeta: objectMeta(obj),
			Spec: terracev1.StackSpec{
				Workspace: "default",
				// tofu-controller looks for drift unless told not to.
				DriftDetection: &terracev1.DriftDetection{Mode: terracev1.DriftDetectionEnabled},
			},
		},
		runOptions: map[string]any{},
	}
	keys := make([]string, 0, len(spec))
	for k := range spec {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		field := "spec." + k
		mapField, known := specFields[k]
		if !known {
			c.skip(field, "not a field of tofu-controller's %s Terraform", TerraformVersion)
			continue
		}
		if err := mapField(c, field, spec[k]); err != nil {
			c.skip(field, "invalid value: %v", err)
		}
	}
	if c.stack.Spec.Source.SourceRef == nil {
		reason := "missing"
		for _, u := range c.unmapped {
			if u.Field == "spec.sourceRef" {
				reason = u.Reason
			}
		}
		return Result{}, fmt.Errorf("Terraform %s: spec.sourceRef: %s: a Stack needs a source", where, reason)
	}
	res := Result{Source: where, Stack: c.stack, RunOptions: c.runOptions, Unmapped: c.unmapped}
	res.Suspended = c.stack.Spec.Suspend
	if !opts.KeepSuspend {
		c.stack.Spec.Suspend = false
	}
	if !c.ownBackend && !c.stateless {
		suffix := c.backendSuffix
		if suffix == "" {
			suffix = name
		}
		res.StateSecret = migrate.TofuControllerSecretName(c.stack.Spec.Workspace, suffix)
	}
	if len(res.RunOptions) == 0 {
		res.RunOptions = nil
	}
	slices.SortStableFunc(res.Unmapped, func(a, b Unmapped) int {
		if a.Field < b.Field {
			return -1
		}
		if a.Field > b.Field {
			return 1
		}
		return 0
	})
	return res, nil
}

// decode converts an unstructured value into out through JSON.
func decode(v any, out any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// asJSON is a value as the Stack's free-form JSON fields hold it.
func asJSON(v any) (apiextensionsv1.JSON, error) {
	raw, err := json.Marshal(v)
	return apiextensionsv1.JSON{Raw: raw}, err
}
