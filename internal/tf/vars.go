package tf

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// Variables are the root module's input values for one command.
type Variables struct {
	// JSON is a JSON object of variable name to value; empty means none.
	JSON []byte
	// Sensitive names variables to redact even if the module does not
	// declare them sensitive (values that came from Secrets).
	Sensitive []string
	// Files are var files inside the source, relative to the module dir.
	Files []string
}

// prepareVariables writes the values to a fresh 0600 var file in the work
// dir, teaches the redactor every value that is sensitive (by declaration,
// by the caller's word, in var files or as a default), and returns the
// var-file paths in the order tofu must read them (later ones win) and a
// cleanup that removes the written file.
func (e *Executor) prepareVariables(vars Variables) ([]string, func(), error) {
	values := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(vars.JSON)) > 0 {
		if err := json.Unmarshal(vars.JSON, &values); err != nil {
			return nil, nil, fmt.Errorf("%w: variables must be a JSON object: %v", ErrInvalidArgument, err)
		}
	}
	var files []string
	for _, f := range vars.Files {
		p, err := e.insideModule(f)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, p)
	}

	decls, _ := parseVariableBlocks(e.moduleDir)
	sensitive := map[string]bool{}
	for _, name := range vars.Sensitive {
		sensitive[name] = true
		e.extraSensitive[name] = true
	}
	for name, d := range decls {
		if d.sensitive || sensitive[name] {
			sensitive[name] = true
			if d.def != nil {
				e.redactor.AddValue(d.def)
			}
		}
	}
	for name, raw := range values {
		if sensitive[name] {
			e.learnJSON(raw)
		}
	}
	for _, f := range files {
		for name, v := range varFileValues(f) {
			if sensitive[name] {
				e.redactor.AddValue(v)
			}
		}
	}

	cleanup := func() {}
	if len(values) > 0 {
		data, err := json.Marshal(values)
		if err != nil {
			return nil, nil, fmt.Errorf("failed to encode variables: %w", err)
		}
		suffix := make([]byte, 8)
		if _, err := rand.Read(suffix); err != nil {
			return nil, nil, fmt.Errorf("failed to name the var file: %w", err)
		}
		path := filepath.Join(e.cfg.WorkDir, "vars", "terrace-"+hex.EncodeToString(suffix)+".tfvars.json")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("failed to create the var file: %w", err)
		}
		if _, err := f.Write(data); err != nil {
			_ = f.Close()
			_ = os.Remove(path)
			return nil, nil, fmt.Errorf("failed to write the var file: %w", err)
		}
		if err := f.Close(); err != nil {
			_ = os.Remove(path)
			return nil, nil, fmt.Errorf("failed to write the var file: %w", err)
		}
		// The caller's values win over the source's var files.
		files = append(files, path)
		cleanup = func() { _ = os.Remove(path) }
	}
	return files, cleanup, nil
}

// learnJSON teaches the redactor a sensitive JSON value; text that is not
// JSON is ignored (Redactor.AddJSON would learn it as a string).
func (e *Executor) learnJSON(raw []byte) {
	if v, err := decodeJSON(raw); err == nil {
		e.redactor.AddValue(v)
	}
}

// insideModule resolves a path relative to the module dir and refuses one
// that leaves the source.
func (e *Executor) insideModule(rel string) (string, error) {
	if e.moduleDir == "" {
		return "", ErrNotInitialized
	}
	if rel == "" || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%w: var file %q must be a relative path inside the source", ErrInvalidArgument, rel)
	}
	// moduleDir is resolved (Init follows symlinks), so the source dir
	// it is compared with must be too: the work dir may sit below a link.
	realSrc, err := filepath.EvalSymlinks(e.SourceDir())
	if err != nil {
		return "", fmt.Errorf("failed to resolve the source directory: %w", err)
	}
	p := filepath.Join(e.moduleDir, rel)
	if p != realSrc && !strings.HasPrefix(p, realSrc+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: var file %q is outside the source", ErrInvalidArgument, rel)
	}
	resolved, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("%w: var file %q: %v", ErrInvalidArgument, rel, err)
	}
	if !strings.HasPrefix(resolved, realSrc+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: var file %q is outside the source", ErrInvalidArgument, rel)
	}
	return p, nil
}

// variableDecl is what the runner reads of a root variable block before
// tofu runs, so log lines are redacted from the first one. Files that do
// not parse are skipped: tofu reports them.
type variableDecl struct {
	sensitive bool
	def       any
}

var variableSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "variable", LabelNames: []string{"name"}}}}
var variableBodySchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "sensitive"}, {Name: "default"}}}

// parseVariableBlocks reads the root variable blocks; complete says whether
// every configuration file parsed, that is whether these are all the module
// declares.
func parseVariableBlocks(moduleDir string) (res map[string]variableDecl, complete bool) {
	res = map[string]variableDecl{}
	if moduleDir == "" {
		return res, false
	}
	entries, err := os.ReadDir(moduleDir)
	if err != nil {
		return res, false
	}
	complete = true
	parser := hclparse.NewParser()
	for _, entry := range entries {
		if entry.IsDir() {
			continue
		}
		path := filepath.Join(moduleDir, entry.Name())
		var file *hcl.File
		var diags hcl.Diagnostics
		switch {
		case strings.HasSuffix(entry.Name(), ".tf"):
			file, diags = parser.ParseHCLFile(path)
		case strings.HasSuffix(entry.Name(), ".tf.json"):
			file, diags = parser.ParseJSONFile(path)
		default:
			continue
		}
		if diags.HasErrors() || file == nil {
			complete = false
			continue
		}
		content, _, _ := file.Body.PartialContent(variableSchema)
		if content == nil {
			continue
		}
		for _, block := range content.Blocks {
			attrs, _, _ := block.Body.PartialContent(variableBodySchema)
			decl := res[block.Labels[0]]
			if attrs != nil {
				if a, ok := attrs.Attributes["sensitive"]; ok {
					if v, d := a.Expr.Value(nil); !d.HasErrors() && v.Type() == cty.Bool && v.IsKnown() && !v.IsNull() {
						decl.sensitive = v.True()
					}
				}
				if a, ok := attrs.Attributes["default"]; ok {
					if v, d := a.Expr.Value(nil); !d.HasErrors() {
						decl.def = ctyToAny(v)
					}
				}
			}
			res[block.Labels[0]] = decl
		}
	}
	return res, complete
}

// varFileValues reads a .tfvars or .tfvars.json file's literal values.
func varFileValues(path string) map[string]any {
	res := map[string]any{}
	parser := hclparse.NewParser()
	var file *hcl.File
	var diags hcl.Diagnostics
	if strings.HasSuffix(path, ".json") {
		file, diags = parser.ParseJSONFile(path)
	} else {
		file, diags = parser.ParseHCLFile(path)
	}
	if diags.HasErrors() || file == nil {
		return res
	}
	attrs, d := file.Body.JustAttributes()
	if d.HasErrors() && attrs == nil {
		return res
	}
	for name, a := range attrs {
		if v, d := a.Expr.Value(nil); !d.HasErrors() {
			res[name] = ctyToAny(v)
		}
	}
	return res
}

// ctyToAny converts a known value to its JSON-decoded form.
func ctyToAny(v cty.Value) any {
	if !v.IsWhollyKnown() || v.IsNull() {
		return nil
	}
	data, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		return nil
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		return nil
	}
	return out
}
