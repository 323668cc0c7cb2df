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
