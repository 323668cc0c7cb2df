package nesting

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"

	"github.com/terrace-dev/terrace/internal/fuzzcorpus"
)

// The fuzz targets look for a way to nest that the check does not count.
// A file is a head, a unit repeated fuzzReps times and a tail, so that one
// uncounted unit the fuzzer finds becomes a nesting a thousand deep. The
// check runs with the small fuzzLimit; whatever it accepts is parsed, and
// the parse must stay shallow: within fuzzMaxStack (a deeper stack is a
// fatal error the fuzzer reports as a crash; a file the check accepts
// needs well under 1 MiB), and, for native syntax, with a syntax tree no
// deeper than a few nodes per counted level.
const (
	fuzzLimit     = 16
	fuzzReps      = 1024
	fuzzUnitBytes = 16
	fuzzMaxStack  = 1 << 20
	// fuzzMaxTreeDepth: a counted level makes at most two nodes (a block
	// and its body, a directive and its branch), plus the file's own.
	fuzzMaxTreeDepth = 2*fuzzLimit + 8
)

func fuzzSource(head, unit, tail string) []byte {
	if len(unit) > fuzzUnitBytes {
		unit = unit[:fuzzUnitBytes]
	}
	if len(head) > 256 {
		head = head[:256]
	}
	if len(tail) > 256 {
		tail = tail[:256]
	}
	return []byte(head + strings.Repeat(unit, fuzzReps) + tail)
}

func FuzzCheckHCL(f *testing.F) {
	f.Fuzz(func(t *testing.T, head, unit, tail string) {
		defer debug.SetMaxStack(debug.SetMaxStack(fuzzMaxStack))
		src := fuzzSource(head, unit, tail)
		if checkHCL(src, "f.tf", fuzzLimit) != nil {
			return
		}
		file, _ := hclsyntax.ParseConfig(src, "f.tf", hcl.InitialPos)
		body, ok := file.Body.(*hclsyntax.Body)
		if !ok {
			return
		}
		w := &depthWalker{}
		hclsyntax.Walk(body, w)
		if w.max > fuzzMaxTreeDepth {
			t.Fatalf("accepted at limit %d, but its syntax tree is %d deep: %q", fuzzLimit, w.max, src[:min(len(src), 200)])
		}
	})
}

func FuzzCheckJSON(f *testing.F) {
	f.Fuzz(func(t *testing.T, head, unit, tail string) {
		defer debug.SetMaxStack(debug.SetMaxStack(fuzzMaxStack))
		src := fuzzSource(head, unit, tail)
		if checkJSON(src, "f.tf.json", fuzzLimit) != nil {
			return
		}
		hcljson.Parse(src, "f.tf.json")
	})
}

// depthWalker measures the deepest node of a syntax tree.
type depthWalker struct{ depth, max int }

func (w *depthWalker) Enter(hclsyntax.Node) hcl.Diagnostics {
	w.depth++
	w.max = max(w.max, w.depth)
	return nil
}

func (w *depthWalker) Exit(hclsyntax.Node) hcl.Diagnostics {
	w.depth--
	return nil
}

// fuzzSeeds are units the parser nests on, ones it does not, and the
// strings, comments and heredocs a scanner could misread.
func fuzzSeeds() (native, json []fuzzcorpus.Seed) {
	seed := func(name, head, unit, tail string) fuzzcorpus.Seed {
		return fuzzcorpus.Seed{Name: name, Args: []any{head, unit, tail}}
	}
	native = []fuzzcorpus.Seed{
		seed("tuples", "a = ", "[", ""),
		seed("balanced-tuples", "a = [", "[1],", "]"),
		seed("blocks", "", "b {\n", ""),
		seed("negations", "a = ", "-", "1"),
		seed("conditionals", "a = ", "x ? 1 : ", "1"),
		seed("operators", "a = 1", " + 1", ""),
		seed("splats", "a = x", "[*]", ""),
		seed("templates", "a = ", `"${`, ""),
		seed("heredoc-templates", "a = ", "<<EOT\n${", ""),
		seed("directives", `a = "`, "%{ if x }", `"`),
		seed("balanced-directives", `a = "`, "%{ if x }y%{ endif }", `"`),
		seed("for-directives", "a = <<EOT\n", "%{ for x in y }\n", "EOT\n"),
		seed("comment-in-string", `a = "/*" `, "[", ""),
		seed("quote-in-comment", "# \"\na = ", "[", ""),
		seed("quote-in-heredoc", "a = <<EOT\n\"\nEOT\nb = ", "[", ""),
		seed("escaped-template", `a = "$${" `, "[", ""),
		seed("attributes", "", "a = -1 + x\n", ""),
		seed("list-of-negatives", "a = [", "-1, ", "]"),
	}
	json = []fuzzcorpus.Seed{
		seed("arrays", "", "[", ""),
		seed("objects", "", `{"a":`, ""),
		seed("balanced", "[", "[1],", "[]]"),
		seed("brackets-in-strings", "[", `"[{",`, `""]`),
		seed("escaped-quote", `["\"", `, "[", ""),
		seed("prepend-character", "[\"\u0600\"  \", ", "[", ""),
		seed("newline-in-string", "[\"a\n", "[", ""),
	}
	return native, json
}

func TestFuzzCheckSeedsAreCheckedIn(t *testing.T) {
	native, json := fuzzSeeds()
	fuzzcorpus.Check(t, "FuzzCheckHCL", native)
	fuzzcorpus.Check(t, "FuzzCheckJSON", json)
}
