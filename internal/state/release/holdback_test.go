package release_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/terrace-dev/terrace/internal/state/release"
	"github.com/terrace-dev/terrace/internal/tf"
)

// The attack: a module passes Secret values on through outputs it does not
// declare sensitive (tofu then does not mark them). The stored record holds
// none of them; outputs without a secret stay readable.
func TestRecordHoldsBackOutputsBuiltFromSecrets(t *testing.T) {
	secrets := tf.NewRedactor()
	for _, raw := range []string{`7`, `true`, `"ab"`, `"a-long-password"`} {
		secrets.AddJSON([]byte(raw))
	}
	r := &release.Release{
		Namespace: "team", Stack: "echo", Revision: 1, Status: release.StatusDeployed,
		SecretInputs: secrets,
		Outputs: []release.Output{
			{Name: "echo_pin", Value: json.RawMessage(`7`)},
			{Name: "echo_flag", Value: json.RawMessage(`true`)},
			{Name: "echo_short", Value: json.RawMessage(`"ab"`)},
			{Name: "sentence", Value: json.RawMessage(`"the pin is 7"`)},
			{Name: "nested", Value: json.RawMessage(`{"db": {"url": "postgres://u:a-long-password@db"}}`)},
			{Name: "declared", Sensitive: true, Value: json.RawMessage(`"hunter2"`)},
			{Name: "count", Value: json.RawMessage(`17`)},
			{Name: "word", Value: json.RawMessage(`"tabs"`)},
		},
	}
	body, err := release.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(zr)
	for _, leaked := range []string{`"value":7`, `"value":true`, `"ab"`, "a-long-password", "hunter2", "pin is"} {
		if strings.Contains(string(raw), leaked) {
			t.Errorf("stored record contains %s:\n%s", leaked, raw)
		}
	}
	got, err := release.Decode(body, "test")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		sensitive, fromSecret bool
		value                 string
	}{
		"echo_pin": {true, true, ""}, "echo_flag": {true, true, ""}, "echo_short": {true, true, ""},
		"sentence": {true, true, ""}, "nested": {true, true, ""}, "declared": {true, false, ""},
		"count": {false, false, "17"}, "word": {false, false, `"tabs"`},
	}
	for _, o := range got.Outputs {
		w := want[o.Name]
		if o.Sensitive != w.sensitive || o.FromSecret != w.fromSecret || string(o.Value) != w.value {
			t.Errorf("output %s recorded as sensitive=%v fromSecret=%v value=%s; want %v %v %q", o.Name, o.Sensitive, o.FromSecret, o.Value, w.sensitive, w.fromSecret, w.value)
		}
	}
	// Without secret inputs only declared-sensitive values are dropped.
	plain := release.HoldBack(r.Outputs, nil)
	if string(plain[0].Value) != "7" || plain[5].Value != nil {
		t.Errorf("HoldBack without secrets: %+v", plain)
	}
}
