package apiserver

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	ctyjson "github.com/zclconf/go-cty/cty/json"
	"sigs.k8s.io/controller-runtime/pkg/client"

	terracev1 "github.com/terrace-dev/terrace/api/v1alpha1"
	"github.com/terrace-dev/terrace/internal/nesting"
	apiv1 "github.com/terrace-dev/terrace/proto/terrace/api/v1"
)

// GetProgramVariables reads a Program as the caller and lists the
// variables its root module declares (files at the top level), for the
// console's install form.
func (s *service) GetProgramVariables(ctx context.Context, req *connect.Request[apiv1.GetProgramVariablesRequest]) (*connect.Response[apiv1.ProgramVariables], error) {
	ctx, c, err := s.begin(ctx, req.Header(), target{cluster: req.Msg.GetCluster(), namespace: req.Msg.GetNamespace()}, false)
	if err != nil {
		return nil, err
	}
	if err := validateProgramRef(req.Msg.GetProgram()); err != nil {
		return nil, invalid(err.Error())
	}
	program := &terracev1.Program{}
	if err := c.site.Caller.Get(ctx, client.ObjectKey{Namespace: c.site.Namespace, Name: req.Msg.GetProgram()}, program); err != nil {
		return nil, kubeError(err, "Program "+req.Msg.GetProgram())
	}
	vars, err := declaredVariables(program.Spec.Files)
	if err != nil {
		return nil, invalid(fmt.Sprintf("Program %s cannot be read: %v", program.Name, err))
	}
	return connect.NewResponse(&apiv1.ProgramVariables{Items: vars}), nil
}

var variableSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "variable", LabelNames: []string{"name"}}}}

// declaredVariables parses the root module's .tf and .tf.json files and
// returns their variable blocks by name. Each file's nesting is checked
// first: a Program is tenant input, and HCL's parsers would overflow this
// server's stack on one nested deep enough.
func declaredVariables(files map[string]terracev1.ProgramFile) ([]*apiv1.Variable, error) {
	parser := hclparse.NewParser()
	var out []*apiv1.Variable
	for name, content := range files {
		if strings.Contains(name, "/") {
			continue
		}
		var file *hcl.File
		var diags hcl.Diagnostics
		switch {
		case strings.HasSuffix(name, ".tf"), strings.HasSuffix(name, ".tofu"):
			if err := nesting.CheckHCL([]byte(content), name); err != nil {
				return nil, err
			}
			file, diags = parser.ParseHCL([]byte(content), name)
		case strings.HasSuffix(name, ".tf.json"), strings.HasSuffix(name, ".tofu.json"):
			if err := nesting.CheckJSON([]byte(content), name); err != nil {
				return nil, err
			}
			file, diags = parser.ParseJSON([]byte(content), name)
		default:
			continue
		}
		if diags.HasErrors() {
			return nil, diags
		}
		body, _, diags := file.Body.PartialContent(variableSchema)
		if diags.HasErrors() {
			return nil, diags
		}
		for _, block := range body.Blocks {
			out = append(out, variableOf(block, file.Bytes, name))
		}
	}
	slices.SortFunc(out, func(a, b *apiv1.Variable) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// variableOf reads what a form needs of one variable block; an attribute
// it cannot read stays empty rather than failing the whole form.
func variableOf(block *hcl.Block, src []byte, file string) *apiv1.Variable {
	v := &apiv1.Variable{Name: block.Labels[0], File: file}
	attrs, _ := block.Body.JustAttributes()
	if a, ok := attrs["type"]; ok {
		r := a.Expr.Range()
		if r.End.Byte <= len(src) {
			v.Type = strings.Trim(string(src[r.Start.Byte:r.End.Byte]), `"`)
		}
	}
	if a, ok := attrs["description"]; ok {
		if val, diags := a.Expr.Value(nil); !diags.HasErrors() && val.Type().FriendlyName() == "string" && val.IsKnown() && !val.IsNull() {
			v.Description = val.AsString()
		}
	}
	if a, ok := attrs["sensitive"]; ok {
		if val, diags := a.Expr.Value(nil); !diags.HasErrors() && val.IsKnown() && !val.IsNull() && val.Type().FriendlyName() == "bool" {
			v.Sensitive = val.True()
		}
	}
	_, hasDefault := attrs["default"]
	v.Required = !hasDefault
	// A sensitive variable's default is never shown.
	if a, ok := attrs["default"]; ok && !v.Sensitive {
		if val, diags := a.Expr.Value(nil); !diags.HasErrors() && val.IsWhollyKnown() {
			if raw, err := ctyjson.Marshal(val, val.Type()); err == nil {
				text := string(raw)
				v.Default = &text
			}
		}
	}
	return v
}
