package nesting

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
)

// over is a repeat count past MaxDepth for every construct below.
const over = MaxDepth + 10

func rep(s string, n int) string { return strings.Repeat(s, n) }

// TestCheckHCLRefusesEveryWayTheParserRecurses: each way hclsyntax's
// parser goes one call deeper, repeated past the limit, is refused; at a
// few hundred thousand repetitions each of these overflows the stack
// (program's TestValidateFilesSurvivesNestingBombs runs the full size).
// The tricks that fool a scanner of brackets alone are here too.
func TestCheckHCLRefusesEveryWayTheParserRecurses(t *testing.T) {
	for name, src := range map[string]string{
		"tuples":              "a = " + rep("[", over),
		"objects":             "a = " + rep("{a = ", over),
		"parentheses":         "a = " + rep("(", over),
		"function calls":      "a = " + rep("f(", over),
		"blocks":              rep("b {\n", over),
		"quoted templates":    "a = " + rep(`"${`, over),
		"heredocs":            "a = " + rep("<<EOT\n${", over),
		"directives":          `a = "` + rep("%{ if x }", over) + rep("%{ endif }", over) + `"`,
		"for directives":      "a = <<EOT\n" + rep("%{ for x in y }\n", over) + rep("%{ endfor }\n", over) + "EOT\n",
		"negations":           "a = " + rep("-", over) + "1",
		"nots":                "a = " + rep("!", over) + "true",
		"spaced negations":    "a = " + rep("- ", over) + "1",
		"conditionals":        "a = " + rep("x ? 1 : ", over) + "1",
		"nested conditionals": "a = " + rep("x ? ", over) + "1" + rep(" : 1", over),
		"operator chain":      "a = 1" + rep(" + 1", over),
		"splats":              "a = x" + rep("[*]", over),
		"splats with indexes": "a = x" + rep("[*][0]", over),
		"negated parentheses": "a = " + rep("-(", over),
		"newlines in parens":  "a = (" + rep("-\n", over) + "1)",
		"comments in between": "a = " + rep("/* x */ [ # y\n", over),
		// What a scanner of its own could get wrong: the parser sees code
		// where a naive scanner sees a string or a comment.
		"comment opener in a string":  `a = "/*" ` + rep("[", over),
		"hash in a string":            `a = "#" ` + rep("[", over),
		"escaped quote":               `a = "\"" ` + rep("[", over),
		"escaped interpolation":       `a = "$${" ` + rep("[", over),
		"quote in a comment":          "# \"\na = " + rep("[", over),
		"quote in a heredoc":          "a = <<EOT\n\"\nEOT\nb = " + rep("[", over),
		"indented heredoc":            "a = <<-EOT\n  \"\n  EOT\nb = " + rep("[", over),
		"template in a heredoc":       "a = <<EOT\n${" + rep("[", over) + "\nEOT\n",
		"closing brace in a template": `a = "${ {} }" ` + rep("[", over),
		"mismatched closers":          "a = " + rep("[)", over),
		"unterminated string":         "a = " + rep("[", over) + `"`,
	} {
		t.Run(name, func(t *testing.T) {
			err := CheckHCL([]byte(src), "main.tf")
			var tooDeep *Error
			if !errors.As(err, &tooDeep) {
				t.Fatalf("accepted (err %v)", err)
			}
			if tooDeep.Filename != "main.tf" || tooDeep.Limit != MaxDepth || tooDeep.Pos.Line < 1 {
				t.Fatalf("error %+v", tooDeep)
			}
		})
	}
}

// TestCheckHCLAcceptsSaneFiles: deep but reasonable files, and files
// with many brackets in strings, comments and heredocs, or many operators
// in separate expressions, are accepted; the parser agrees they parse.
func TestCheckHCLAcceptsSaneFiles(t *testing.T) {
	for name, src := range map[string]string{
		"module": `
terraform {
  required_version = ">= 1.6"
}
variable "cidrs" {
  type    = list(object({ name = string, bits = number }))
  default = [{ name = "a", bits = 8 }]
  validation {
    condition     = alltrue([for c in var.cidrs : c.bits > 0 && c.bits <= 16 && !startswith(c.name, "-")])
    error_message = "Bits between 1 and 16: ${join(", ", [for c in var.cidrs : c.name if c.bits > 16])}."
  }
}
locals {
  subnets = { for i, c in var.cidrs : c.name => cidrsubnet("10.0.0.0/8", c.bits, i * 2 + 1) }
  names   = var.enabled ? [for s in local.subnets : upper(s)] : []
  all     = aws_instance.web[*].tags["Name"]
  script  = <<-EOT
    %{ for name, net in local.subnets ~}
    echo "${name}: ${net}" # [[[[
    %{ endfor ~}
  EOT
}
`,
		"nested to the limit":          "a = " + rep("[", MaxDepth) + rep("]", MaxDepth),
		"blocks a hundred deep":        rep("b {\n", 100) + rep("}\n", 100),
		"hundreds of negative numbers": "a = [" + rep("-1, ", 5000) + "]",
		"many attributes with sums":    rep("a = 1 + 2 * 3 - 4\n", 5000),
		"many objects in a list":       "a = [" + rep("{ a = -1, b = !true, c = x ? 1 : 2 },\n", 5000) + "]",
		"brackets in strings":          `a = "` + rep("[{(", 5000) + `"`,
		"brackets in comments":         "# " + rep("[", 5000) + "\n// " + rep("(", 5000) + "\n/* " + rep("{", 5000) + " */\n",
		"brackets in a heredoc":        "a = <<EOT\n" + rep("[", 5000) + "\nEOT\n",
		"escaped sequences":            `a = "` + rep("$${ %%{ [", 5000) + `"`,
		"many directives in turn":      `a = "` + rep("%{ if x }y%{ else }z%{ endif }", 5000) + `"`,
		"many interpolations in turn":  `a = "` + rep("${[1]}", 5000) + `"`,
		"many splats in turn":          rep("a = x[*].y\n", 5000),
		"stray closers":                rep("]})", 5000),
	} {
		t.Run(name, func(t *testing.T) {
			if err := CheckHCL([]byte(src), "main.tf"); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
	// The module parses: the check is not refusing real syntax only
	// because it is unusual.
	if _, diags := hclsyntax.ParseConfig([]byte(rep("b {\n", 100)+rep("}\n", 100)), "main.tf", hcl.InitialPos); diags.HasErrors() {
		t.Fatal(diags)
	}
}

// TestCheckHCLNamesTheLevelOverTheLimit: the error points at the bracket
// that opens level MaxDepth+1, as file:line:col.
func TestCheckHCLNamesTheLevelOverTheLimit(t *testing.T) {
	src := "locals {\n  a = " + rep("[", over) + "\n}\n"
	err := CheckHCL([]byte(src), "modules/net/main.tf")
	// Level 1 is the block's brace; the list's first [ is level 2 at
	// column 7, so level MaxDepth+1 is at column 7+MaxDepth-1.
	want := "modules/net/main.tf:2:262: nesting deeper than 256 levels"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v, want it to start with %q", err, want)
	}
	d := err.(*Error).Diagnostic()
	if d.Severity != hcl.DiagError || d.Subject.Filename != "modules/net/main.tf" || d.Subject.Start.Line != 2 || d.Subject.Start.Column != 262 {
		t.Fatalf("diagnostic %+v", d)
	}
}

func TestCheckJSON(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		refused   bool
	}{
		{name: "arrays", src: rep("[", over), refused: true},
		{name: "objects", src: rep(`{"a":`, over), refused: true},
		{name: "after a string with brackets", src: `["]]]]", ` + rep("[", over), refused: true},
		{name: "after an escaped quote", src: `["\"", ` + rep("[", over), refused: true},
		{name: "after an escaped backslash", src: `["\\", ` + rep("[", over), refused: true},
		// U+0600 is a grapheme "prepend" character: HCL's JSON lexer takes
		// the quote after it into the same grapheme, so the string goes
		// on, and ends at the next quote; what follows is code. Ending the
		// string at the first quote would take the brackets for a string.
		{name: "after a quote joined to a prepend character", src: "[\"\u0600\"  \", " + rep("[", over), refused: true},
		{name: "after a string cut by a newline", src: "[\"a\n" + rep("[", over), refused: true},
		{name: "nested to the limit", src: rep("[", MaxDepth) + rep("]", MaxDepth)},
		{name: "a realistic file", src: `{"resource": {"terraform_data": {"x": {"input": {"a": [[1, 2], {"b": "[[[{{{"}]}}}}, "locals": {"s": "${[1]}"}}`},
		{name: "brackets in strings", src: `["` + rep("[{", 5000) + `"]`},
		{name: "many siblings", src: "[" + rep("[[1]],", 5000) + "[]]"},
		{name: "stray closers", src: rep("]}", 5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckJSON([]byte(tc.src), "main.tf.json")
			if tc.refused != (err != nil) {
				t.Fatalf("refused %v, want %v (err %v)", err != nil, tc.refused, err)
			}
		})
	}
}

// TestCheckJSONAgreesWithHCLOnPrependCharacters: the claim the test above
// relies on, checked against hcl/json itself with a small limit: two
// arrays after the joined quote are real nesting to HCL's parser.
func TestCheckJSONAgreesWithHCLOnPrependCharacters(t *testing.T) {
	src := "[\"\u0600\"  \", [[1]]]"
	f, diags := hcljson.Parse([]byte(src), "a.json")
	if f == nil {
		t.Fatal("no file")
	}
	// HCL reads one string and then the two arrays: the only error is the
	// string's own content, not a missing bracket.
	for _, d := range diags {
		if strings.Contains(d.Summary, "bracket") || strings.Contains(d.Detail, "bracket") {
			t.Fatalf("HCL did not read the brackets as arrays: %v", diags)
		}
	}
	if err := checkJSON([]byte(src), "a.json", 2); err == nil {
		t.Fatal("the check took the arrays for a string")
	}
	if err := checkJSON([]byte(src), "a.json", 3); err != nil {
		t.Fatal(err)
	}
}

func TestCheckJSONPosition(t *testing.T) {
	src := "{\n\t\"a\": " + rep("[", over) + "\n}"
	err := CheckJSON([]byte(src), "x.tf.json")
	// { is level 1; the first [ is level 2 at column 8 (a tab counts 2),
	// so level MaxDepth+1 is at column 8+MaxDepth-1.
	want := "x.tf.json:2:263: nesting deeper than 256 levels"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v, want it to start with %q", err, want)
	}
}
