package tf

// The plan's side of redaction: tofu's `show -json` document walked field by
// field, with the sensitivity marks it carries.

import (
	"bytes"
	"encoding/json"
)

// RedactPlanJSON returns tofu's `show -json` plan with every sensitive
// value replaced: sensitive root variables (declared so, or named in
// extraSensitive), values marked by sensitive_values / before_sensitive /
// after_sensitive in planned values, prior state, resource changes and
// drift, sensitive outputs, and the defaults of sensitive variables in the
// configuration. Every such value is taught to r first, and the result is
// then scrubbed of every known secret, so a copy of a sensitive value in
// an unmarked place is replaced too.
func (r *Redactor) RedactPlanJSON(raw []byte, extraSensitive []string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var plan map[string]any
	if err := dec.Decode(&plan); err != nil {
		return nil, err
	}
	sensitiveVars := map[string]bool{}
	for _, name := range extraSensitive {
		sensitiveVars[name] = true
	}
	config, _ := plan["configuration"].(map[string]any)
	rootConfig, _ := config["root_module"].(map[string]any)
	if decls, ok := rootConfig["variables"].(map[string]any); ok {
		for name, d := range decls {
			decl, _ := d.(map[string]any)
			if s, _ := decl["sensitive"].(bool); s {
				sensitiveVars[name] = true
			}
		}
		for name, d := range decls {
			decl, _ := d.(map[string]any)
			if sensitiveVars[name] {
				if def, ok := decl["default"]; ok && def != nil {
					r.AddValue(def)
					decl["default"] = Redacted
				}
			}
		}
	}
	if vars, ok := plan["variables"].(map[string]any); ok {
		for name, v := range vars {
			pv, _ := v.(map[string]any)
			if pv == nil || !sensitiveVars[name] {
				continue
			}
			if val, ok := pv["value"]; ok && val != nil {
				r.AddValue(val)
				pv["value"] = Redacted
			}
		}
	}
	for _, key := range []string{"planned_values", "prior_state"} {
		values, _ := plan[key].(map[string]any)
		if key == "prior_state" {
			values, _ = values["values"].(map[string]any)
		}
		r.redactStateValues(values)
	}
	for _, key := range []string{"resource_changes", "resource_drift"} {
		changes, _ := plan[key].([]any)
		for _, c := range changes {
			rc, _ := c.(map[string]any)
			change, _ := rc["change"].(map[string]any)
			r.redactChange(change, false)
		}
	}
	if outs, ok := plan["output_changes"].(map[string]any); ok {
		sensitiveOutputs := outputSensitivity(plan)
		for name, c := range outs {
			change, _ := c.(map[string]any)
			r.redactChange(change, sensitiveOutputs[name])
		}
	}
	// Sensitive values were taught above; now replace copies anywhere else:
	// whole values equal to a secret where the plan holds values, secret
	// text in every string.
	r.maskPlanValues(plan)
	return json.Marshal(r.maskPlanText(plan))
}

// maskPlanValues applies maskJSON where a plan holds values (variables,
// resource and output values before and after, prior state, constants and
// defaults of the configuration, instance keys), so a number or boolean
// equal to a secret is replaced there but never in the plan's own
// structure (versions, counts, the booleans of sensitivity masks).
func (r *Redactor) maskPlanValues(plan map[string]any) {
	maskField := func(obj map[string]any, keys ...string) {
		for _, k := range keys {
			if v, ok := obj[k]; ok {
				obj[k] = r.maskJSON(v)
			}
		}
	}
	for _, v := range asMap(plan["variables"]) {
		maskField(asMap(v), "value")
	}
	for _, values := range []map[string]any{asMap(plan["planned_values"]), asMap(asMap(plan["prior_state"])["values"])} {
		for _, o := range asMap(values["outputs"]) {
			maskField(asMap(o), "value")
		}
		r.maskModuleValues(asMap(values["root_module"]), maskField)
	}
	for _, key := range []string{"resource_changes", "resource_drift"} {
		for _, c := range asSlice(plan[key]) {
			rc := asMap(c)
			maskField(rc, "index")
			maskField(asMap(rc["change"]), "before", "after")
		}
	}
	for _, c := range asMap(plan["output_changes"]) {
		maskField(asMap(c), "before", "after")
	}
	r.maskConfigValues(plan["configuration"])
}

func (r *Redactor) maskModuleValues(mod map[string]any, maskField func(map[string]any, ...string)) {
	for _, res := range asSlice(mod["resources"]) {
		maskField(asMap(res), "values", "index")
	}
	for _, c := range asSlice(mod["child_modules"]) {
		r.maskModuleValues(asMap(c), maskField)
	}
}

// maskConfigValues masks every constant_value and default in the configuration.
func (r *Redactor) maskConfigValues(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if k == "constant_value" || k == "default" {
				t[k] = r.maskJSON(e)
				continue
			}
			r.maskConfigValues(e)
		}
	case []any:
		for _, e := range t {
			r.maskConfigValues(e)
		}
	}
}

// planVersionFields hold tofu's versions ("1.2", "1.12.6"), never a value
// of the module: a short secret such as "1" must not rewrite them.
var planVersionFields = map[string]bool{"format_version": true, "terraform_version": true}

// maskPlanText scrubs secret text from every string of the plan, and long
// secret text from object keys (addresses, map keys).
func (r *Redactor) maskPlanText(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			if s, ok := e.(string); ok && planVersionFields[k] {
				out[k] = s
				continue
			}
			out[r.longOnly(k)] = r.maskPlanText(e)
		}
		return out
	case []any:
		for i := range t {
			t[i] = r.maskPlanText(t[i])
		}
		return t
	case string:
		return r.String(t)
	}
	return v
}

// longOnly replaces long secret text only.
func (r *Redactor) longOnly(s string) string {
	r.mu.RLock()
	rep := r.replacer
	r.mu.RUnlock()
	if rep == nil {
		return s
	}
	return rep.Replace(s)
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// outputSensitivity reads which root outputs are declared sensitive.
func outputSensitivity(plan map[string]any) map[string]bool {
	res := map[string]bool{}
	config, _ := plan["configuration"].(map[string]any)
	root, _ := config["root_module"].(map[string]any)
	outs, _ := root["outputs"].(map[string]any)
	for name, o := range outs {
		decl, _ := o.(map[string]any)
		if s, _ := decl["sensitive"].(bool); s {
			res[name] = true
		}
	}
	planned, _ := plan["planned_values"].(map[string]any)
	pouts, _ := planned["outputs"].(map[string]any)
	for name, o := range pouts {
		so, _ := o.(map[string]any)
		if s, _ := so["sensitive"].(bool); s {
			res[name] = true
		}
	}
	return res
}

// redactChange redacts a change's before and after by their masks, or
// entirely when whole is set (a sensitive output).
func (r *Redactor) redactChange(change map[string]any, whole bool) {
	if change == nil {
		return
	}
	for _, side := range []string{"before", "after"} {
		v, ok := change[side]
		if !ok || v == nil {
			continue
		}
		mask := change[side+"_sensitive"]
		if whole {
			mask = true
		}
		change[side] = r.redactMarked(v, mask)
	}
}

// redactStateValues redacts a state values object (outputs and modules).
func (r *Redactor) redactStateValues(values map[string]any) {
	if values == nil {
		return
	}
	if outs, ok := values["outputs"].(map[string]any); ok {
		for _, o := range outs {
			so, _ := o.(map[string]any)
			if s, _ := so["sensitive"].(bool); s {
				if v, ok := so["value"]; ok && v != nil {
					r.learnMarked(v)
					so["value"] = Redacted
				}
			}
		}
	}
	if root, ok := values["root_module"].(map[string]any); ok {
		r.redactModule(root)
	}
}

func (r *Redactor) redactModule(mod map[string]any) {
	resources, _ := mod["resources"].([]any)
	for _, res := range resources {
		rs, _ := res.(map[string]any)
		if rs == nil {
			continue
		}
		if v, ok := rs["values"]; ok {
			rs["values"] = r.redactMarked(v, rs["sensitive_values"])
		}
	}
	children, _ := mod["child_modules"].([]any)
	for _, c := range children {
		if cm, ok := c.(map[string]any); ok {
			r.redactModule(cm)
		}
	}
}
