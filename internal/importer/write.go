package importer

import (
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"
)

// WriteYAML writes each Stack as a YAML document, preceded by comments
// listing what was not carried over, so the file itself is the report.
func WriteYAML(w io.Writer, results []Result) error {
	for i, r := range results {
		obj, err := r.Object()
		if err != nil {
			return err
		}
		raw, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("failed to write Stack %s: %w", r.Stack.Name, err)
		}
		var b strings.Builder
		if i > 0 {
			b.WriteString("---\n")
		}
		fmt.Fprintf(&b, "# Imported from Terraform %s.\n", r.Source)
		if r.StateSecret != "" {
			fmt.Fprintf(&b, "# State: tofu-controller Secret %s (adopt it with --adopt-state before applying this Stack).\n", r.StateSecret)
		}
		if !r.Suspended {
			b.WriteString("# The Terraform object is not suspended: suspend it before applying this Stack.\n")
		}
		for _, u := range r.Unmapped {
			fmt.Fprintf(&b, "# NOT MAPPED %s: %s\n", u.Field, oneLine(u.Reason))
		}
		b.Write(raw)
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
	}
	return nil
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// WriteReport lists, per object, what was not carried over.
func WriteReport(w io.Writer, results []Result) {
	for _, r := range results {
		if len(r.Unmapped) == 0 {
			fmt.Fprintf(w, "%s: every field mapped\n", r.Source)
			continue
		}
		fmt.Fprintf(w, "%s: %d field(s) not mapped\n", r.Source, len(r.Unmapped))
		for _, u := range r.Unmapped {
			fmt.Fprintf(w, "  %s: %s\n", u.Field, oneLine(u.Reason))
		}
	}
}
