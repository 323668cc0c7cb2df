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
