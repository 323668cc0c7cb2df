package program

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/artifact"
	"github.com/terrace-dev/terrace/internal/nesting"
)

// maxReportedDiagnostics bounds how many parser errors the Ready message lists.
const maxReportedDiagnostics = 5

// fileSyntax says how a file of a Program is checked.
type fileSyntax int

const (
	syntaxNone fileSyntax = iota // templates and other data: not parsed
	syntaxHCL
	syntaxJSON
)

// syntaxOf picks the parser by name, the way tofu does: native syntax for
// *.tf, *.tofu, *.tfvars and *.hcl (tests, lock files), JSON for their
// .json forms.
func syntaxOf(name string) fileSyntax {
	for _, ext := range []string{".tf.json", ".tofu.json", ".tfvars.json"} {
		if strings.HasSuffix(name, ext) {
			return syntaxJSON
		}
	}
	for _, ext := range []string{".tf", ".tofu", ".tfvars", ".hcl"} {
		if strings.HasSuffix(name, ext) {
			return syntaxHCL
		}
	}
	return syntaxNone
}

// validateFiles checks names, the total size and the syntax of every
// configuration file. The error lists "file:line:col: summary: detail" for
// the first few parser errors, in file name order. A file that nests
// deeper than nesting.MaxDepth is not parsed at all: HCL's parsers recurse
// without a limit, and a stack overflow would end the controller.
func validateFiles(files map[string]terracev1.ProgramFile) error {
	names := make([]string, 0, len(files))
	var total int
	for name, content := range files {
		names = append(names, name)
		total += len(content)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return fmt.Errorf("the program has no files")
	}
	if total > terracev1.ProgramMaxTotalSize {
		return fmt.Errorf("the program's files hold %d bytes, more than the %d allowed: move large data to a ConfigMap or an external source", total, terracev1.ProgramMaxTotalSize)
	}
	var diags hcl.Diagnostics
	for _, name := range names {
		if err := artifact.ValidateName(name); err != nil {
			return err
		}
		src := []byte(files[name])
		switch syntaxOf(name) {
		case syntaxHCL:
			if err := nesting.CheckHCL(src, name); err != nil {
				diags = append(diags, tooDeep(err))
				continue
			}
			_, d := hclsyntax.ParseConfig(src, name, hcl.InitialPos)
			diags = append(diags, d...)
		case syntaxJSON:
			if err := nesting.CheckJSON(src, name); err != nil {
				diags = append(diags, tooDeep(err))
				continue
			}
			_, d := hcljson.Parse(src, name)
			diags = append(diags, d...)
		}
	}
	if !diags.HasErrors() {
		return nil
	}
	return fmt.Errorf("%s", formatDiagnostics(diags))
}

// tooDeep is a nesting check's error as a parse error of its file.
func tooDeep(err error) *hcl.Diagnostic {
	var e *nesting.Error
	if errors.As(err, &e) {
		return e.Diagnostic()
	}
	return &hcl.Diagnostic{Severity: hcl.DiagError, Summary: err.Error()}
}

func formatDiagnostics(diags hcl.Diagnostics) string {
	var lines []string
	var errs int
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		errs++
		if len(lines) == maxReportedDiagnostics {
			continue
		}
		lines = append(lines, formatDiagnostic(d))
	}
	msg := strings.Join(lines, "; ")
	if errs > len(lines) {
		msg += fmt.Sprintf("; and %d more", errs-len(lines))
	}
	return msg
}

func formatDiagnostic(d *hcl.Diagnostic) string {
	text := d.Summary
	if d.Detail != "" {
		text += ": " + d.Detail
	}
	if d.Subject == nil {
		return text
	}
	return fmt.Sprintf("%s:%d:%d: %s", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column, text)
}
