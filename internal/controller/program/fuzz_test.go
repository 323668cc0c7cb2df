package program

import (
	"runtime/debug"
	"strings"
	"testing"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/fuzzcorpus"
)

// fuzzValidateReps repeats the fuzzed unit so that a unit that nests
// becomes a file nested a few thousand deep, as an attack would be.
const fuzzValidateReps = 4096

// fuzzValidateMaxStack is far above what a file the validator accepts
// needs (at the nesting limit, about 4 MiB) and far below the default
// 1 GiB, so a file that gets past the nesting check and recurses fails
// here as a stack overflow at once.
const fuzzValidateMaxStack = 64 << 20

// FuzzValidateFiles gives the Program validator a file in native syntax
// and the same bytes as JSON, each a head, a unit repeated and a tail.
// Whatever the input, validation returns (no panic, no stack overflow),
// gives the same answer twice, and an error names a file of the Program.
func FuzzValidateFiles(f *testing.F) {
	f.Fuzz(func(t *testing.T, head, unit, tail string) {
		defer debug.SetMaxStack(debug.SetMaxStack(fuzzValidateMaxStack))
		if len(unit) > 32 {
			unit = unit[:32]
		}
		content := head + strings.Repeat(unit, fuzzValidateReps) + tail
		program := map[string]terracev1.ProgramFile{
			"main.tf":      terracev1.ProgramFile(content),
			"main.tf.json": terracev1.ProgramFile(content),
		}
		err := validateFiles(program)
		again := validateFiles(program)
		if (err == nil) != (again == nil) || (err != nil && err.Error() != again.Error()) {
			t.Fatalf("two answers: %v, then %v", err, again)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "main.tf") && !strings.Contains(err.Error(), "more than the") {
			t.Fatalf("error names no file: %v", err)
		}
	})
}

func TestFuzzValidateFilesSeedsAreCheckedIn(t *testing.T) {
	seed := func(name, head, unit, tail string) fuzzcorpus.Seed {
		return fuzzcorpus.Seed{Name: name, Args: []any{head, unit, tail}}
	}
	fuzzcorpus.Check(t, "FuzzValidateFiles", []fuzzcorpus.Seed{
		seed("module", "terraform {\n  required_version = \">= 1.6\"\n}\n", "locals { a = [for x in [1, 2] : -x if x > 0] }\n", "output \"o\" { value = local.a }\n"),
		seed("json-module", `{"locals": [`, `{"a": [1, "${x}"]},`, `{}]}`),
		seed("tuples", "a = ", "[", ""),
		seed("arrays", "", "[", ""),
		seed("negations", "a = ", "-", "1"),
		seed("splats", "a = x", "[*]", ""),
		seed("templates", "a = ", `"${`, ""),
		seed("directives", `a = "`, "%{ if x }", `"`),
		seed("blocks", "", "b {\n", ""),
		seed("brackets-in-strings", `a = "`, "[{(", `"`),
		seed("brackets-in-comments", "# ", "[[[", "\n"),
		seed("heredoc", "a = <<EOT\n", "${[1]}\n", "EOT\n"),
		seed("invalid", "a = = ", "}", ""),
		seed("empty", "", "", ""),
	})
}
