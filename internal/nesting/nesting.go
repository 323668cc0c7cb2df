// Package nesting refuses HCL and JSON files that nest deeper than a
// limit, before a recursive parser sees them.
//
// HCL's parsers (hclsyntax and its JSON syntax) recurse once per level of
// brackets, template sequences and prefix operators, with no depth limit: a
// file of `a = ` and 60,000 `[` overflows the goroutine stack, a fatal
// error Go cannot recover from. Tenant files are parsed in shared processes
// (the controller validates Programs, the API server reads their
// variables), so each such file is checked here first, in one pass with
// memory bounded by the limit.
//
// What counts as a level, for native syntax: every bracket, brace and
// parenthesis, quoted string and heredoc, `${` and `%{` sequence and open
// `%{ if }` / `%{ for }` directive; and, within one expression, every
// operator (the parser recurses on each prefix `-`, `!` and `?`, and a
// chain of binary operators builds a tree as deep as the chain, which
// evaluation then recurses through). For JSON, every `[` and `{`.
package nesting

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
)

// MaxDepth is the deepest nesting accepted. Real modules stay far below it
// (a generated .tf.json nests about ten deep, an expression rarely holds
// more than a dozen operators); at this depth the parser's stack stays
// under a few MiB.
const MaxDepth = 256

// Error says where a file first nests deeper than the limit.
type Error struct {
	// Filename is the name the file was checked under.
	Filename string
	// Pos is where the level over the limit opens.
	Pos hcl.Pos
	// Limit is the depth that was exceeded.
	Limit int
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.Filename, e.Pos.Line, e.Pos.Column, e.detail())
}

func (e *Error) detail() string {
	return fmt.Sprintf("nesting deeper than %d levels (brackets, strings, template sequences and operators in one expression): flatten it, for instance with locals", e.Limit)
}

// Diagnostic is the error as HCL reports a parse error, so callers that
// collect diagnostics list it with the parser's own.
func (e *Error) Diagnostic() *hcl.Diagnostic {
	end := e.Pos
	end.Column++
	end.Byte++
	return &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  "Nesting too deep",
		Detail:   e.detail(),
		Subject:  &hcl.Range{Filename: e.Filename, Start: e.Pos, End: end},
	}
}

// CheckHCL checks a file in HCL native syntax (.tf, .tofu, .tfvars, .hcl)
// against MaxDepth.
func CheckHCL(src []byte, filename string) error {
	return checkHCL(src, filename, MaxDepth)
}

// CheckJSON checks a file in HCL's JSON syntax (.tf.json, .tfvars.json)
// against MaxDepth.
func CheckJSON(src []byte, filename string) error {
	return checkJSON(src, filename, MaxDepth)
}
