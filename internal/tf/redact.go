package tf

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
	"sync"
)

// Redacted replaces every sensitive value that leaves the runner.
const Redacted = "(sensitive value)"

// minSecretLength is the shortest secret text replaced wherever it occurs;
// shorter secret text is replaced only where it stands alone as a token
// (see redact_text.go for why).
const minSecretLength = 4

// Redactor scrubs known sensitive values from text and JSON. It only
// learns: a value once seen as sensitive stays secret for the runner's
// lifetime. Safe for concurrent use.
type Redactor struct {
	mu       sync.RWMutex
	values   maskedValues
	replacer *strings.Replacer
}

// NewRedactor returns a redactor that knows no secret yet.
func NewRedactor() *Redactor {
	return &Redactor{values: newMaskedValues()}
}

// AddValue learns every part of a secret value (a JSON-decoded value:
// string, json.Number or float64, bool, []any, map[string]any): strings of
// any length, numbers and booleans. Values from Secrets come this way.
func (r *Redactor) AddValue(v any) {
	r.learnLeaves(v, func(any) bool { return true })
}

// learnLeaves learns the scalars of v that keep accepts, and rebuilds the
// replacer if any was new.
func (r *Redactor) learnLeaves(v any, keep func(leaf any) bool) {
	var leaves []any
	collectScalars(v, &leaves)
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for _, leaf := range leaves {
		if keep(leaf) {
			changed = r.values.learn(leaf) || changed
		}
	}
	if changed {
		r.rebuild()
	}
}

// AddJSON learns a secret value given as JSON; text that is not JSON is
// learnt as a string.
func (r *Redactor) AddJSON(raw []byte) {
	v, err := decodeJSON(raw)
	if err != nil {
		r.Add(string(raw))
		return
	}
	r.AddValue(v)
}

func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func collectScalars(v any, out *[]any) {
	switch t := v.(type) {
	case []any:
		for _, e := range t {
			collectScalars(e, out)
		}
	case map[string]any:
		for _, e := range t {
			collectScalars(e, out)
		}
	case nil:
	default:
		*out = append(*out, t)
	}
}

// Add learns secret strings, in every form they may be printed in: as is,
// line by line, JSON-escaped and Go-quoted.
func (r *Redactor) Add(secrets ...string) {
	values := make([]any, len(secrets))
	for i, s := range secrets {
		values[i] = s
	}
	r.AddValue(values)
}

// learnMarked learns the long strings of a value tofu marks sensitive in a
// plan. Those values are replaced where the plan marks them; their long
// strings are also scrubbed elsewhere. Their short parts and numbers are
// not learnt as tokens: unlike values from Secrets, marked values include
// whole provider attributes full of ordinary flags and counts.
func (r *Redactor) learnMarked(v any) {
	r.learnLeaves(v, func(leaf any) bool {
		s, ok := leaf.(string)
		return ok && len(strings.TrimSpace(s)) >= minSecretLength
	})
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

// rebuild makes the replacer of long texts; longer secrets first so a
// secret containing another is replaced whole. Callers hold r.mu.
func (r *Redactor) rebuild() {
	list := make([]string, 0, len(r.values.long))
	for s := range r.values.long {
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

// String returns s with every known secret replaced: long ones wherever
// they occur, short ones and numbers and booleans where they stand alone.
func (r *Redactor) String(s string) string {
	r.mu.RLock()
	rep, tokens := r.replacer, r.values.tokenList
	r.mu.RUnlock()
	if rep != nil {
		s = rep.Replace(s)
	}
	return maskTokens(s, tokens)
}

// Bytes returns b with every known secret replaced, as String does.
func (r *Redactor) Bytes(b []byte) []byte {
	return []byte(r.String(string(b)))
}

// redactMarked replaces the parts of value that mask marks sensitive. The
// mask mirrors the value's shape (tofu's sensitive_values,
// before_sensitive, after_sensitive): true marks a sensitive part, objects
// and arrays descend. Every replaced value is taught to r.
func (r *Redactor) redactMarked(value, mask any) any {
	switch m := mask.(type) {
	case bool:
		if m && value != nil {
			r.learnMarked(value)
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
