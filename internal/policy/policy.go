// Package policy checks plans against Rego policies with OPA as a library.
//
// Policies are modules of package terrace. Their deny rules (sets of
// messages) block the apply of a plan; their warn rules only annotate it.
// The input document is the plan as `tofu show -json` prints it
// (sensitive values already redacted by the runner).
//
// Evaluation is sandboxed data evaluation: the builtins that reach the
// network or the process (http.send, net.lookup_ip_addr, opa.runtime) are
// not available, schemas are never fetched, and every evaluation runs in a
// child process with a memory bound the kernel enforces and a deadline
// (evaluator.go). That is what lets the controller evaluate policies a
// namespace admin wrote without running anything of theirs in its own
// memory.
package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// Package is the Rego package every policy module must declare.
const Package = "terrace"

// EvalTimeout bounds one evaluation of a plan.
const EvalTimeout = 10 * time.Second

// MaxModuleBytes bounds one module's source.
const MaxModuleBytes = 256 << 10

// forbiddenBuiltins reach outside the evaluation: the network (from the
// controller's network position) or the controller process's environment.
var forbiddenBuiltins = map[string]bool{
	"http.send":          true,
	"net.lookup_ip_addr": true,
	"opa.runtime":        true,
}

// Module is one policy source file.
type Module struct {
	// Name says where it came from, e.g. "team-a/policies/deny.rego"; errors name it.
	Name   string
	Source string
}

// Set is a checked set of policy modules, ready to evaluate plans.
type Set struct {
	// modules compiled here once; the evaluator process compiles them again.
	modules []Module
	// Digest identifies the modules' names and sources.
	Digest string
}

// Decision is what the policies said about one plan.
type Decision struct {
	// Violations are the deny rules' messages, sorted; any blocks the apply.
	Violations []string
	// Warnings are the warn rules' messages, sorted.
	Warnings []string
}

// Allowed says no deny rule matched.
func (d Decision) Allowed() bool { return len(d.Violations) == 0 }

// InvalidError says a module does not parse or compile, or is not of
// package terrace; the message names the module and position.
type InvalidError struct{ Message string }

func (e *InvalidError) Error() string { return e.Message }

// capabilities is this OPA's, without the forbidden builtins and with no
// network access at all.
func capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(caps.Builtins, func(b *ast.Builtin) bool { return forbiddenBuiltins[b.Name] })
	caps.AllowNet = []string{}
	return caps
}

// Digest identifies a list of modules, whatever their order.
func Digest(modules []Module) string {
	sorted := slices.Clone(modules)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	h := sha256.New()
	for _, m := range sorted {
		fmt.Fprintf(h, "%q %d\n%s\n", m.Name, len(m.Source), m.Source)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Compile parses and compiles modules. A module that is not valid Rego v1,
// not of package terrace, or uses a forbidden builtin is an *InvalidError.
func Compile(ctx context.Context, modules []Module) (*Set, error) {
	if _, err := prepare(ctx, modules); err != nil {
		return nil, err
	}
	return &Set{modules: slices.Clone(modules), Digest: Digest(modules)}, nil
}

// prepare compiles modules into the query of package terrace.
func prepare(ctx context.Context, modules []Module) (rego.PreparedEvalQuery, error) {
	var none rego.PreparedEvalQuery
	if len(modules) == 0 {
		return none, &InvalidError{Message: "no policy modules"}
	}
	parsed := make(map[string]*ast.Module, len(modules))
	for _, m := range modules {
		if len(m.Source) > MaxModuleBytes {
			return none, &InvalidError{Message: fmt.Sprintf("%s: %d bytes, over the limit of %d", m.Name, len(m.Source), MaxModuleBytes)}
		}
		mod, err := ast.ParseModuleWithOpts(m.Name, m.Source, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return none, &InvalidError{Message: err.Error()}
		}
		if got := mod.Package.Path.String(); got != "data."+Package {
			return none, &InvalidError{Message: fmt.Sprintf("%s: package %s: policy modules must be package %s", m.Name, strings.TrimPrefix(got, "data."), Package)}
		}
		parsed[m.Name] = mod
	}
	compiler := ast.NewCompiler().WithCapabilities(capabilities())
	if compiler.Compile(parsed); compiler.Failed() {
		return none, &InvalidError{Message: compiler.Errors.Error()}
	}
	query, err := rego.New(rego.Compiler(compiler), rego.Query("data."+Package), rego.StrictBuiltinErrors(true)).PrepareForEval(ctx)
	if err != nil {
		return none, &InvalidError{Message: err.Error()}
	}
	return query, nil
}

// messages turns a rule's set (or a single value) into sorted strings.
func messages(v any) []string {
	var items []any
	switch x := v.(type) {
	case nil:
		return nil
	case []any:
		items = x
	case bool:
		if !x {
			return nil
		}
		items = []any{"(the rule matched without a message)"}
	default:
		items = []any{x}
	}
	out := make([]string, 0, len(items))
	for _, item := range items {
		if s, ok := item.(string); ok {
			out = append(out, s)
			continue
		}
		b, _ := json.Marshal(item)
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}
