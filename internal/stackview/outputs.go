package stackview

import (
	"encoding/json"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/state/release"
)

// MaskedValue stands in for a sensitive output's value.
const MaskedValue = "<sensitive>"

// Output is one output as users are shown it.
type Output struct {
	Name      string `json:"name"`
	Sensitive bool   `json:"sensitive"`
	// Value is the text as stored (JSON for non-string outputs); absent when masked or unknown.
	Value *string `json:"value,omitempty"`
	// Masked is true when a value exists but is hidden.
	Masked bool `json:"masked,omitempty"`
}

// OutputsFromSecret lists the outputs Secret's keys; a value is masked
// (unless showSensitive) when the deployed release calls it sensitive or
// does not know it.
func OutputsFromSecret(secret *corev1.Secret, deployed *release.Release, showSensitive bool) []Output {
	sensitive := map[string]bool{}
	if deployed != nil {
		for _, o := range deployed.Outputs {
			sensitive[o.Name] = o.Sensitive
		}
	}
	names := make([]string, 0, len(secret.Data))
	for name := range secret.Data {
		names = append(names, name)
	}
	sort.Strings(names)
	shown := make([]Output, 0, len(names))
	for _, name := range names {
		isSensitive, known := sensitive[name]
		o := Output{Name: name, Sensitive: isSensitive || !known}
		if o.Sensitive && !showSensitive {
			o.Masked = true
		} else {
			value := string(secret.Data[name])
			o.Value = &value
		}
		shown = append(shown, o)
	}
	return shown
}

// OutputsFromRelease lists the names in status with the non-sensitive
// values the deployed release recorded, in the outputs Secret's format.
func OutputsFromRelease(stack *terracev1.Stack, deployed *release.Release) []Output {
	recorded := map[string]release.Output{}
	if deployed != nil {
		for _, o := range deployed.Outputs {
			recorded[o.Name] = o
		}
	}
	names := append([]string(nil), stack.Status.Outputs...)
	for name := range recorded {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	shown := make([]Output, 0, len(names))
	for _, name := range names {
		r, ok := recorded[name]
		o := Output{Name: name, Sensitive: r.Sensitive}
		if ok && !r.Sensitive && r.Value != nil {
			value := OutputText(r.Value)
			o.Value = &value
		}
		o.Masked = r.Sensitive
		shown = append(shown, o)
	}
	return shown
}

// OutputText renders a JSON value as the outputs Secret does: a string as
// its text, anything else as JSON.
func OutputText(raw json.RawMessage) string {
	var str string
	if err := json.Unmarshal(raw, &str); err == nil {
		return str
	}
	return string(raw)
}

// ReleaseProblem says why no deployed release is known: err from the
// release store, or nil when the Stack has none.
func ReleaseProblem(err error) string {
	if err != nil {
		return "the release store could not be read: " + err.Error()
	}
	return "the Stack has no deployed release"
}
