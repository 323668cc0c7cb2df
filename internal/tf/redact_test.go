package tf

import (
	"encoding/json"
	"strings"
	"testing"
)

const testSecret = "hunter2-Sup3r<&>\"secret"

func TestRedactPlanJSONReplacesEveryMarkedValue(t *testing.T) {
	secretJSON, _ := json.Marshal(testSecret)
	s := string(secretJSON)
	plan := `{
  "format_version": "1.2",
  "variables": {"password": {"value": ` + s + `}, "from_secret": {"value": {"k": "token-abcdef"}}, "name": {"value": "web"}},
  "planned_values": {
    "outputs": {"pw": {"sensitive": true, "value": ` + s + `}, "plain": {"sensitive": false, "value": "visible"}},
    "root_module": {
      "resources": [{"address": "terraform_data.a", "values": {"input": ` + s + `, "output": null, "triggers_replace": ["x", "deep-secret-value"]},
                     "sensitive_values": {"input": true, "triggers_replace": [false, true]}}],
      "child_modules": [{"resources": [{"address": "module.m.terraform_data.b", "values": {"input": {"a": "nested-secret-1"}}, "sensitive_values": {"input": {"a": true}}}]}]
    }
  },
  "resource_changes": [{"address": "terraform_data.a", "mode": "managed", "change": {"actions": ["create"], "before": null,
     "after": {"input": ` + s + `, "id": "abc"}, "after_sensitive": {"input": true}, "before_sensitive": false}}],
  "resource_drift": [{"address": "terraform_data.c", "mode": "managed", "change": {"actions": ["update"], "before": {"input": "old-drift-secret"},
     "after": {"input": "new-drift-secret"}, "before_sensitive": {"input": true}, "after_sensitive": {"input": true}}}],
  "output_changes": {"pw": {"actions": ["create"], "before": null, "after": ` + s + `, "after_sensitive": true},
                     "copy": {"actions": ["create"], "before": null, "after": "prefix-` + strings.Trim(s, `"`) + `", "after_sensitive": false}},
  "prior_state": {"values": {"root_module": {"resources": [{"address": "terraform_data.c", "values": {"input": "old-drift-secret"}, "sensitive_values": {"input": true}}]}}},
  "configuration": {"root_module": {
    "variables": {"password": {"sensitive": true, "default": "default-secret-value"}, "from_secret": {}, "name": {"default": "web"}},
    "outputs": {"pw": {"sensitive": true}},
    "resources": [{"address": "terraform_data.k", "expressions": {"input": {"constant_value": "default-secret-value"}}}]
  }}
}`
	r := NewRedactor()
	out, err := r.RedactPlanJSON([]byte(plan), []string{"from_secret"})
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"hunter2", "token-abcdef", "deep-secret-value", "nested-secret-1", "old-drift-secret", "new-drift-secret", "default-secret-value", `Sup3r\u003c`} {
		if strings.Contains(string(out), secret) {
			t.Errorf("redacted plan still contains %q:\n%s", secret, out)
		}
	}
	for _, kept := range []string{`"visible"`, `"web"`, `"abc"`, `"x"`} {
		if !strings.Contains(string(out), kept) {
			t.Errorf("redacted plan lost the non-sensitive %s:\n%s", kept, out)
		}
	}
	var decoded map[string]any
	if err := json.Unmarshal(out, &decoded); err != nil {
		t.Fatalf("redacted plan is not JSON: %v", err)
	}
	vars := decoded["variables"].(map[string]any)
	if got := vars["password"].(map[string]any)["value"]; got != Redacted {
		t.Errorf("variables.password.value = %v, want %q", got, Redacted)
	}
	// The redactor learnt the values, so free text is scrubbed too.
	line := r.String("error: value " + testSecret + " and token-abcdef rejected")
	if strings.Contains(line, "hunter2") || strings.Contains(line, "token-abcdef") {
		t.Errorf("log line not scrubbed: %q", line)
	}
}

func TestRedactorForms(t *testing.T) {
	r := NewRedactor()
	r.Add("line-one-secret\nline-two-secret", "ab")
	for _, in := range []string{
		"plain line-one-secret here",
		`json "line-one-secret\nline-two-secret"`,
		"second line-two-secret",
	} {
		if out := r.String(in); strings.Contains(out, "secret") {
			t.Errorf("String(%q) = %q, secret left", in, out)
		}
	}
	if out := r.String("abc tab"); out != "abc tab" {
		t.Errorf("values shorter than %d bytes must not be scrubbed from text, got %q", minSecretLength, out)
	}
}

func TestLineWriterRedactsWholeLinesAndKeepsUTF8(t *testing.T) {
	r := NewRedactor()
	secret := strings.Repeat("s", 100) + "-the-secret"
	r.Add(secret)
	var lines []string
	w := newLineWriter(r, func(l string) { lines = append(lines, l) })
	// A secret straddling the piece boundary of a very long line.
	long := strings.Repeat("é", maxLinePiece/2-10) + secret + strings.Repeat("x", 10)
	for _, part := range []string{"first li", "ne\nsecond " + secret + "\n", long, "\nlast"} {
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	joined := strings.Join(lines, "")
	if strings.Contains(joined, "the-secret") {
		t.Fatalf("secret leaked through the line writer")
	}
	if lines[0] != "first line" || lines[1] != "second "+Redacted || lines[len(lines)-1] != "last" {
		t.Fatalf("unexpected lines: %q, %q ... %q", lines[0], lines[1], lines[len(lines)-1])
	}
	for _, l := range lines {
		if len(l) > maxLinePiece {
			t.Errorf("line of %d bytes, more than %d", len(l), maxLinePiece)
		}
		if !validUTF8(l) {
			t.Errorf("line is not valid UTF-8")
		}
	}
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestSummarize(t *testing.T) {
	plan := `{"format_version": "1.2",
  "resource_changes": [
    {"address": "a", "mode": "managed", "change": {"actions": ["create"]}},
    {"address": "b", "mode": "managed", "change": {"actions": ["update"]}},
    {"address": "c", "mode": "managed", "change": {"actions": ["delete", "create"]}},
    {"address": "d", "mode": "managed", "change": {"actions": ["delete"]}},
    {"address": "e", "mode": "managed", "change": {"actions": ["no-op"], "importing": {"id": "x"}}},
    {"address": "f", "mode": "data", "change": {"actions": ["read"]}},
    {"address": "g", "mode": "managed", "change": {"actions": ["forget"]}}
  ],
  "resource_drift": [{"address": "b", "mode": "managed", "change": {"actions": ["update"]}}],
  "output_changes": {"o": {"actions": ["update"]}, "p": {"actions": ["no-op"]}}
}`
	got, err := Summarize([]byte(plan))
	if err != nil {
		t.Fatal(err)
	}
	want := Summary{Add: 2, Change: 1, Destroy: 2, Import: 1, Forget: 1, Drift: 1, OutputChanges: 1}
	if got != want {
		t.Fatalf("Summarize = %+v, want %+v", got, want)
	}
}

// secretInputs teaches r the values of a varsFrom Secret as the runner gets
// them: pin: 7 (a number), flag: true (a boolean), short: ab, and 1e3.
func secretInputs() *Redactor {
	r := NewRedactor()
	for _, raw := range []string{`7`, `true`, `"ab"`, `1e3`} {
		r.AddJSON([]byte(raw))
	}
	return r
}

// The attack: a module echoes Secret values that are numbers, booleans or
// shorter than four characters into its log. Each is masked where it stands
// alone, and text around it (or words merely containing it) survives.
func TestSecretNumbersBooleansAndShortValuesAreMaskedInLogs(t *testing.T) {
	r := secretInputs()
	masked := []string{
		`  + pin   = 7`,
		`  + flag  = true`,
		`  + short = "ab"`,
		`Changes to Outputs: echo = "pin-7/ab/true"`,
		`count is 1000`,
		`value 7.`,
	}
	for _, line := range masked {
		out := r.String(line)
		for _, tok := range []string{"7", "true", "ab", "1000"} {
			if containsToken(out, tok) {
				t.Errorf("String(%q) = %q: %q still stands alone", line, out, tok)
			}
		}
		if !strings.Contains(out, Redacted) {
			t.Errorf("String(%q) = %q: nothing masked", line, out)
		}
	}
	kept := []string{
		"version 1.17 built 2024-07-01 in 17s",
		"untrue: a table of tabs about abc",
		"terraform_data.x: Creation complete after 0s [id=8a7b]",
	}
	for _, line := range kept {
		if out := r.String(line); out != line {
			t.Errorf("String(%q) = %q: text that holds no secret was changed", line, out)
		}
	}
	// Punctuation-only short values cannot be found in text; they are not
	// learnt as tokens (they are still matched whole in JSON).
	p := NewRedactor()
	p.AddJSON([]byte(`"-"`))
	if out := p.String("a-b - c"); out != "a-b - c" {
		t.Errorf("a punctuation-only secret rewrote text: %q", out)
	}
}

func containsToken(s, tok string) bool {
	return maskTokens(s, []string{tok}) != s
}

// In plan JSON, whole values equal to a secret are masked where the plan
// holds values, and the plan's own numbers, booleans and versions stay.
func TestSecretScalarsAreMaskedInPlanJSON(t *testing.T) {
	r := secretInputs()
	r.AddJSON([]byte(`"1"`))
	plan := `{
  "format_version": "1.2", "terraform_version": "1.12.6",
  "variables": {"pin": {"value": 7}, "label": {"value": "x"}},
  "planned_values": {"outputs": {"echo_pin": {"sensitive": false, "value": 7}, "n": {"sensitive": false, "value": 17}},
    "root_module": {"resources": [{"address": "terraform_data.echo", "schema_version": 0,
      "values": {"input": {"pin": 7, "flag": true, "short": "ab", "big": 1000, "other": 17}}, "sensitive_values": {}}]}},
  "resource_changes": [{"address": "terraform_data.echo", "index": "ab", "change": {"actions": ["create"], "before": null,
    "after": {"input": {"pin": 7, "flag": true, "short": "ab", "text": "pin=7 short=ab", "other": false}},
    "after_unknown": {"id": true, "output": true}, "after_sensitive": {}, "before_sensitive": false}}],
  "output_changes": {"echo_pin": {"actions": ["create"], "before": null, "after": 7, "after_unknown": false, "after_sensitive": false},
                     "echo_flag": {"actions": ["create"], "before": null, "after": true, "after_unknown": false, "after_sensitive": false},
                     "echo_short": {"actions": ["create"], "before": null, "after": "ab", "after_unknown": false, "after_sensitive": false}},
  "configuration": {"root_module": {"resources": [{"address": "terraform_data.echo", "expressions": {"input": {"constant_value": 7}}}]}}
}`
	out, err := r.RedactPlanJSON([]byte(plan), []string{"pin"})
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.UseNumber()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("redacted plan is not JSON: %v\n%s", err, out)
	}
	get := func(v any, path ...any) any {
		for _, step := range path {
			switch s := step.(type) {
			case string:
				v = v.(map[string]any)[s]
			case int:
				v = v.([]any)[s]
			}
		}
		return v
	}
	masked := [][]any{
		{"variables", "pin", "value"},
		{"planned_values", "outputs", "echo_pin", "value"},
		{"planned_values", "root_module", "resources", 0, "values", "input", "pin"},
		{"planned_values", "root_module", "resources", 0, "values", "input", "flag"},
		{"planned_values", "root_module", "resources", 0, "values", "input", "short"},
		{"planned_values", "root_module", "resources", 0, "values", "input", "big"},
		{"resource_changes", 0, "index"},
		{"resource_changes", 0, "change", "after", "input", "pin"},
		{"resource_changes", 0, "change", "after", "input", "flag"},
		{"resource_changes", 0, "change", "after", "input", "short"},
		{"output_changes", "echo_pin", "after"},
		{"output_changes", "echo_flag", "after"},
		{"output_changes", "echo_short", "after"},
		{"configuration", "root_module", "resources", 0, "expressions", "input", "constant_value"},
	}
	for _, path := range masked {
		if got := get(p, path...); got != Redacted {
			t.Errorf("%v = %v, want it masked", path, got)
		}
	}
	if got := get(p, "resource_changes", 0, "change", "after", "input", "text"); got != "pin="+Redacted+" short="+Redacted {
		t.Errorf("text holding secrets = %v", got)
	}
	kept := map[string]any{
		"format_version":    "1.2",
		"terraform_version": "1.12.6",
	}
	for k, want := range kept {
		if p[k] != want {
			t.Errorf("%s = %v, want %v", k, p[k], want)
		}
	}
	if got := get(p, "planned_values", "outputs", "n", "value"); got != json.Number("17") {
		t.Errorf("an unrelated number was changed: %v", got)
	}
	if got := get(p, "resource_changes", 0, "change", "after_unknown", "id"); got != true {
		t.Errorf("the plan's own booleans were changed: after_unknown.id = %v", got)
	}
	if got := get(p, "resource_changes", 0, "change", "after", "input", "other"); got != false {
		t.Errorf("an unrelated boolean was changed: %v", got)
	}
	if got := get(p, "planned_values", "root_module", "resources", 0, "schema_version"); got != json.Number("0") {
		t.Errorf("schema_version = %v", got)
	}
}

func TestContainsSecret(t *testing.T) {
	r := secretInputs()
	r.Add("long-secret-text")
	cases := map[string]bool{
		`7`:                          true,
		`7.0`:                        true,
		`"7"`:                        true,
		`true`:                       true,
		`"ab"`:                       true,
		`{"k": [1, 2, {"x": "ab"}]}`: true,
		`"pin is 7"`:                 true,
		`"prefix-long-secret-text"`:  true,
		`{"ab": 1}`:                  true,
		`17`:                         false,
		`false`:                      false,
		`"abc"`:                      false,
		`{"k": [1, 2, "tab"]}`:       false,
		`null`:                       false,
	}
	for raw, want := range cases {
		if got := r.ContainsSecret(json.RawMessage(raw)); got != want {
			t.Errorf("ContainsSecret(%s) = %v, want %v", raw, got, want)
		}
	}
}

// A runner that applies a plan another runner made learns the values of
// the variables named as from Secrets from the plan file itself, so the
// apply's "Outputs: echo_pin = 7" is masked.
func TestApplyingRunnerLearnsSecretValuesFromThePlan(t *testing.T) {
	r := NewRedactor()
	plan := `{"variables": {"pin": {"value": 7}, "flag": {"value": true}, "short": {"value": "ab"}, "label": {"value": "x"}}}`
	if _, err := r.RedactPlanJSON([]byte(plan), []string{"pin", "flag", "short"}); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"echo_pin = 7", "echo_flag = true", `echo_short = "ab"`} {
		if out := r.String(line); !strings.Contains(out, Redacted) {
			t.Errorf("apply output %q not masked: %q", line, out)
		}
	}
	if out := r.String(`label = "x"`); out != `label = "x"` {
		t.Errorf("a variable from no Secret was masked: %q", out)
	}
}
