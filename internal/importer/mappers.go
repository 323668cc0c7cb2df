package importer

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
)

// tofu-controller's defaults where Terrace's differ.
const tofuControllerRetryInterval = 15e9 // 15s

func mapApprovePlan(c *converter, field string, v any) error {
	s, err := stringValue(v)
	if err != nil {
		return err
	}
	switch {
	case s == "" || s == terracev1.ApprovePlanAuto:
		c.stack.Spec.ApprovePlan = s
	case s == "disable":
		// tofu-controller's drift-detection-only mode: never apply, report drift.
		c.stack.Spec.PlanOnly = true
		c.stack.Spec.DriftDetection = &terracev1.DriftDetection{Mode: terracev1.DriftDetectionWarn}
	default:
		c.skip(field, "approval of tofu-controller plan %q is not carried over: the Stack makes its own plan; approve its id (status.plan.pending) with `terrace approve`", s)
	}
	return nil
}

func mapDestroy(c *converter, field string, v any) error {
	b, ok := v.(bool)
	if !ok {
		return fmt.Errorf("want a boolean, got %T", v)
	}
	if b {
		c.skip(field, "a Stack has no destroy plan field: delete it with spec.destroyOnDelete: true to destroy its resources")
	}
	return nil
}

func mapWorkspace(c *converter, _ string, v any) error {
	s, err := stringValue(v)
	if err != nil {
		return err
	}
	if s != "" {
		c.stack.Spec.Workspace = s
	}
	return nil
}

// mapVars keeps inline values; a valueFrom is kept only where Terrace's
// varsFrom can say the same (a key named like the variable).
func mapVars(c *converter, field string, v any) error {
	var vars []struct {
		Name      string               `json:"name"`
		Value     any                  `json:"value"`
		ValueFrom *corev1.EnvVarSource `json:"valueFrom"`
	}
	if err := decode(v, &vars); err != nil {
		return err
	}
	for i, tv := range vars {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case tv.Name == "":
			c.skip(f, "a variable without a name")
		case tv.ValueFrom != nil:
			c.mapValueFrom(f, tv.Name, tv.ValueFrom)
		default:
			raw, err := asJSON(tv.Value)
			if err != nil {
				return err
			}
			if c.stack.Spec.Vars == nil {
				c.stack.Spec.Vars = map[string]apiextensionsv1.JSON{}
			}
			c.stack.Spec.Vars[tv.Name] = raw
		}
	}
	return nil
}

func (c *converter) mapValueFrom(field, name string, from *corev1.EnvVarSource) {
	var ref terracev1.VarsReference
	switch {
	case from.SecretKeyRef != nil:
		ref = terracev1.VarsReference{Kind: "Secret", Name: from.SecretKeyRef.Name, Keys: []string{from.SecretKeyRef.Key}}
		ref.Optional = from.SecretKeyRef.Optional != nil && *from.SecretKeyRef.Optional
	case from.ConfigMapKeyRef != nil:
		ref = terracev1.VarsReference{Kind: "ConfigMap", Name: from.ConfigMapKeyRef.Name, Keys: []string{from.ConfigMapKeyRef.Key}}
		ref.Optional = from.ConfigMapKeyRef.Optional != nil && *from.ConfigMapKeyRef.Optional
	default:
		c.skip(field+".valueFrom", "only secretKeyRef and configMapKeyRef can be read as variables")
		return
	}
	if ref.Keys[0] != name {
		c.skip(field+".valueFrom", "variable %q comes from key %q of %s %s: spec.varsFrom names variables after their keys; add a key %q to it", name, ref.Keys[0], ref.Kind, ref.Name, name)
		return
	}
	c.stack.Spec.VarsFrom = append(c.stack.Spec.VarsFrom, ref)
}

func mapVarsFrom(c *converter, field string, v any) error {
	var refs []struct {
		Kind     string   `json:"kind"`
		Name     string   `json:"name"`
		VarsKeys []string `json:"varsKeys"`
		Optional bool     `json:"optional"`
	}
	if err := decode(v, &refs); err != nil {
		return err
	}
	for i, r := range refs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if (r.Kind != "Secret" && r.Kind != "ConfigMap") || r.Name == "" {
			c.skip(f, "kind must be Secret or ConfigMap and name set, got kind %q name %q", r.Kind, r.Name)
			continue
		}
		ref := terracev1.VarsReference{Kind: r.Kind, Name: r.Name, Optional: r.Optional}
		for _, k := range r.VarsKeys {
			if strings.Contains(k, ":") {
				c.skip(f+".varsKeys", "renaming %q is not supported: spec.varsFrom names variables after their keys", k)
				continue
			}
			ref.Keys = append(ref.Keys, k)
		}
		c.stack.Spec.VarsFrom = append(c.stack.Spec.VarsFrom, ref)
	}
	return nil
}

// mapValues: tofu-controller passes spec.values as the variable "values".
func mapValues(c *converter, _ string, v any) error {
	raw, err := asJSON(v)
	if err != nil {
		return err
	}
	if c.stack.Spec.Vars == nil {
		c.stack.Spec.Vars = map[string]apiextensionsv1.JSON{}
	}
	c.stack.Spec.Vars["values"] = raw
	return nil
}

// mapRetryStrategy: a static interval is a backoff capped at its start.
func mapRetryStrategy(c *converter, _ string, v any) error {
	s, err := stringValue(v)
	if err != nil {
		return err
	}
	switch s {
	case "", "ExponentialBackoff":
	case "StaticInterval":
		if c.stack.Spec.RetryInterval == nil {
			c.stack.Spec.RetryInterval = &metav1.Duration{Duration: tofuControllerRetryInterval}
		}
		c.stack.Spec.MaxRetryInterval = c.stack.Spec.RetryInterval.DeepCopy()
	default:
		return fmt.Errorf("unknown retry strategy %q", s)
	}
	return nil
}

func mapPath(c *converter, _ string, v any) error {
	s, err := stringValue(v)
	if err != nil {
		return err
	}
	p := path.Clean(strings.TrimPrefix(s, "/"))
	if p == "." {
		p = ""
	}
	if p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("path %q leaves the source", s)
	}
	c.stack.Spec.Path = p
	return nil
}

func mapSourceRef(c *converter, _ string, v any) error {
	var ref terracev1.SourceReference
	if err := decode(v, &ref); err != nil {
		return err
	}
	switch ref.Kind {
	case "GitRepository", "OCIRepository", "Bucket":
	default:
		return fmt.Errorf("kind %q is not a Flux GitRepository, OCIRepository or Bucket", ref.Kind)
	}
	if ref.Name == "" {
		return fmt.Errorf("sourceRef has no name")
	}
	if ref.Namespace == c.stack.Namespace {
		ref.Namespace = ""
	}
	c.stack.Spec.Source = terracev1.StackSource{SourceRef: &ref}
	return nil
}

func mapWriteOutputs(c *converter, field string, v any) error {
	var out terracev1.OutputsSecret
	if err := decode(v, &out); err != nil {
		return err
	}
	if out.Name == "" {
		return fmt.Errorf("writeOutputsToSecret has no name")
	}
	var kept []string
	for _, o := range out.Outputs {
		if strings.Contains(o, ":") {
			c.skip(field+".outputs", "renaming output %q is not supported: the Secret's keys are the outputs' names", o)
			continue
		}
		kept = append(kept, o)
	}
	out.Outputs = kept
	c.stack.Spec.WriteOutputsToSecret = &out
	return nil
}

func mapDisableDriftDetection(c *converter, _ string, v any) error {
	b, ok := v.(bool)
	if !ok {
		return fmt.Errorf("want a boolean, got %T", v)
	}
	if c.stack.Spec.PlanOnly && c.stack.Spec.DriftDetection != nil {
		return nil // approvePlan: disable already chose warn
	}
	mode := terracev1.DriftDetectionEnabled
	if b {
		mode = terracev1.DriftDetectionDisabled
	}
	c.stack.Spec.DriftDetection = &terracev1.DriftDetection{Mode: mode}
	return nil
}

// outputTemplate matches tofu-controller's {{.name}} references to outputs.
var outputTemplate = regexp.MustCompile(`\{\{\s*\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}`)

// mapHealthChecks rewrites {{.name}} as Terrace's {{ .outputs.name }}.
func mapHealthChecks(c *converter, field string, v any) error {
	var checks []map[string]any
	if err := decode(v, &checks); err != nil {
		return err
	}
	var out []any
	for i, hc := range checks {
		for _, k := range []string{"url", "address"} {
			if s, ok := hc[k].(string); ok {
				hc[k] = outputTemplate.ReplaceAllString(s, "{{ .outputs.$1 }}")
			}
		}
		if t, _ := hc["type"].(string); t != "http" && t != "tcp" {
			c.skip(fmt.Sprintf("%s[%d]", field, i), "health check type %q is neither http nor tcp", t)
			continue
		}
		out = append(out, hc)
	}
	if len(out) > 0 {
		c.runOptions["healthChecks"] = out
	}
	return nil
}

func mapServiceAccount(c *converter, _ string, v any) error {
	s, err := stringValue(v)
	if err != nil {
		return err
	}
	c.stack.Spec.ServiceAccountName = s
	return nil
}

// mapEnableInventory: every Stack reports status.inventory.
func mapEnableInventory(c *converter, field string, v any) error { return ignoredBool(c, field, v) }

func mapTFState(c *converter, field string, v any) error {
	var ts struct {
		ForceUnlock    string `json:"forceUnlock"`
		LockIdentifier string `json:"lockIdentifier"`
		LockTimeout    string `json:"lockTimeout"`
	}
	if err := decode(v, &ts); err != nil {
		return err
	}
	switch ts.ForceUnlock {
	case "", "no", "auto":
		// auto: Terrace releases the lock of a run that is gone by itself.
	case "yes":
		c.skip(field+".forceUnlock", "a one-off force-unlock is a command: `terrace force-unlock %s %s`", c.stack.Name, ts.LockIdentifier)
	default:
		return fmt.Errorf("forceUnlock %q is not yes, no or auto", ts.ForceUnlock)
	}
	if ts.LockTimeout != "" && ts.LockTimeout != "0s" {
		c.skip(field+".lockTimeout", "runs do not wait for a held lock: they fail and are retried with backoff")
	}
	return nil
}

func mapStoreReadablePlan(c *converter, _ string, v any) error {
	s, err := stringValue(v)
	if err != nil {
		return err
	}
	switch terracev1.ReadablePlanFormat(s) {
	case "":
	case terracev1.ReadablePlanNone, terracev1.ReadablePlanJSON, terracev1.ReadablePlanHuman:
		c.stack.Spec.StoreReadablePlan = terracev1.ReadablePlanFormat(s)
	default:
		return fmt.Errorf("storeReadablePlan %q is not none, json or human", s)
	}
	return nil
}

// mapDependsOn: the Stacks keep their Terraform objects' names.
func mapDependsOn(c *converter, _ string, v any) error {
	var deps []terracev1.DependencyReference
	if err := decode(v, &deps); err != nil {
		return err
	}
	for _, d := range deps {
		if d.Name == "" {
			return fmt.Errorf("a dependency without a name")
		}
		if d.Namespace == c.stack.Namespace {
			d.Namespace = ""
		}
		c.stack.Spec.DependsOn = append(c.stack.Spec.DependsOn, d)
	}
	return nil
}
