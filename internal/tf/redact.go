package tf

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Redacted replaces every sensitive value that leaves the runner.
const Redacted = "(sensitive value)"

// minSecretLength is the shortest value scrubbed from free text. Shorter
// sensitive values are still redacted structurally (in plan JSON by
// tofu's sensitivity marks, in human output by tofu itself); scrubbing
// every "a" or "1" from logs would make them unreadable.
const minSecretLength = 4

// Redactor scrubs known sensitive strings from text. It only learns: a
// value once seen as sensitive stays secret for the runner's lifetime.
// Safe for concurrent use.
type Redactor struct {
	mu       sync.RWMutex
	secrets  map[string]struct{}
	replacer *strings.Replacer
}

// NewRedactor returns a redactor that knows no secret yet.
func NewRedactor() *Redactor {
	return &Redactor{secrets: map[string]struct{}{}}
}

// AddValue learns every string inside a sensitive value (a JSON-decoded
// value: string, number, bool, []any, map[string]any).
func (r *Redactor) AddValue(v any) {
	var leaves []string
	collectStrings(v, &leaves)
	r.Add(leaves...)
}

func collectStrings(v any, out *[]string) {
	switch t := v.(type) {
	case string:
		*out = append(*out, t)
	case []any:
		for _, e := range t {
			collectStrings(e, out)
		}
	case map[string]any:
		for _, e := range t {
			collectStrings(e, out)
		}
	}
}

// Add learns secret strings, in every form they may be printed in: as is,
// line by line, JSON-escaped and Go-quoted.
func (r *Redactor) Add(secrets ...string) {
	var forms []string
	for _, s := range secrets {
		forms = append(forms, s)
		forms = append(forms, strings.Split(s, "\n")...)
		forms = append(forms, jsonForms(s)...)
		if q := strconv.Quote(s); len(q) >= 2 {
			forms = append(forms, q[1:len(q)-1])
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for _, f := range forms {
		if len(strings.TrimSpace(f)) < minSecretLength {
			continue
		}
		if _, ok := r.secrets[f]; !ok {
			r.secrets[f] = struct{}{}
			changed = true
		}
	}
	if changed {
		r.rebuild()
	}
}

// jsonForms are s as it appears inside JSON strings, with and without
// HTML escaping.
func jsonForms(s string) []string {
	var forms []string
	if b, err := json.Marshal(s); err == nil && len(b) >= 2 {
		forms = append(forms, string(b[1:len(b)-1]))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err == nil {
		b := bytes.TrimSpace(buf.Bytes())
		if len(b) >= 2 {
			forms = append(forms, string(b[1:len(b)-1]))
		}
	}
	return forms
}

// rebuild makes the replacer; longer secrets first so a secret containing
// another is replaced whole.
func (r *Redactor) rebuild() {
	list := make([]string, 0, len(r.secrets))
	for s := range r.secrets {
		list = append(list, s)
	}
	sort.Slice(list, func(i, j int) bool {
		if len(list[i]) != len(list[j]) {
			return len(list[i]) > len(list[j])
		}
		return list[i] < list[j]
	})
	pairs := make([]string, 0, 2*len(list))
	for _, s := range list {
		pairs = append(pairs, s, Redacted)
	}
	r.replacer = strings.NewReplacer(pairs...)
}

// String returns s with every known secret replaced.
func (r *Redactor) String(s string) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.replacer == nil {
		return s
	}
	return r.replacer.Replace(s)
}

// Bytes returns b with every known secret replaced.
func (r *Redactor) Bytes(b []byte) []byte {
	r.mu.RLock()
	rep := r.replacer
	r.mu.RUnlock()
	if rep == nil {
		return b
	}
	var buf bytes.Buffer
	buf.Grow(len(b))
	if _, err := rep.WriteString(&buf, string(b)); err != nil {
		// Writing to a bytes.Buffer cannot fail.
		panic(err)
	}
	return buf.Bytes()
}

// redactMarked replaces the parts of value that mask marks sensitive. The
// mask mirrors the value's shape (tofu's sensitive_values,
// before_sensitive, after_sensitive): true marks a sensitive part, objects
// and arrays descend. Every replaced value is taught to r.
func (r *Redactor) redactMarked(value, mask any) any {
	switch m := mask.(type) {
	case bool:
		if m && value != nil {
			r.AddValue(value)
			return Redacted
		}
		return value
	case map[string]any:
		obj, ok := value.(map[string]any)
		if !ok {
			return value
		}
		for k, sub := range m {
			if v, ok := obj[k]; ok {
				obj[k] = r.redactMarked(v, sub)
			}
		}
		return obj
	case []any:
		arr, ok := value.([]any)
		if !ok {
			return value
		}
		for i := range arr {
			if i < len(m) {
				arr[i] = r.redactMarked(arr[i], m[i])
			}
		}
		return arr
	}
	return value
}

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
	// Sensitive values were taught above; now scrub copies anywhere else,
	// including the configuration's constant values.
	out, err := json.Marshal(plan)
	if err != nil {
		return nil, err
	}
	return r.Bytes(out), nil
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
					r.AddValue(v)
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
